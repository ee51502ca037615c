"""Rollouts: every prompt sampled `samples` times in one call to the batched KV-cache engine.

    groups = rollout(model, prompts, SamplingConfig(max_new_tokens=64, temperature=1.0, stop_tokens=chat.stop_tokens),
                     samples=8, seed=step_seed)
    groups[i][j].tokens     the j-th completion of prompt i (with its stop token when it stopped)

Rollouts are most of GRPO's time. All prompts × samples go to one Engine at
once, so every decode step runs the whole batch together and a finished row's
slot is refilled at once by a waiting one (gptlab.infer.engine). Each request
draws from its own generator, seeded from (seed, prompt, sample): the tokens do
not depend on how the batch is scheduled, so a resumed run samples what an
uninterrupted one would. Not here: rewards and losses (gptlab.align.rl.grpo).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from gptlab.infer.engine import Engine, EngineConfig
from gptlab.infer.generate import SamplingConfig
from gptlab.model import GPT


@dataclass(frozen=True)
class Completion:
    tokens: list[int]  # the sampled ids, ending with the stop token when one ended it
    stopped: bool  # ended by a stop token (False: cut off at max_new_tokens)


def request_seed(seed: int, prompt: int, sample: int) -> int:
    """A 63-bit seed of its own for each (prompt, sample): independent streams, whatever the batch."""
    return int(np.random.SeedSequence([seed, prompt, sample]).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


def rollout(model: GPT, prompts: list[list[int]], sampling: SamplingConfig, *, samples: int = 1, seed: int = 0,
            slots: int | None = None, keys: list[int] | None = None) -> list[list[Completion]]:
    """`samples` completions of each prompt, all requests decoded together (at most `slots` at a time).

    `keys[i]` names prompt i in its requests' seeds (default: i), so that a prompt dealt to another
    DDP rank, or batched with other prompts, is sampled alike.
    """
    requests = len(prompts) * samples
    if requests == 0:
        return []
    was_training = model.training
    engine = Engine(model, EngineConfig(slots=min(slots or requests, requests)))  # puts the model in eval mode
    try:
        keys = list(range(len(prompts))) if keys is None else keys
        submitted = [[engine.submit(prompt, replace(sampling, seed=request_seed(seed, key, j))) for j in range(samples)]
                     for key, prompt in zip(keys, prompts)]
        groups = [[_collect(request) for request in group] for group in submitted]
    finally:
        engine.close()
        model.train(was_training)
    return groups


def _collect(request) -> Completion:
    tokens = list(request)  # blocks until the request finishes
    if request.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"a rollout request ended with {request.finish_reason!r}; see the engine's log")
    stopped = request.finish_reason == "stop"
    return Completion(tokens + [request.stop_token] if stopped else tokens, stopped)


def pad_rows(sequences: list[list[int]], starts: list[int], length: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets (N, length - 1) of prompt + completion rows: targets only from `starts[i]` on (-100 before
    and in the padding), so a loss sees the completion's tokens alone."""
    x = torch.zeros(len(sequences), length - 1, dtype=torch.long)
    y = torch.full((len(sequences), length - 1), -100, dtype=torch.long)
    for row, (sequence, start) in enumerate(zip(sequences, starts)):
        ids = torch.tensor(sequence[:length], dtype=torch.long)
        x[row, : len(ids) - 1] = ids[:-1]
        y[row, start - 1 : len(ids) - 1] = ids[start:]
    return x.to(device), y.to(device)
