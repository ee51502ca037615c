"""The report card: one row per task (task, shots, metric, score, 95% interval, chance) and the suite aggregates.

    row = proportion_row("arc_easy", shots=10, metric="acc", right=612, n=1000, chance=0.25)
        CardRow(task="arc_easy", shots=10, metric="acc", score=0.612, low=0.5814, high=0.6417, chance=0.25, n=1000)
    row.centred                        -> 0.4827   (score - chance) / (1 - chance): 0 at chance, 1 when perfect
    card = Card(model="runs/demo/train", rows=[row, ...])
    card.add_aggregate("CORE", [row, ...])   # mean centred accuracy, with a normal 95% interval
    print(card.text())                 # the table, in the terminal
    card.save("out/eval.json")         # atomically; Card.load reads it back (runs/report.html reads the same JSON)

Centred accuracy and its mean are CORE's definition (Li et al. 2024, DataComp-LM, section 3.4 and
appendix G; nanochat's base_eval): each task's accuracy is rescaled so that guessing scores 0 and a
perfect answer 1, then the rescaled numbers are averaged. ChatCORE (nanochat's chat_eval) is the same
over the chat tasks. The interval of a mean of centred accuracies treats the tasks as independent:
variance = sum_i se_i^2 / (1 - chance_i)^2 / T^2, where se_i is read off row i's own 95% interval,
(high - low) / (2 x 1.96): never zero at 0 or n right, where the plain acc (1 - acc) / n would be.

Rows from a proportion (k right of n) carry the Wilson interval; rows from a mean score (a judge's
1-10 grades) carry the t interval (gptlab.eval.stats). Not here: producing the scores (the tasks,
the judge), the HTML section (gptlab.runs.report reads eval.json as plain JSON).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import NormalDist

from gptlab.eval.stats import mean_interval, wilson_interval
from gptlab.runtime import GptlabError, atomic_write_text

CARD_FORMAT = 1  # eval.json's format_version
CARD_FILE = "eval.json"
CARD_FILES = (CARD_FILE, "examples.jsonl")  # what an evaluation writes into its folder (and may replace there)
Z95 = NormalDist().inv_cdf(0.975)


@dataclass(frozen=True)
class CardRow:
    """One task's figure: `score` in [low, high] (95%), `chance` what guessing scores, over `n` examples."""

    task: str
    shots: int
    metric: str
    score: float
    low: float
    high: float
    chance: float = 0.0
    n: int = 0
    note: str = ""  # e.g. "3 verdicts failed after retries" or "pass@1 from 10 samples"

    @property
    def centred(self) -> float:
        """(score - chance) / (1 - chance): 0 at chance, 1 perfect, below 0 worse than guessing."""
        if self.chance >= 1:
            raise GptlabError(f"{self.task}: chance {self.chance} leaves nothing to centre on")
        return (self.score - self.chance) / (1 - self.chance)

    def to_dict(self) -> dict:
        return {**asdict(self), "centred": self.centred}


def proportion_row(task: str, *, shots: int, metric: str, right: int, n: int, chance: float = 0.0, note: str = "") -> CardRow:
    """A row for `right` of `n` examples correct, with its Wilson interval."""
    low, high = wilson_interval(int(right), int(n))
    return CardRow(task, shots, metric, right / n, low, high, chance, n, note)


def mean_row(task: str, *, shots: int, metric: str, values: Sequence[float], chance: float = 0.0, note: str = "") -> CardRow:
    """A row for the mean of per-example scores (e.g. pass@k estimates, judge grades), with its t interval."""
    values = [float(value) for value in values]
    if not values:
        raise GptlabError(f"{task}: no scores to average")
    mean = math.fsum(values) / len(values)
    low, high = mean_interval(values) if len(values) > 1 else (mean, mean)
    return CardRow(task, shots, metric, mean, low, high, chance, len(values), note)


@dataclass(frozen=True)
class Aggregate:
    """A suite's summary figure: the mean centred score of `tasks`, with a normal 95% interval."""

    name: str
    score: float
    low: float
    high: float
    tasks: tuple[str, ...]


def centred_mean(name: str, rows: Sequence[CardRow]) -> Aggregate:
    """CORE's aggregate (and ChatCORE's): the mean of the rows' centred scores (see the module docstring)."""
    if not rows:
        raise GptlabError(f"{name}: no tasks to aggregate")
    mean = math.fsum(row.centred for row in rows) / len(rows)
    variance = math.fsum(((row.high - row.low) / (2 * Z95) / (1 - row.chance)) ** 2 for row in rows) / len(rows) ** 2
    half = Z95 * math.sqrt(variance)
    return Aggregate(name, mean, mean - half, mean + half, tuple(row.task for row in rows))


@dataclass
class Card:
    """A model's report card: rows, aggregates, and what produced them (settings, few-shot choices, files)."""

    model: str
    rows: list[CardRow] = field(default_factory=list)
    aggregates: list[Aggregate] = field(default_factory=list)
    settings: dict = field(default_factory=dict)

    def add(self, row: CardRow) -> None:
        self.rows.append(row)

    def add_aggregate(self, name: str, rows: Sequence[CardRow]) -> Aggregate:
        aggregate = centred_mean(name, rows)
        self.aggregates.append(aggregate)
        return aggregate

    def to_dict(self) -> dict:
        return {"format_version": CARD_FORMAT, "model": self.model, "rows": [row.to_dict() for row in self.rows],
                "aggregates": [asdict(aggregate) for aggregate in self.aggregates], "settings": self.settings}

    @classmethod
    def from_dict(cls, data: dict, source: str = "eval.json") -> Card:
        if not isinstance(data, dict) or data.get("format_version") != CARD_FORMAT:
            raise GptlabError(f"{source} is not a gptlab report card (format_version {CARD_FORMAT})")
        try:
            rows = [CardRow(**{key: value for key, value in row.items() if key != "centred"}) for row in data["rows"]]
            aggregates = [Aggregate(**{**item, "tasks": tuple(item["tasks"])}) for item in data["aggregates"]]
        except (KeyError, TypeError) as error:
            raise GptlabError(f"{source} is not a readable report card ({error})") from None
        return cls(str(data.get("model", "")), rows, aggregates, dict(data.get("settings") or {}))

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> Card:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise GptlabError(f"no report card at {path}: run `gptlab eval ... --out {path.parent}` first") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise GptlabError(f"{path} is not JSON ({error})") from None
        return cls.from_dict(data, str(path))

    def text(self) -> str:
        """The card as an aligned text table, then one line per aggregate."""
        headers = ["task", "shots", "metric", "score", "95% interval", "chance", "n"]
        lines = [[row.task, str(row.shots), row.metric, f"{row.score:.4f}", f"{row.low:.4f}-{row.high:.4f}",
                  f"{row.chance:.2f}", f"{row.n:,}"] for row in self.rows]
        widths = [max(len(cells[i]) for cells in [headers, *lines]) for i in range(len(headers))]
        out = ["  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip() for cells in [headers, *lines]]
        out.insert(1, "  ".join("-" * width for width in widths))
        notes = [f"  {row.task}: {row.note}" for row in self.rows if row.note]
        for aggregate in self.aggregates:
            out.append(f"{aggregate.name} {aggregate.score:.4f} (95% {aggregate.low:.4f} to {aggregate.high:.4f}; "
                       f"mean centred score of {len(aggregate.tasks)} task{'s' if len(aggregate.tasks) != 1 else ''})")
        return "\n".join(out + (["notes:", *notes] if notes else []))
