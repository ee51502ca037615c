"""Benchmarks made from held-out text: how a base model trained on a corpus does on the works it never saw.

The demo has no network, so it cannot fetch ARC or HellaSwag; but it holds works out of training. Two
tasks are cut from them, in the shared record shape (gptlab.eval.tasks.sources):

    next_line  (multiple choice, chance 1/4): a passage of `context_lines` lines, then the true next line
               against 3 lines drawn from elsewhere in the held-out text (HellaSwag's idea, on plain text):
               {"query": "ROMEO:\\nBut soft, what light ...\\n...", "choices": ["It is the east, ...", ...], "gold": 2}
    last_word  (language modelling, chance 0): a passage, then its last word exactly (LAMBADA's idea):
               {"context": "... and Juliet is the", "continuation": "sun."}

Passages are drawn with a seeded generator, so every run of the same text gives the same records. A line
is a candidate only when it has some letters and is not a stage direction or speaker name alone (short,
all capitals), so a choice cannot be picked by its form alone. `evaluate_held_out` scores both with the
likelihood suite's machinery (gptlab.eval.tasks.core): the card rows of `gptlab run`'s base model.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from gptlab.eval.card import CardRow
from gptlab.eval.tasks.core import Encode, TaskSpec, evaluate_task
from gptlab.runtime import GptlabError

NEXT_LINE = TaskSpec(name="next_line", kind="multiple_choice", shots=0, chance=0.25, continuation_delimiter="\n")
LAST_WORD = TaskSpec(name="last_word", kind="language_modeling", shots=0, chance=0.0)
MIN_LETTERS = 12  # a line with fewer letters is a speaker's name or a fragment: never a passage end or a choice


def _lines(texts: Sequence[str]) -> list[list[str]]:
    """Each text's non-blank lines, right-stripped."""
    return [[line.rstrip() for line in text.splitlines() if line.strip()] for text in texts]


def _is_candidate(line: str) -> bool:
    letters = sum(char.isalpha() for char in line)
    return letters >= MIN_LETTERS and not line.isupper()


def next_line_records(texts: Sequence[str], n: int, *, context_lines: int = 4, choices: int = 4, seed: int = 0) -> list[dict]:
    """n multiple-choice records: a passage, and its true next line among `choices` lines (see the module docstring)."""
    documents = _lines(texts)
    spots = [(d, i) for d, lines in enumerate(documents) for i in range(context_lines, len(lines)) if _is_candidate(lines[i])]
    pool = [line for lines in documents for line in lines if _is_candidate(line)]
    if len(spots) < 1 or len(set(pool)) < choices:
        raise GptlabError(f"the held-out text has too few lines of text ({len(set(pool))}) to make {choices}-way next-line questions")
    rng = random.Random(f"gptlab/next_line/{seed}")
    records = []
    for number, (d, i) in enumerate(rng.sample(spots, min(n, len(spots)))):
        right = documents[d][i]
        wrong: list[str] = []
        while len(wrong) < choices - 1:
            line = rng.choice(pool)
            if line != right and line not in wrong:
                wrong.append(line)
        gold = rng.randrange(choices)
        options = wrong[:gold] + [right] + wrong[gold:]
        query = "\n".join(documents[d][i - context_lines : i])
        records.append({"id": f"next_line/{number}", "query": query, "choices": options, "gold": gold, "question": query})
    return records


def last_word_records(texts: Sequence[str], n: int, *, context_lines: int = 6, seed: int = 0) -> list[dict]:
    """n language-modelling records: a passage without its last word, and that word (see the module docstring)."""
    documents = _lines(texts)
    spots = [(d, i) for d, lines in enumerate(documents) for i in range(context_lines - 1, len(lines))
             if _is_candidate(lines[i]) and " " in lines[i].strip()]
    if not spots:
        raise GptlabError("the held-out text has no passages to cut a last word from")
    rng = random.Random(f"gptlab/last_word/{seed}")
    records = []
    for number, (d, i) in enumerate(rng.sample(spots, min(n, len(spots)))):
        passage = "\n".join(documents[d][i - context_lines + 1 : i + 1])
        context, word = passage.rsplit(" ", 1)
        records.append({"id": f"last_word/{number}", "context": context, "continuation": word})
    return records


def evaluate_held_out(model, encode: Encode, texts: Sequence[str], *, n: int = 200, seed: int = 0, batch_size: int = 32,
                      autocast=None) -> tuple[list[CardRow], dict[str, list[dict]]]:
    """The card rows of both tasks on `texts` (n questions each), and their per-example records."""
    rows, examples = [], {}
    for spec, records in ((NEXT_LINE, next_line_records(texts, n, seed=seed)), (LAST_WORD, last_word_records(texts, n, seed=seed))):
        row, done = evaluate_task(model, spec, records, encode, batch_size=batch_size, autocast=autocast)
        rows.append(row)
        examples[spec.name] = done
    return rows, examples
