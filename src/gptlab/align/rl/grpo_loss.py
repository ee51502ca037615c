"""GRPO's settings and its objective: the config, the advantages, each token's weight, and the policy loss.

For P prompts each sampled G times, with rewards r (P, G):

    advantage A = r - mean(group rewards)   [/ std(group rewards), scale_rewards="group"]
    loss      over the completion tokens only (the prompt is given, not chosen):

      grpo       -min(ρA, clip(ρ, 1-ε_low, 1+ε_high)A), averaged per completion, then over completions
                 (DeepSeekMath); ρ = π/π_old, the importance ratio when `epochs` > 1 reuses a rollout
      dapo       the same clipped term, averaged over every completion token of the step (DAPO), so long
                 answers count per token; pair with --clip-high 0.28 for DAPO's clip-higher
      drgrpo     the clipped term summed, divided by completions × max_new_tokens, and no std scaling
                 (Dr. GRPO: neither length nor difficulty bias)
      reinforce  -A log π, averaged over tokens: on-policy REINFORCE with the group mean as baseline
                 (nanochat's chat_rl); one epoch per rollout
      expert     expert iteration: -log π of the completions the reward accepts (reward > 0), averaged
                 over their tokens: sample, keep verified answers, fine-tune on them (the simple baseline)

    kl_beta > 0 adds β·KL(π || π_ref) per token (the k3 estimator, as DeepSeekMath and TRL), against a
    frozen copy of the starting model; off by default, as in TRL.

Each completion token's weight (token_weights) carries the loss's normalisation over the whole step, all
micro-batches and ranks together, so a micro-batch's loss is a plain weighted sum and accumulation changes nothing.
The pieces here are pure functions of tensors, tested against hand computations.
Not here: sampling and scoring rollouts (gptlab.align.rl.grpo_rollouts), the loop (gptlab.align.rl.grpo).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from gptlab.align.logprobs import IGNORE
from gptlab.align.rl.learnable import FILTERS
from gptlab.runtime import GptlabError
from gptlab.train.config import TrainConfig
from gptlab.train.optim import OptimizerConfig
from gptlab.train.schedule import ScheduleConfig

LOSSES = ("grpo", "dapo", "drgrpo", "reinforce", "expert")
CLIPPED = ("grpo", "dapo", "drgrpo")


@dataclass(frozen=True, kw_only=True)
class GRPOConfig(TrainConfig):
    """TrainConfig's fields (init_from is the chat model; batch_tokens follows from the prompts), and these."""

    init_from: str = ""  # the chat model to improve: a run, checkpoint or model folder (--init)
    task: str = "arithmetic[digits=1]"  # prompts and verifier: a built-in task NAME[options] (gptlab.chat.tasks)
    reward: str = "verifier"  # reward functions, summed (gptlab.align.rl.rewards): verifier, file.py:fn, module:fn*0.5
    prompts_per_step: int = 16  # P: prompts per optimizer step, all ranks together
    group_size: int = 8  # G: samples per prompt; the advantage compares them with each other
    max_new_tokens: int = 32  # longest completion; longer ones are cut (and usually fail the verifier)
    temperature: float = 1.0  # sampling temperature of rollouts (and of pass@k)
    top_k: int = 0  # sample from the k likeliest tokens only (0: all)
    loss: str = "grpo"  # grpo | dapo | drgrpo | reinforce | expert (module docstring)
    scale_rewards: str = "auto"  # group (divide by the group's std) | none | auto (none for drgrpo, reinforce)
    epochs: int = 1  # optimizer steps per rollout (the clipped losses' inner epochs; ρ != 1 after the first)
    clip_low: float = 0.2  # ε_low: the ratio is clipped below at 1 - ε_low
    clip_high: float = 0.2  # ε_high: and above at 1 + ε_high (DAPO: 0.28)
    kl_beta: float = 0.0  # weight of the KL penalty to the starting model (0: off, no reference in memory)
    train_examples: int = 5000  # the train split's prompts drawn from (fewer if the task has fewer)
    eval_examples: int = 100  # held-out prompts for accuracy and pass@k
    eval_samples: int = 8  # k: samples per held-out prompt for pass@1 and pass@k
    task_every: int = 0  # steps between held-out evaluations (0: only before and after)
    slots: int = 0  # requests the engine decodes together (0: the whole rollout at once)
    prompt_filter: str = "none"  # learnable: train only on prompts whose start pass rate is between 0 and 1 | none: all
    probe_samples: int = 8  # samples per train prompt to measure the start's pass rate before training (0: no probe)
    probe_prompts: int = 64  # distinct train prompts probed at a time; learnable probes on (up to train_examples) until this many are kept
    tools: str | None = "auto"  # tools run in rollouts: auto (the task's, when it offers them) | none | a spec (calculator, my.py)
    tool_calls: int = 8  # most tool calls per completion; the next one gets an error result
    tool_seconds: float = 20.0  # most seconds all tool calls of one completion may take, each at most half

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loss not in LOSSES:
            raise GptlabError(f"unknown loss {self.loss!r}; use one of {', '.join(LOSSES)}")
        if self.scale_rewards not in ("auto", "group", "none"):
            raise GptlabError(f"scale_rewards must be auto, group or none, got {self.scale_rewards!r}")
        for name in ("prompts_per_step", "group_size", "max_new_tokens", "epochs", "train_examples", "eval_examples", "eval_samples"):
            if getattr(self, name) < 1:
                raise GptlabError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.group_size < 2 and self.loss != "expert":
            raise GptlabError(f"group_size must be at least 2 (advantages compare a prompt's samples), got {self.group_size}")
        if self.epochs > 1 and self.loss not in CLIPPED + ("expert",):
            raise GptlabError(f"{self.loss} is on-policy: one epoch per rollout; use --loss grpo, dapo or drgrpo for --epochs {self.epochs}")
        if self.temperature <= 0:
            raise GptlabError(f"temperature must be above 0 (rollouts sample), got {self.temperature}")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0) or self.kl_beta < 0:
            raise GptlabError(f"need 0 <= clip_low < 1, clip_high >= 0 and kl_beta >= 0; got {self.clip_low}, {self.clip_high}, {self.kl_beta}")
        if min(self.task_every, self.top_k, self.slots, self.probe_samples) < 0 or self.probe_prompts < 1:
            raise GptlabError("task_every, top_k, slots and probe_samples must be 0 or more, probe_prompts at least 1")
        if self.prompt_filter not in FILTERS:
            raise GptlabError(f"unknown prompt_filter {self.prompt_filter!r}; use one of {', '.join(FILTERS)}")
        if self.prompt_filter == "learnable" and self.probe_samples < 2:
            raise GptlabError(f"prompt_filter learnable compares a prompt's samples: probe_samples must be at least 2, "
                              f"got {self.probe_samples} (or pass --prompt-filter none)")

    @property
    def scaled(self) -> bool:
        """Whether advantages are divided by their group's standard deviation."""
        if self.scale_rewards == "auto":
            return self.loss in ("grpo", "dapo")
        return self.scale_rewards == "group"

    @property
    def sequences(self) -> int:
        return self.prompts_per_step * self.group_size


