"""Spelling: spell a common word letter by letter, or count how often a letter appears in it.

    Example(question='Spell the word "crown" letter by letter.', reply="c-r-o-w-n", answer="c-r-o-w-n")
    Example(question='How many times does the letter "r" appear in "berry"?', reply="b-e-r-r-y -> r, r -> 2", answer="2")

A counting reply spells the word first, then copies out each match, then
gives the count: each step is a short look back, which a small model learns
far sooner than counting letters hidden inside its tokens. A word spells the
same in both kinds of question, so spelling is also learnt from counting
examples. The verifier reads the last hyphenated spelling (spelling) or the
last whole number (counting). Words come from gptlab.chat.tasks.words. Not
here: the Task machinery (gptlab.chat.tasks.base).
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass

from gptlab.chat.tasks.base import Example, Task, last_integer
from gptlab.chat.tasks.words import WORDS
from gptlab.runtime import GptlabError

SPELLED = re.compile(r"(?<![a-z])[a-z](?:\s*-\s*[a-z](?![a-z]))+")  # "c-r-o-w-n", "c - r - o"; not "well-known"


def spell(word: str) -> str:
    """ "crown" -> "c-r-o-w-n" """
    return "-".join(word)


@dataclass(frozen=True)
class Spelling(Task):
    """Spelling(counting=1.0) asks only counting questions; counting=0.0 only spelling ones."""

    name = "spelling"
    counting: float = 0.7  # the share of questions that count a letter; the rest ask for the spelling
    present: float = 0.75  # of the counting questions, the share whose letter is in the word (others answer 0)

    def __post_init__(self) -> None:
        for field in ("counting", "present"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise GptlabError(f"spelling {field} must be a fraction from 0 to 1, got {value!r}")

    @property
    def test_size(self) -> int:  # type: ignore[override]
        """500 when counting questions are drawn (thousands of word-letter pairs); 80 of the words for spelling only."""
        return 500 if self.counting > 0 else 80

    def make(self, rng: random.Random) -> Example:
        word = rng.choice(WORDS)
        if rng.random() >= self.counting:
            return Example(question=f'Spell the word "{word}" letter by letter.', reply=spell(word), answer=spell(word))
        if rng.random() < self.present:
            letter = rng.choice(word)
        else:
            letter = rng.choice([c for c in string.ascii_lowercase if c not in word])
        count = word.count(letter)
        matches = ", ".join([letter] * count) if count else "none"
        return Example(
            question=f'How many times does the letter "{letter}" appear in "{word}"?',
            reply=f"{spell(word)} -> {matches} -> {count}",
            answer=str(count),
        )

    def verify(self, example: Example, response: str) -> bool:
        if example.answer.isdigit():
            return last_integer(response) == int(example.answer)
        spellings = SPELLED.findall(response.lower())
        return bool(spellings) and re.sub(r"[\s-]", "", spellings[-1]) == example.answer.replace("-", "")
