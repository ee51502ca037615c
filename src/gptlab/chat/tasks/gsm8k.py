"""GSM8K (Cobbe et al., 2021): grade-school maths word problems, read from a dataset.

A row of the dataset has a question and a worked solution that ends with `#### ANSWER`:

    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many ...",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\\nNatalia sold 48+24 = <<48+24=72>>72 ...\\n#### 72"}
  becomes
    Example(question="Natalia sold clips to ...",
            reply="Natalia sold 48/2 = 24 clips in May.\\nNatalia sold 48+24 = 72 ...\\nThe answer is 72.",
            answer="72")

The calculator annotations `<<48/2=24>>` are dropped and the `#### 72` line becomes
"The answer is 72.", so SFT on the replies teaches a form the verifier reads. The
answer is the number after the last `####`, commas and `$` removed; a row without
one is skipped and counted (`task.skipped(split)`), never a crash.

The verifier reads the number after the response's last `####` if it has one,
else the response's last number, and compares it with the answer as a decimal:
"1,234", "$5", "3.50" (for 3.5) and "-2" are all read. A minus right after a
digit is subtraction ("12-5" reads 5).

The data comes from `source`, any `hf:` dataset gptlab.data.sources reads: the
hub's `hf:openai/gsm8k:main` by default, or a local folder (`hf:/path/to/dir`
with train/test files, or `save_to_disk`'s output). Its `train` and `test` splits
are the task's; each is read once per task configuration and kept. Offline, a
hub source fails in one line that names a local folder as the fix.

    task:gsm8k[n=1000]                                     SFT on the first 1,000 train problems
    task:gsm8k[source=hf:/data/gsm8k,question=problem,answer=solution]

Not here: the Task machinery (gptlab.chat.tasks.base), reading datasets (gptlab.data.sources).
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from decimal import Decimal

from gptlab.chat.tasks.base import SPLITS, Example, Task
from gptlab.data.sources import HuggingFaceSource, SourceOptions
from gptlab.runtime import GptlabError

SHOWN_PROBLEMS = 5  # malformed rows named per split; the rest are only counted
CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations: "48/2 = <<48/2=24>>24"
# A number as people write it: "-2", "$5", "1,234", "3.50". A minus right after a digit is subtraction,
# and thousands groups must be whole ("1,2345" is 1 then 2345).
NUMBER = re.compile(r"(?<![\d.])(-)?\$?(\d{1,3}(?:,\d{3})+(?!\d)|\d+)(\.\d+)?")


@dataclass(frozen=True)
class SplitRows:
    """A split as read: its examples, and the malformed rows skipped (the first few named)."""

    examples: tuple[Example, ...]
    skipped: int
    problems: tuple[str, ...]


@dataclass(frozen=True)
class GSM8K(Task):
    """GSM8K from the hub, or GSM8K(source="hf:/path/to/dir") from a local copy; `question`
    and `answer` name the dataset's columns."""

    name = "gsm8k"
    generated = False
    source: str = "hf:openai/gsm8k:main"  # any hf: dataset with train and test splits
    question: str = "question"  # the column of problems
    answer: str = "answer"  # the column of worked solutions ending in "#### ANSWER"

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source.startswith("hf:"):
            raise GptlabError(f"gsm8k source must be an hf: dataset (hf:openai/gsm8k:main or hf:/path/to/dir), got {self.source!r}")
        for field in ("question", "answer"):
            if not isinstance(getattr(self, field), str) or not getattr(self, field):
                raise GptlabError(f"gsm8k {field} must name a column of the dataset, got {getattr(self, field)!r}")

    @property
    def test_size(self) -> int:  # type: ignore[override]
        """The examples in the test split (1,319 for GSM8K), malformed rows not counted."""
        return len(self.rows("test").examples)

    @property
    def train_size(self) -> int:
        """The examples in the train split (7,473 for GSM8K): a trainer draws at most these."""
        return len(self.rows("train").examples)

    def skipped(self, split: str) -> int:
        """Rows of the split skipped as malformed (no number after ####, an empty question)."""
        return self.rows(split).skipped

    def examples(self, split: str, n: int) -> list[Example]:
        """The first n examples of the dataset's split, in the dataset's order."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise GptlabError(f"n must be a whole number of examples (0 or more), got {n!r}")
        found = self.rows(split).examples
        if n > len(found):
            raise GptlabError(f"the gsm8k {split} split of {self.source} holds {len(found)} examples; ask for at most that, got n={n}")
        return list(found[:n])

    @functools.cache  # noqa: B019 (tasks are small, hashable configs; a split is a few MB of text)
    def rows(self, split: str) -> SplitRows:
        """The split read from the source: its examples and its skipped rows."""
        if split not in SPLITS:
            raise GptlabError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
        source = HuggingFaceSource(self.source, SourceOptions(text_field=self.question, split=split))
        source.check()  # the question column exists, when the dataset declares its columns
        examples, problems, skipped = [], [], 0
        for row, record in enumerate(source.records()):
            missing = [column for column in (self.question, self.answer) if column not in record]
            if missing:
                raise GptlabError(
                    f"{self.source} {split} row {row}: no {missing[0]!r} column (it has: {', '.join(record)}; "
                    f"choose with task:gsm8k[question=NAME,answer=NAME])"
                )
            example, problem = read_row(record[self.question], record[self.answer])
            if example is None:
                skipped += 1
                if len(problems) < SHOWN_PROBLEMS:
                    problems.append(f"{self.source} {split} row {row}: {problem}")
                continue
            examples.append(example)
        return SplitRows(tuple(examples), skipped, tuple(problems))

    def make(self, rng: random.Random) -> Example:
        raise GptlabError("gsm8k examples come from its dataset: use task.examples(split, n)")

    def verify(self, example: Example, response: str) -> bool:
        """The number after the response's last ####, or its last number, equals the answer."""
        given = final_number(response)
        return given is not None and given == Decimal(example.answer)


def read_row(question: object, solution: object) -> tuple[Example | None, str]:
    """The Example a row makes, or None and what is wrong with the row."""
    if not isinstance(question, str) or not question.strip():
        return None, "the question is empty or not text"
    if not isinstance(solution, str) or "####" not in solution:
        return None, "the solution has no '#### ANSWER' line"
    work, _, tail = solution.rpartition("####")
    answer = tail.strip().replace(",", "").replace("$", "")
    if not re.fullmatch(r"-?\d+(\.\d+)?", answer):
        return None, f"no number after #### (found {tail.strip()[:40]!r})"
    steps = CALCULATOR.sub("", work).strip()
    reply = f"{steps}\nThe answer is {answer}." if steps else f"The answer is {answer}."
    return Example(question=question.strip(), reply=reply, answer=answer), ""


def read_numbers(text: str) -> list[Decimal]:
    """Every number written in the text, in order: "costs $1,234.50, not -2" -> [1234.50, -2]."""
    return [Decimal(f"{sign or ''}{whole.replace(',', '')}{fraction or ''}") for sign, whole, fraction in NUMBER.findall(text)]


def final_number(response: str) -> Decimal | None:
    """The first number after the last ####, else the last number of the response, else None."""
    if "####" in response:
        after = read_numbers(response.rpartition("####")[2])
        if after:
            return after[0]
    numbers = read_numbers(response)
    return numbers[-1] if numbers else None
