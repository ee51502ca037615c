"""Record tracks: the best model per CPU-minute on the built-in corpus, each a time budget and a history of records.

    gptlab run --track cpu-100s            # 100 s of pretraining, scored in bits per byte on the held-out works
    gptlab run --track cpu-600s --record 0 # the track's first recipe, as it was first measured

A track is `gptlab run` with a fixed time budget: its tokenizer, shards and model are trained on the 38 training
works and scored on the 4 held-out ones (every tenth), the test set. Its recipe is its latest record: a base
recipe with every accepted change applied in order, each change a list of `gptlab run` flags, so every record
stays reproducible (`--record N`) and a new one is measured against the one before in the same run
(bench/shakespeare_cpu.py). Settings are chosen on a validation split carved from the training works
(`selection_split`), never on the held-out works. The demo track is `make demo`: the whole run, whose pretraining
is the track's; the others stop after the held-out evaluation.
Figures, dates and machines: docs/records.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from gptlab.pipeline import DEMO_SECONDS, RunConfig
from gptlab.runtime import GptlabError
from gptlab.runtime.config import apply_overrides
from gptlab.train.config import shakespeare_cpu


@dataclass(frozen=True)
class Change:
    """One accepted record: what changed, in words, and the `gptlab run` flags that make it from the one before."""

    summary: str
    flags: tuple[str, ...]


@dataclass(frozen=True)
class Track:
    name: str
    budget: float  # seconds of pretraining (the trainer's --time-limit: its schedule follows the share spent)
    summary: str
    changes: tuple[Change, ...] = ()  # records 1, 2, ...: each on top of the record before
    pretrain_only: bool = True  # stop after the held-out evaluation (the demo goes on to chat)

    @property
    def latest(self) -> int:
        return len(self.changes)

    def flags(self, record: int | None = None) -> list[str]:
        """The flags of every change up to `record` (None: the latest), in order: later ones win."""
        record = self.latest if record is None else self.check_record(record)
        return [flag for change in self.changes[:record] for flag in change.flags]

    def check_record(self, record: int) -> int:
        if not 0 <= record <= self.latest:
            raise GptlabError(f"track {self.name} has records 0 to {self.latest}, not --record {record}; "
                              f"pass --record {self.latest} (the latest) or fewer")
        return record

    def config(self, record: int | None = None, overrides: list[str] = ()) -> RunConfig:
        """The run of `record` (None: the latest), then the user's own flags on top."""
        base = track_base(self)
        if self.pretrain_only:  # the demo's run keeps its own folder, runs/shakespeare
            base = dataclasses.replace(base, out=str(Path("runs") / self.name))
        return apply_overrides(base, [*self.flags(record), *overrides])

    def command(self, record: int | None = None) -> str:
        """The command that trains and scores a record."""
        record = self.latest if record is None else record
        return f"gptlab run --track {self.name}" + (f" --record {record}" if record != self.latest else "")


def track_base(track: Track) -> RunConfig:
    """Record 0 of every track: gptlab's recipe of 2026-11-24 (the shakespeare-cpu preset), given the track's budget.
    The cpu tracks spend all of it training: no evaluations, samples or checkpoints before the end."""
    train = dataclasses.replace(shakespeare_cpu(), max_steps=10**9, time_limit=track.budget)
    if track.pretrain_only:
        train = dataclasses.replace(train, eval_every=0, checkpoint_every=0)
    return RunConfig(train=train, pretrain_only=track.pretrain_only)


# cpu-100s's records, in order (docs/records.md has each one's figures). At 600 s the same two changes scored
# worse than the first recipe (the corpus is seen about 7 times there, and the bigram table memorises its pairs),
# so cpu-600s keeps its first recipe.
CPU_100S_CHANGES = (
    Change("torch.compile, compiled before the clock starts (1.5x the steps)", ("--train.compile", "true", "--train.fused-loss", "false")),
    Change("a bigram hash table of 16,384 rows added to the token embedding",
           ("--train.model.bigram-vocab", "16384")),
)

TRACKS = {
    "cpu-100s": Track("cpu-100s", 100.0, "100 s of pretraining on the built-in corpus", CPU_100S_CHANGES),
    "cpu-600s": Track("cpu-600s", 600.0, "600 s of pretraining on the built-in corpus"),
    "demo": Track("demo", DEMO_SECONDS, "what `make demo` pretrains (then fine-tunes for chat)", pretrain_only=False),
}


def get_track(name: str) -> Track:
    if name not in TRACKS:
        raise GptlabError(f"unknown --track {name!r}; tracks: {', '.join(TRACKS)}")
    return TRACKS[name]


def selection_split(files: list[Path], val_every: int = 10) -> tuple[list[Path], list[Path]]:
    """(train, validation) for choosing settings: the training works (all but every val_every-th, the held-out
    test works) less every val_every-th of them, which become the validation split. Nothing held out is in either."""
    training = [path for index, path in enumerate(files, 1) if index % val_every]
    validation = training[val_every // 2 - 1 :: val_every]
    return [path for path in training if path not in validation], validation
