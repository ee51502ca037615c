"""One recipe over seeds: N ordinary training runs, seeds S, S+1, ..., S+N-1, one after another, each into OUT-seedS.

    runs = train_seeds(train_preset("shakespeare-cpu", data=..., out="runs/base"), 3, lambda config: Trainer(config))
    print(seeds_summary(runs))        # each metric's mean ± std over the 3 runs, and the command to compare them

A change to a recipe counts when it beats the old one over seeds (modded-nanogpt's records: 3 or more, Welch's
p < 0.05), so both recipes are trained this way and compared with `gptlab runs compare --group`. Each run is a
run of its own folder: rerunning resumes the unfinished one and says the finished ones are done, and --force,
--no-resume and --extend act on each folder. A Ctrl-C ends the current run as training does (its checkpoint
saved) and no later seed starts.
Not here: training one run (gptlab.train.trainer), the statistics (gptlab.runs.groups).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from gptlab.runs.groups import compare_groups
from gptlab.runtime import GptlabError
from gptlab.runtime.device import Runtime
from gptlab.train.config import TrainConfig
from gptlab.train.prepare import new_run_folder
from gptlab.train.trainer import Trainer, TrainResult


@dataclass
class SeedRuns:
    base: str  # OUT: the runs are OUT-seedS
    configs: list[TrainConfig]  # one per seed, in order
    results: list[TrainResult]  # of the runs trained (fewer than configs after a Ctrl-C)

    @property
    def stopped(self) -> bool:
        """A Ctrl-C ended a run: the seeds after it did not start."""
        return bool(self.results) and self.results[-1].status == "interrupted"


def seed_configs(config: TrainConfig, seeds: int, base: str) -> list[TrainConfig]:
    """`config` at seeds S..S+N-1 (S = config.seed), each into BASE-seedS."""
    return [dataclasses.replace(config, seed=config.seed + i, out=f"{base}-seed{config.seed + i}") for i in range(seeds)]


def seeds_base(config: TrainConfig, seeds: int, runtime: Runtime) -> str:
    """OUT without a trailing slash, or a new runs/train-DATE-TIME that no seed's folder holds (rank 0's, under torchrun)."""
    if config.out:
        return str(Path(config.out))
    shared = [str(new_run_folder(suffixes=tuple(f"-seed{config.seed + i}" for i in range(seeds)))) if runtime.is_main else None]
    if runtime.distributed:
        torch.distributed.broadcast_object_list(shared, src=0)
    return shared[0]


def train_seeds(config: TrainConfig, seeds: int, build: Callable[[TrainConfig], Trainer], *,
                runtime: Runtime, log: Callable[[str], None] = print) -> SeedRuns:
    """Train `config` at `seeds` seeds in turn, each run by build(its config).fit(); stop at a Ctrl-C."""
    if seeds < 1:
        raise GptlabError(f"--seeds {seeds} trains no run; pass --seeds 1 or more (3 or more to compare recipes over seeds)")
    say = log if runtime.is_main else (lambda *_: None)
    base = seeds_base(config, seeds, runtime)
    runs = SeedRuns(base=base, configs=seed_configs(config, seeds, base), results=[])
    if not config.out:
        say(f"no --out given: training into {base}-seed{config.seed}... (pass --out {base} to resume these runs)")
    for number, one in enumerate(runs.configs, 1):
        say(f"seed {one.seed} ({number} of {seeds}) -> {one.out}")
        runs.results.append(build(one).fit())
        say(runs.results[-1].line())
        if runs.stopped:
            left = [str(later.seed) for later in runs.configs[number:]]
            if left:
                say(f"interrupted: seed{'s' if len(left) > 1 else ''} {', '.join(left)} not started; rerun the same command to go on")
            break
    return runs


def seeds_summary(runs: SeedRuns) -> str:
    """The runs' figures over seeds (gptlab.runs.groups), and how to set them against another recipe's."""
    name = Path(runs.base).name
    text = compare_groups({name: [one.out for one in runs.configs]})
    return (f"{name} over {len(runs.configs)} seed{'s' if len(runs.configs) > 1 else ''}:\n{text}\n\n"
            f"compare with another recipe's seeds: gptlab runs compare --group {name}='{runs.base}-seed*' --group NAME='OUT-seed*'")
