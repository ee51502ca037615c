"""Rollouts: every prompt sampled `samples` times in one call to the batched KV-cache engine.

    groups = rollout(model, prompts, SamplingConfig(max_new_tokens=64, temperature=1.0, stop_tokens=chat.stop_tokens),
                     samples=8, seed=step_seed)
    groups[i][j].tokens     the j-th completion of prompt i (with its stop token when it stopped)

Rollouts are most of GRPO's time. All prompts × samples go to one Engine at
once, so every decode step runs the whole batch together and a finished row's
slot is refilled at once by a waiting one (gptlab.infer.engine). Each request
draws from its own generator, seeded from (seed, prompt, sample): the tokens do
not depend on how the batch is scheduled, so a resumed run samples what an
uninterrupted one would.

With tools (a gptlab.eval.chat.ChatTools: prompts rendered with the tools block by `tool_prompt`), each request
runs its own tool loop: the calls a sample makes run as it is generated and their results are fed to it, so a
completion's tokens hold the fed ones too. They are part of what the policy reads but not of what it chose:
`generated_masks` marks them 0 and `pad_rows` gives them no target, so no loss, KL, value or advantage term
counts them; the reward reads `answer_text`, the final answer after the last tool result.
Not here: rewards and losses (gptlab.align.rl.grpo).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from gptlab.chat import ChatFormat
from gptlab.eval.chat import ChatTools, final_answer, tool_costs
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
            slots: int | None = None, keys: list[int] | None = None, tools: ChatTools | None = None) -> list[list[Completion]]:
    """`samples` completions of each prompt, all requests decoded together (at most `slots` at a time).

    `keys[i]` names prompt i in its requests' seeds (default: i), so that a prompt dealt to another
    DDP rank, or batched with other prompts, is sampled alike. With `tools`, each request its own tool loop.
    """
    requests = len(prompts) * samples
    if requests == 0:
        return []
    was_training = model.training
    engine = Engine(model, EngineConfig(slots=min(slots or requests, requests)))  # puts the model in eval mode
    try:
        keys = list(range(len(prompts))) if keys is None else keys
        submitted = [[engine.submit(prompt, replace(sampling, seed=request_seed(seed, key, j)),
                                    tools=tools.turn() if tools is not None else None) for j in range(samples)]
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


def tool_prompt(chat: ChatFormat, messages: list[dict], tools: ChatTools | None) -> list[int]:
    """A prompt's ids, after the tools block when `tools` offers some."""
    return chat.prompt(messages, tools=tools.specs if tools is not None else None)


def answer_text(chat: ChatFormat, tokens: list[int], tools: ChatTools | None) -> str:
    """What a completion's reward reads: its text without stop tokens; with tools, the final answer."""
    if tools is not None:
        return final_answer(chat, tokens)
    return chat.tokenizer.decode([t for t in tokens if t not in chat.stop_tokens])


def generated_masks(chat: ChatFormat, completions: list[Completion], tools: ChatTools | None) -> list[list[int]] | None:
    """Per completion, 1 for each token the model chose and 0 for each one the tools fed; None without tools."""
    return [chat.generated_mask(c.tokens) for c in completions] if tools is not None else None


def tool_stats(chat: ChatFormat, completions: list[Completion]) -> dict[str, float]:
    """Per completion, the mean tool calls that ran and tokens the tools fed (logged with a rollout's stats)."""
    costs = np.array([tool_costs(chat, c.tokens) for c in completions], dtype=float).reshape(-1, 2)
    return {"tool_calls": float(costs[:, 1].mean()), "fed_tokens": float(costs[:, 0].mean())} if len(costs) else {}


def pad_rows(sequences: list[list[int]], starts: list[int], length: int, device: torch.device | str = "cpu",
             masks: list[list[int]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets (N, length - 1) of prompt + completion rows: targets only from `starts[i]` on (-100 before
    and in the padding), so a loss sees the completion's tokens alone; `masks[i]` (over row i's completion) 0 where
    a token was fed by tools, which then is read but is no target either."""
    x = torch.zeros(len(sequences), length - 1, dtype=torch.long)
    y = torch.full((len(sequences), length - 1), -100, dtype=torch.long)
    for row, (sequence, start) in enumerate(zip(sequences, starts)):
        ids = torch.tensor(sequence[:length], dtype=torch.long)
        x[row, : len(ids) - 1] = ids[:-1]
        targets = ids[start:]
        if masks is not None:
            own = torch.tensor(masks[row][: len(targets)], dtype=torch.bool)
            targets = torch.where(own, targets, torch.full_like(targets, -100))
        y[row, start - 1 : len(ids) - 1] = targets
    return x.to(device), y.to(device)