def grpo_cpu() -> GRPOConfig:
    """A few minutes on 2 CPU cores: the demo's chat model practises a built-in task."""
    return GRPOConfig(
        task="arithmetic[digits=1]",
        optimizer=OptimizerConfig(lr=1e-4, weight_decay=0.0, betas=(0.9, 0.95)),
        schedule=ScheduleConfig(kind="constant", warmup_steps=0),
        prompts_per_step=16, group_size=8, micro_batch=32, seq_len=128, max_new_tokens=24,
        max_steps=60, eval_every=0, checkpoint_every=20, log_every=5, eval_examples=100, eval_samples=16,
        prompt_filter="learnable",
    )


GRPO_PRESETS = {"grpo-cpu": grpo_cpu}


def group_advantages(rewards: torch.Tensor, scale: bool, eps: float = 1e-4) -> torch.Tensor:
    """(P, G) rewards -> (P, G) advantages: each minus its group's mean, divided by the group's std if `scale`.

    The std is the unbiased one (as TRL's); a group with no spread gets 0, not 0/0.
    """
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if not scale:
        return centred
    return centred / (rewards.std(dim=1, keepdim=True) + eps)


def token_weights(lengths: torch.Tensor, loss: str, max_new_tokens: int, keep: torch.Tensor | None = None,
                  tokens: Callable[[float], float] = lambda local: local) -> torch.Tensor:
    """(N,) completion lengths -> (N,) the weight of each of a completion's tokens in the step's loss.

    grpo: 1 / (length × N), each completion's mean then their mean; dapo, reinforce: 1 / all tokens;
    drgrpo: 1 / (N × max_new_tokens); expert: 1 / the kept completions' tokens (0 for the rest).
    Under DDP, `tokens(local count)` gives the step's count per rank (all ranks' sum / world size,
    as DDP averages the ranks' gradients), so the token means are over the whole step.
    """
    lengths = lengths.double().clamp(min=1)
    n = len(lengths)
    if loss == "grpo":
        return 1.0 / (lengths * n)
    if loss == "drgrpo":
        return torch.full_like(lengths, 1.0 / (n * max_new_tokens))
    kept = torch.ones_like(lengths) if loss in ("dapo", "reinforce") else keep.double()
    total = tokens((lengths * kept).sum().item())
    return kept / total if total else kept


@dataclass
class LossParts:
    loss: torch.Tensor  # the micro-batch's share of the step's loss
    clipped: float  # completion tokens whose ratio was clipped
    tokens: float  # completion tokens
    kl: float  # summed per-token KL estimate


def policy_loss(logp: torch.Tensor, y: torch.Tensor, batch: dict, config: GRPOConfig) -> LossParts:
    """The micro-batch's loss from the policy's per-token log-probs (B, T) and the rollout's tensors."""
    mask = (y != IGNORE).to(logp.dtype)
    advantages = batch["advantages"].to(logp.dtype)[:, None]
    weights = batch["weights"].to(logp.dtype)[:, None] * mask
    old = batch["old_logp"] if "old_logp" in batch else logp.detach()
    ratio = torch.exp(logp - old)
    clipped_count = torch.zeros(())
    if config.loss in CLIPPED:
        low, high = 1 - config.clip_low, 1 + config.clip_high
        per_token = -torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages)
        clipped_count = (((ratio < low) & (advantages < 0)) | ((ratio > high) & (advantages > 0))).to(logp.dtype) * mask
    elif config.loss == "reinforce":
        per_token = -advantages * logp
    else:  # expert: the kept completions' weights are non-zero, the others' zero
        per_token = -logp
    kl = torch.zeros_like(logp)
    if config.kl_beta > 0:
        gap = batch["ref_logp"] - logp
        kl = torch.exp(gap) - gap - 1  # k3: unbiased for KL(π || π_ref), never negative
        per_token = per_token + config.kl_beta * kl
    return LossParts((per_token * weights).sum(), float(clipped_count.sum()), float(mask.sum()), float((kl * mask).sum()))

