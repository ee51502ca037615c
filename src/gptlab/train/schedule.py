"""Learning-rate schedules, as a function of the step: warmup then cosine, constant, warmup-stable-decay.

    cosine:   linear warmup, then cosine max_lr -> min_lr until total_steps
    constant: linear warmup, then max_lr
    wsd:      linear warmup, max_lr until the last decay_fraction of steps, then linear to min_lr
              (Hu et al., 2024, "MiniCPM")

Warmup is linear and its first step already trains, as in nanoGPT and build-nanogpt: step s < warmup_steps
(0-based) gets max_lr * (s + 1) / warmup_steps, so with 4 warmup steps the rates are 0.25, 0.5, 0.75, 1.0
times max_lr; the rate is never 0.

Time budgets: a run with a time limit does not know how many steps it will get. `time_fraction`, the
share of the budget spent, turns into the step it corresponds to (fraction x total_steps), and the
schedule follows whichever of the step and the time is further along. Any budget then ends annealed:
the last step of a time-limited run is at min_lr, as it would be at total_steps (modded-nanogpt and
nanochat decay by progress through the run, not by a step count fixed in advance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gptlab.runtime import GptlabError

KINDS = ("cosine", "constant", "wsd")


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig:
    kind: str = "cosine"  # cosine | constant | wsd (warmup-stable-decay)
    warmup_steps: int = 0  # steps of linear warmup
    min_lr_ratio: float = 0.1  # min_lr = max_lr * min_lr_ratio
    decay_fraction: float = 0.2  # wsd: share of total steps spent decaying

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GptlabError(f"unknown schedule {self.kind!r}; use one of {', '.join(KINDS)}")
        if self.warmup_steps < 0 or not 0 <= self.min_lr_ratio <= 1 or not 0 < self.decay_fraction <= 1:
            raise GptlabError(f"bad schedule: {self}")


def learning_rate(step: int, max_lr: float, total_steps: int, config: ScheduleConfig, time_fraction: float = 0.0) -> float:
    """The learning rate for 0-based `step`, `time_fraction` of a time budget spent (0: none)."""
    min_lr = max_lr * config.min_lr_ratio
    if step < config.warmup_steps:
        return max_lr * (step + 1) / config.warmup_steps
    step = max(step, time_fraction * total_steps)  # time turned into the step it corresponds to
    if config.kind == "constant":
        return max_lr
    if config.kind == "cosine":
        span = max(total_steps - config.warmup_steps, 1)
        progress = min((step - config.warmup_steps) / span, 1.0)
        return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (max_lr - min_lr)
    decay_start = total_steps - int(config.decay_fraction * total_steps)
    if step < decay_start:
        return max_lr
    progress = min((step - decay_start) / max(total_steps - decay_start, 1), 1.0)
    return max_lr + progress * (min_lr - max_lr)
