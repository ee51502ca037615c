"""Spelling: spell a common word letter by letter, or count how often a letter appears in it.

    Example(question='Spell the word "crown" letter by letter.', reply="c-r-o-w-n", answer="c-r-o-w-n")
    Example(question='How many times does the letter "r" appear in "berry"?', reply="b-e-r-r-y -> r, r -> 2", answer="2")
    Example(question='How many times does the letter "z" appear in "crown"?', reply="c-r-o-w-n -> none -> 0", answer="0")

A counting reply spells the word first, then copies out each match, then
gives the count: each step is a short look back, which a small model learns
far sooner than counting letters hidden inside its tokens. A word spells the
same in both kinds of question, so spelling is also learnt from counting
examples. The letter is absent, present once, or repeated, a third of the
time each, so no single count is a good guess. The verifier reads the last hyphenated spelling (spelling) or the
last whole number (counting). Words come from gptlab.chat.tasks.words. Not
here: the Task machinery (gptlab.chat.tasks.base).
"""

from __future__ import annotations

import functools
import random
import re
import string
from dataclasses import dataclass

from gptlab.chat.tasks.base import Example, Task, last_integer
from gptlab.chat.tasks.words import WORDS
from gptlab.runtime import GptlabError

COUNTS = ("absent", "once", "repeated")
SPELLED = re.compile(r"(?<![a-z])[a-z](?:\s*-\s*[a-z](?![a-z]))+")  # "c-r-o-w-n", "c - r - o"; not "well-known"


def spell(word: str) -> str:
    """ "crown" -> "c-r-o-w-n" """
    return "-".join(word)


@dataclass(frozen=True)
class Spelling(Task):
    """Spelling(counting=1.0) asks only counting questions; counting=0.0 only spelling ones."""

    name = "spelling"
    counting: float = 0.5  # the share of questions that count a letter; the rest ask for the spelling

    def __post_init__(self) -> None:
        if isinstance(self.counting, bool) or not isinstance(self.counting, (int, float)) or not 0 <= self.counting <= 1:
            raise GptlabError(f"spelling counting must be a fraction from 0 to 1, got {self.counting!r}")

    @property
    def test_size(self) -> int:  # type: ignore[override]
        """200 when counting questions are drawn; 80 of the words for spelling only (the rest are trained on)."""
        return 200 if self.counting > 0 else 80

    def make(self, rng: random.Random) -> Example:
        if rng.random() >= self.counting:
            word = rng.choice(WORDS)
            return Example(question=f'Spell the word "{word}" letter by letter.', reply=spell(word), answer=spell(word))
        word, letter = _pick_letter(rng)
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


def _pick_letter(rng: random.Random) -> tuple[str, str]:
    """A word and a letter that is absent from it, in it once, or in it more than once, each a third of the time.

    Drawing the letter from the word would make most answers 1, and a model that always says 1 would
    score well before it learns anything.
    """
    times = rng.choice(COUNTS)
    word = rng.choice(_words_with(times))
    if times == "absent":
        letters = [c for c in string.ascii_lowercase if c not in word]
    else:
        letters = sorted({c for c in word if (word.count(c) == 1) == (times == "once")})  # sorted: sets have no fixed order
    return word, rng.choice(letters)


@functools.cache
def _words_with(times: str) -> tuple[str, ...]:
    if times == "repeated":
        return tuple(word for word in WORDS if len(set(word)) < len(word))
    if times == "once":
        return tuple(word for word in WORDS if any(word.count(c) == 1 for c in word))
    return WORDS
