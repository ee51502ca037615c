"""Which train prompts the start can learn from: its pass rate on each, measured before GRPO's first step.

    start: 62 of 75 train prompts always right, 5 never, 8 in between; mean pass rate 0.91 (8 samples each)

A group whose samples all get the same reward has advantage 0 and no gradient (gptlab.align.rl.grpo_loss), so a
prompt the start always (or never) answers right teaches it nothing. Before training, each distinct train
prompt is sampled `probe_samples` times by the batched rollout engine and scored by the run's rewards ("right":
reward > 0). prompt_filter="learnable" keeps the prompts whose samples' rewards differ (for a 0/1 verifier, a
pass rate strictly between 0 and 1): DAPO's dynamic sampling (Yu et al. 2025), applied once, at the start.
Prompts are probed `probe_prompts` at a time, the pool refilled from further train examples (up to
train_examples), until that many are kept; fewer than one step's prompts is refused, with the fixes.

Exact: each request's sampler is seeded from (seed, PROBE_STREAM, prompt, sample), so what a prompt samples does
not depend on batching or on how DDP ranks split the prompts (each probes a share; all gather every result).
The kept pool is saved with each checkpoint (RolloutLoader's state): a resumed run trains on the same prompts
without probing again. Not here: rollouts (gptlab.align.rl.rollout), reward functions (gptlab.align.rl.rewards),
the loop (gptlab.align.rl.grpo).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from gptlab.align.rl.rollout import answer_text, rollout, tool_prompt
from gptlab.chat import ChatFormat
from gptlab.infer.generate import SamplingConfig
from gptlab.model import GPT
from gptlab.runtime import GptlabError

FILTERS = ("learnable", "none")
PROBE_STREAM = 0x70726F6265  # "probe" in ASCII: the probe's seeds, apart from the rollouts' (seed, rollout)
FIXES = ("try a harder task (e.g. --task \"arithmetic[digits=2]\"), a higher --temperature, a larger --probe-samples "
         "or an earlier checkpoint for --init")
FLAT = 0.9  # a rollout whose groups are at least this share without reward spread has (nearly) no gradient


def distinct(examples: list) -> list:
    """The first example of each question, in split order: a generated split repeats its questions (1-digit sums
    have 75 outside the test split), and a prompt probed twice would count twice."""
    first: dict[str, object] = {}
    for example in examples:
        first.setdefault(example.question, example)
    return list(first.values())


@dataclass
class StartProbe:
    """The probed prompts' rewards, in candidate order: rewards[i] holds prompt i's samples' rewards."""

    rewards: list[list[float]]

    def pass_rates(self) -> list[float]:
        return [sum(value > 0 for value in values) / len(values) for values in self.rewards]

    def learnable(self) -> list[int]:
        """The prompts whose samples' rewards differ: their advantages, and so their gradients, are not 0."""
        return [index for index, values in enumerate(self.rewards) if max(values) > min(values)]

    def describe(self) -> str:
        rates = self.pass_rates()
        always, never = sum(rate == 1 for rate in rates), sum(rate == 0 for rate in rates)
        samples = len(self.rewards[0]) if self.rewards else 0
        return (f"start: {always} of {len(rates)} train prompts always right, {never} never, "
                f"{len(rates) - always - never} in between; mean pass rate {np.mean(rates):.2f} ({samples} samples each)")


def sample_rewards(model: GPT, chat: ChatFormat, score: Callable, examples: list, keys: list[int], sampling: SamplingConfig,
                   *, samples: int, seed: int, slots: int | None, rank: int = 0, world: int = 1, tools=None) -> list[list[float]]:
    """Each example's `samples` rewards; rank r samples examples r, r + world, ... and every rank gets them all."""
    mine = list(range(rank, len(examples), world))
    local: list[list[float]] = []
    if mine:
        prompts = [tool_prompt(chat, [{"role": "user", "content": examples[i].question}], tools) for i in mine]
        groups = rollout(model, prompts, sampling, samples=samples, seed=seed, slots=slots, keys=[keys[i] for i in mine],
                         tools=tools)
        texts = [answer_text(chat, c.tokens, tools) for group in groups for c in group]
        rewards, _ = score([examples[i] for i in mine for _ in range(samples)], texts)
        local = [list(rewards[j * samples : (j + 1) * samples]) for j in range(len(mine))]
    if world == 1:
        return local
    gathered: list = [None] * world
    torch.distributed.all_gather_object(gathered, local)
    return [gathered[i % world][i // world] for i in range(len(examples))]


def probe_start(model: GPT, chat: ChatFormat, score: Callable, candidates: list, sampling: SamplingConfig, config, *,
                rank: int = 0, world: int = 1, tools=None) -> StartProbe:
    """The start's rewards on the candidates, `probe_prompts` at a time; with prompt_filter learnable, on until
    `probe_prompts` are learnable or every candidate is probed (one block otherwise: a report only)."""
    seed = int(np.random.SeedSequence([config.seed, PROBE_STREAM]).generate_state(1)[0])
    rewards: list[list[float]] = []
    while len(rewards) < len(candidates):
        block = list(range(len(rewards), min(len(rewards) + config.probe_prompts, len(candidates))))
        rewards += sample_rewards(model, chat, score, [candidates[i] for i in block], block, sampling,
                                  samples=config.probe_samples, seed=seed, slots=config.slots or None, rank=rank, world=world,
                                  tools=tools)
        if config.prompt_filter != "learnable" or len(StartProbe(rewards).learnable()) >= config.probe_prompts:
            break
    return StartProbe(rewards)


def choose_pool(probe: StartProbe, config, log: Callable[[str], None]) -> list[int] | None:
    """The candidates to train on (their indices), or None for all (prompt_filter none); refused when the start
    leaves fewer learnable prompts than one step takes."""
    kept = probe.learnable()
    log(probe.describe())
    where = f"{config.task} at temperature {config.temperature:g}"
    if config.prompt_filter == "none":
        if not kept:
            log(f"warning: the start leaves nothing to learn: every probed prompt of {where} gave all its samples the same "
                f"reward, so their advantages and the gradient are 0; {FIXES}")
        return None
    if len(kept) < config.prompts_per_step:
        raise GptlabError(f"the start leaves nothing to learn: only {len(kept)} of {len(probe.rewards)} train prompts of {where} "
                          f"have a pass rate between 0 and 1 (rewards that differ across {config.probe_samples} samples), "
                          f"fewer than prompts_per_step {config.prompts_per_step}; {FIXES}, or --prompt-filter none to train anyway")
    short = f" (fewer than probe_prompts {config.probe_prompts}: each is drawn more often)" if len(kept) < config.probe_prompts else ""
    log(f"prompt filter learnable: training on the {len(kept)} prompts in between{short}")
    return kept


def nothing_learned(flat: int, rollouts: int) -> str | None:
    """The run's closing line when no rollout of it had much to learn from, else None."""
    if not rollouts or flat < rollouts:
        return None
    return (f"the start left nothing to learn: in all {rollouts} rollouts at least {FLAT:.0%} of the groups gave every sample "
            "the same reward, so the gradient was (nearly) 0; use --prompt-filter learnable, a harder --task, a higher "
            "--temperature or an earlier checkpoint for --init")
