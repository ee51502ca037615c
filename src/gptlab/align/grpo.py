"""GRPO: reinforcement learning with verifiable rewards, and its relatives.

    gptlab grpo --init runs/shakespeare/sft --task "spelling" --out runs/grpo

One optimizer step, for P prompts of the task's train split:

    rollout   each prompt sampled G times by the batched KV-cache engine (gptlab.align.rollout)
    reward    each completion scored: the task's verifier, and/or user functions (gptlab.align.rewards)
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

Reward functions are called once before the run folder is claimed, on a rollout's shape of stand-in
completions (right replies, empty ones, wrong ones), so one that raises or returns the wrong count, text
or NaN is refused before any compute. A new run that fails before its first step is removed, so
the corrected command starts afresh; --parallel.fsdp is refused (each rank's rollout differs in length).

A group whose samples all get the same reward has advantage 0 and teaches
nothing: the fraction of such groups is logged, with a warning as it nears 1.
Held-out accuracy (greedy), pass@1 and pass@k (k samples each) on the task's
test split are measured before, during (task_every) and after training.

The Trainer runs underneath (checkpoints, exact resume, DDP, precision): a
"batch" here is a rollout, made on demand by RolloutLoader from the current
weights; its per-token weights carry the loss's normalisation over the whole
step, so micro-batches and accumulation change nothing. Resume is exact: each
request's sampler is seeded from (seed, rollout, prompt, sample), and a
rollout still being reused (epochs > 1) is saved in the checkpoint.

Not here: sampling (gptlab.align.rollout, gptlab.infer), reward functions
(gptlab.align.rewards), tasks and verifiers (gptlab.chat.tasks).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from gptlab.align.logprobs import IGNORE, token_logprobs
from gptlab.align.rewards import Rewards, example_columns
from gptlab.align.rollout import pad_rows, rollout
from gptlab.align.start import find_init, refuse_fsdp
from gptlab.chat import CHAT_TOKENS, ChatFormat
from gptlab.chat.data import load_task, parse_mixture
from gptlab.data.match import find_model_tokenizer
from gptlab.infer.generate import SamplingConfig
from gptlab.model import GPT
from gptlab.model.hf import load_pretrained_directory, read_pretrained_config
from gptlab.runtime import GptlabError, atomic_write_text
from gptlab.runtime.device import resolve_precision
from gptlab.train.checkpoint import list_checkpoints
from gptlab.train.config import TrainConfig
from gptlab.train.optim import OptimizerConfig
from gptlab.train.schedule import ScheduleConfig
from gptlab.train.trainer import RUN_FILES, Trainer, TrainResult

LOSSES = ("grpo", "dapo", "drgrpo", "reinforce", "expert")
CLIPPED = ("grpo", "dapo", "drgrpo")
ZERO_SPREAD_WARNING = 0.9  # warn when this fraction of groups has no reward spread
SHOWN_COMPLETIONS = 2  # completions per rollout written to completions.jsonl


@dataclass(frozen=True, kw_only=True)
class GRPOConfig(TrainConfig):
    """TrainConfig's fields (init_from is the chat model; batch_tokens follows from the prompts), and these."""

    init_from: str = ""  # the chat model to improve: a run, checkpoint or model folder (--init)
    task: str = "arithmetic[digits=1]"  # prompts and verifier: a built-in task NAME[options] (gptlab.chat.tasks)
    reward: str = "verifier"  # reward functions, summed (gptlab.align.rewards): verifier, file.py:fn, module:fn*0.5
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
        if min(self.task_every, self.top_k, self.slots) < 0:
            raise GptlabError("task_every, top_k and slots must be 0 or more")

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
    )


GRPO_PRESETS = {"grpo-cpu": grpo_cpu}


# ---------------------------------------------------------------- advantages and the loss


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


# ---------------------------------------------------------------- rollouts as batches


class RolloutLoader:
    """The Trainer's "loader": each optimizer step's micro-batches, sampled from the current weights.

    A rollout serves `epochs` steps (a new shuffle of its completions each), then the next is made.
    Rank r takes prompts r, r + world, ... of each rollout's P. `stats` describes the latest rollout.
    """

    def __init__(self, trainer: GRPOTrainer) -> None:
        self.trainer, self.config = trainer, trainer.config
        self.rank, self.world = trainer.runtime.rank, trainer.runtime.world_size
        self.rollout, self.served, self.buffer = 0, 0, None
        self.queue: list[tuple] = []
        self.stats: dict[str, float] = {}

    def next_batch(self) -> tuple:
        if not self.queue:
            if self.buffer is None or self.served >= self.config.epochs:
                self.buffer, self.served = self._sample(self.rollout), 0
                self.rollout += 1
            self.queue = self._micro_batches(self.served)
            self.served += 1
        return self.queue.pop(0)

    def state_dict(self) -> dict:
        """Where the run stands; a rollout that will serve more steps is kept whole (JSON-able)."""
        pending = self.buffer if self.buffer is not None and self.served < self.config.epochs else None
        return {"rollout": self.rollout, "served": self.served, "buffer": pending}

    def load_state_dict(self, state: dict) -> None:
        self.rollout, self.served, self.buffer = state["rollout"], state["served"], state["buffer"]
        self.queue = []
        if self.buffer is not None:
            self._tensors = self._to_tensors(self.buffer)

    def _examples(self, rollout: int) -> list:
        """This rank's prompts of a rollout: the pool in a seeded order, reshuffled each pass over it."""
        pool, P = self.trainer.pool, self.config.prompts_per_step
        picked = []
        for position in range(rollout * P + self.rank, (rollout + 1) * P, self.world):
            passes, index = divmod(position, len(pool))
            order = np.random.default_rng([self.config.seed, passes]).permutation(len(pool))
            picked.append(pool[order[index]])
        return picked

    def _sample(self, rollout: int) -> dict:
        """Sample, score and weigh one rollout; returns its JSON-able record (and sets the tensors)."""
        trainer, config = self.trainer, self.config
        start = time.perf_counter()
        examples = self._examples(rollout)
        prompts = [trainer.chat.prompt([{"role": "user", "content": example.question}]) for example in examples]
        keys = list(range(rollout * config.prompts_per_step + self.rank, (rollout + 1) * config.prompts_per_step, self.world))
        groups = rollout_groups(trainer.model, prompts, trainer.sampling, config, seed=[config.seed, rollout], keys=keys)
        completions = [completion for group in groups for completion in group]
        texts = [trainer.tokenizer.decode([t for t in c.tokens if t not in trainer.chat.stop_tokens]) for c in completions]
        repeated = [example for example in examples for _ in range(config.group_size)]
        rewards, means = trainer.score(repeated, texts)
        buffer = {"sequences": [prompts[i // config.group_size] + c.tokens for i, c in enumerate(completions)],
                  "starts": [len(prompts[i // config.group_size]) for i in range(len(completions))],
                  "rewards": rewards, "old": None}
        self._tensors = self._to_tensors(buffer)
        if config.epochs > 1:  # the ratio's denominator: the policy that sampled
            buffer["old"] = self._completion_logprobs(trainer.model)
            self._tensors = self._to_tensors(buffer)
        self.stats = rollout_stats(torch.tensor(rewards).view(-1, config.group_size), completions, means)
        self.stats["rollout_s"] = time.perf_counter() - start  # sampling and scoring: most of a step's time
        self._show(rollout, repeated, texts, rewards)
        return buffer

    def _to_tensors(self, buffer: dict) -> dict[str, torch.Tensor]:
        config, device = self.config, self.trainer.runtime.device
        width = max(len(sequence) for sequence in buffer["sequences"])  # the rollout's longest row, not seq_len: no wasted padding
        x, y = pad_rows(buffer["sequences"], buffer["starts"], width, device)
        rewards = torch.tensor(buffer["rewards"], dtype=torch.float32).view(-1, config.group_size)
        lengths = (y != IGNORE).sum(dim=1).cpu()
        if config.loss == "expert":
            keep = rewards.flatten() > 0
            advantages, weights = keep.float(), token_weights(lengths, "expert", config.max_new_tokens, keep, self._per_rank)
        else:
            advantages = group_advantages(rewards, config.scaled).flatten()
            weights = token_weights(lengths, config.loss, config.max_new_tokens, tokens=self._per_rank)
        tensors = {"x": x, "y": y, "advantages": advantages.to(device), "weights": weights.float().to(device)}
        if buffer.get("old") is not None:
            tensors["old_logp"] = _scatter(buffer["old"], y)
        if self.trainer.reference is not None:
            tensors["ref_logp"] = self._logprobs(self.trainer.reference, x, y)
        return tensors

    def _per_rank(self, local: float) -> float:
        """A count summed over the ranks, divided by their number (every rank calls this together)."""
        if self.world == 1:
            return local
        total = torch.tensor([local], dtype=torch.float64, device=self.trainer.runtime.device)
        torch.distributed.all_reduce(total)
        return total.item() / self.world

    def _logprobs(self, model: GPT, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-token log-probs of whole rows in micro-batches, without gradients (old policy, reference)."""
        was_training = model.training
        model.eval()
        with torch.no_grad(), self.trainer.cast:
            parts = [token_logprobs(model, x[i : i + self.config.micro_batch], y[i : i + self.config.micro_batch])
                     for i in range(0, len(x), self.config.micro_batch)]
        model.train(was_training)
        return torch.cat(parts)

    def _completion_logprobs(self, model: GPT) -> list[list[float]]:
        logp = self._logprobs(model, self._tensors["x"], self._tensors["y"])
        counted = self._tensors["y"] != IGNORE
        return [row[mask].tolist() for row, mask in zip(logp.cpu(), counted.cpu())]

    def _micro_batches(self, epoch: int) -> list[tuple]:
        """The rollout's completions in a seeded order (new each epoch), cut into micro-batches."""
        tensors, size = self._tensors, self.config.micro_batch
        order = torch.from_numpy(np.random.default_rng([self.config.seed, self.rollout, epoch, self.rank]).permutation(len(tensors["x"])))
        batches = []
        for start in range(0, len(order), size):
            rows = order[start : start + size].to(tensors["x"].device)
            extra = {key: value[rows] for key, value in tensors.items() if key not in ("x", "y")}
            batches.append((tensors["x"][rows], tensors["y"][rows], extra))
        return batches

    def _show(self, rollout: int, examples: list, texts: list[str], rewards: list[float]) -> None:
        """A few completions of each rollout into completions.jsonl (rank 0), as TRL's completion tables."""
        if not self.trainer.runtime.is_main:
            return
        path = Path(self.config.out) / "completions.jsonl"
        lines = [json.dumps({"step": self.trainer.state.step, "rollout": rollout, "question": examples[i].question,
                             "completion": texts[i], "reward": rewards[i]}) + "\n"
                 for i in range(0, min(len(texts), SHOWN_COMPLETIONS * self.config.group_size), self.config.group_size)]
        with open(path, "a", encoding="utf-8") as handle:
            handle.writelines(lines)


def _scatter(values: list[list[float]], y: torch.Tensor) -> torch.Tensor:
    """Per-completion-token values back into a (N, T) tensor at the counted targets' places."""
    out = torch.zeros(y.shape, dtype=torch.float32)
    counted = (y != IGNORE).cpu()
    for row, row_values in enumerate(values):
        out[row, counted[row]] = torch.tensor(row_values, dtype=torch.float32)
    return out.to(y.device)


def rollout_groups(model: GPT, prompts: list[list[int]], sampling: SamplingConfig, config: GRPOConfig, seed: list[int],
                   keys: list[int]) -> list:
    """G completions of each prompt, in one engine call; the seed list is folded into one integer."""
    folded = int(np.random.SeedSequence(seed).generate_state(1)[0])
    return rollout(model, prompts, sampling, samples=config.group_size, seed=folded, slots=config.slots or None, keys=keys)


def rollout_stats(rewards: torch.Tensor, completions: list, means: dict[str, float]) -> dict[str, float]:
    """What TRL and nanochat users watch: reward mean and spread, groups without spread, completion length."""
    spread = rewards.std(dim=1) if rewards.shape[1] > 1 else torch.zeros(len(rewards))
    return {
        "reward": rewards.mean().item(),
        "reward_std": rewards.std().item() if rewards.numel() > 1 else 0.0,
        "zero_spread": (spread == 0).float().mean().item(),
        "length": float(np.mean([len(c.tokens) for c in completions])),
        "stopped": float(np.mean([c.stopped for c in completions])),
        **{f"reward_{name}": value for name, value in means.items()},
    }


# ---------------------------------------------------------------- the trainer


class GRPOTrainer(Trainer):
    """The Trainer with rollouts for batches and the policy-gradient loss (module docstring)."""

    command = "grpo"
    run_files = RUN_FILES + ("completions.jsonl",)
    fsdp_ok = False  # each rank samples rollouts of its own length: sharded forwards would not pair up

    def _check_before_compute(self, config: GRPOConfig) -> GRPOConfig:
        refuse_fsdp(config.parallel, self.command, "each rank samples rollouts of its own length, so sharded forwards would not pair up")
        if not config.init_from:
            raise GptlabError("GRPO starts from a chat model: pass --init CHECKPOINT (e.g. the output of gptlab sft)")
        self.init_path = find_init(config.init_from)
        self.tokenizer = find_model_tokenizer(self.init_path)
        if self.tokenizer is None or not all(token in self.tokenizer.special_tokens for token in CHAT_TOKENS):
            raise GptlabError(f"{config.init_from} is not a chat model (its tokenizer lacks the chat tokens): "
                              "fine-tune it with gptlab sft first, then pass that run to --init")
        self.chat = ChatFormat(self.tokenizer)
        self.fingerprint = self.tokenizer.fingerprint()
        init = read_pretrained_config(self.init_path)
        config = dataclasses.replace(config, model=dataclasses.replace(init, dropout=config.model.dropout),
                                     seq_len=min(config.seq_len, init.block_size))
        config = dataclasses.replace(config, batch_tokens=config.sequences * config.seq_len)  # TrainConfig's view of a step
        self._check_batch(config)
        self.task = load_grpo_task(config.task)
        self.score = make_scorer(config.reward, self.task)
        self.pool = self._prompt_pool(config)
        self._probe_rewards(config)
        self.sampling = SamplingConfig(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                                       top_k=config.top_k or None, stop_tokens=self.chat.stop_tokens,
                                       vocab_size=self.tokenizer.vocab_size)
        self.has_val, self.reference = False, None
        self.accum = config.accumulation_steps(self.runtime.world_size)
        self.precision = resolve_precision(config.precision, self.runtime.device)
        return self._shorten_warmup(config)

    def _probe_rewards(self, config: GRPOConfig) -> None:
        """Score one rollout-shaped batch before the run folder is claimed, so a reward function that raises, or
        returns the wrong count, text or NaN, is refused before any compute and leaves nothing behind. The
        completions stand in for samples: each group gets its prompt's right reply, an empty reply (a model
        can stop at once) and another prompt's reply."""
        per_rank = config.prompts_per_step // self.runtime.world_size
        examples = [self.pool[index % len(self.pool)] for index in range(per_rank)]
        repeated = [example for example in examples for _ in range(config.group_size)]
        texts = [(example.reply, "", examples[(number + 1) % len(examples)].reply)[sample % 3]
                 for number, example in enumerate(examples) for sample in range(config.group_size)]
        try:
            self.score(repeated, texts)
        except GptlabError as error:
            raise GptlabError(f"{error} (checked before training, on {len(texts)} stand-in completions: "
                              "right replies, empty ones and wrong ones)") from None

    def fit(self) -> TrainResult:
        """The Trainer's; and a new run that fails before its first step ends (a reward function that fails only on
        real samples) is removed, so rerunning with the fix starts afresh instead of being refused as other settings.
        A run that trained a step keeps its folder: its metrics say what happened."""
        try:
            return super().fit()
        except GptlabError:
            self._forget_untrained_run()
            raise

    def _forget_untrained_run(self) -> None:
        folder = getattr(self, "folder", None)
        state = getattr(self, "state", None)
        if folder is None or folder.status != "new" or (state is not None and state.step > 0) or list_checkpoints(folder.path):
            return
        if getattr(self, "metrics", None) is not None:
            self.metrics.close()  # its files are about to go
        folder.undo()

    def _check_batch(self, config: GRPOConfig) -> None:
        world = self.runtime.world_size
        if config.prompts_per_step % world:
            raise GptlabError(f"prompts_per_step {config.prompts_per_step} does not divide among {world} ranks")
        per_rank = config.sequences // world
        if per_rank % config.micro_batch:
            raise GptlabError(f"a rank's {per_rank} completions per step (prompts_per_step x group_size / ranks) do not divide "
                              f"into micro-batches of {config.micro_batch}; pass --micro-batch {math.gcd(per_rank, config.micro_batch)}")

    def _prompt_pool(self, config: GRPOConfig) -> list:
        """The train prompts that fit the context with max_new_tokens; the others are counted and left out."""
        size = getattr(self.task, "train_size", None)
        examples = self.task.examples("train", min(config.train_examples, size) if size else config.train_examples)
        room = min(config.seq_len + 1, config.model.block_size) - config.max_new_tokens
        pool = [e for e in examples if len(self.chat.prompt([{"role": "user", "content": e.question}])) <= room]
        if room < 1:
            raise GptlabError(f"max_new_tokens {config.max_new_tokens} leaves no room for a prompt in seq_len "
                              f"{config.seq_len} (the model's context is {config.model.block_size}); lower --max-new-tokens")
        if not pool:
            raise GptlabError(f"no {self.task.name} prompt fits {room} tokens (seq_len {config.seq_len} less "
                              f"max_new_tokens {config.max_new_tokens}); lower --max-new-tokens")
        if len(pool) < len(examples):
            self.print(f"note: {len(examples) - len(pool)} of {len(examples)} prompts are too long for the context and left out")
        return pool

    def _make_model(self) -> GPT:
        model = load_pretrained_directory(self.init_path, device=self.runtime.device)
        if self.config.kl_beta > 0:  # a frozen copy of the start, for the KL penalty
            self.reference = load_pretrained_directory(self.init_path, device=self.runtime.device).eval().requires_grad_(False)
        return model

    def _loader(self, split: str) -> RolloutLoader:
        return RolloutLoader(self)

    def _token_bytes(self) -> torch.Tensor | None:
        return None

    def _task_every(self) -> int:
        return self.config.task_every

    def _step_batches(self) -> tuple[list[tuple], list[float | None]]:
        """The rollout's micro-batches; their per-token weights already hold the step's normalisation."""
        self.parts = {"clipped": 0.0, "tokens": 0.0, "kl": 0.0}
        batches = [self.train_loader.next_batch() for _ in range(self.accum)]
        self.rows_tokens = sum(x.numel() for x, _, _ in batches) * self.runtime.world_size
        return batches, [None] * self.accum

    def _step_tokens(self) -> int:
        return self.rows_tokens

    def _micro_loss(self, x: torch.Tensor, y: torch.Tensor, kwargs: dict, weight: float | None) -> torch.Tensor:
        with self.cast:
            logp = token_logprobs(self.wrapped, x, y)
        parts = policy_loss(logp, y, kwargs, self.config)
        for key in self.parts:
            self.parts[key] += getattr(parts, key)
        return parts.loss

    def _step_metrics(self) -> dict[str, float]:
        stats = dict(self.train_loader.stats)
        tokens = max(self.parts["tokens"], 1.0)
        if self.config.loss in CLIPPED:
            stats["clipped"] = self.parts["clipped"] / tokens
        if self.config.kl_beta > 0:
            stats["kl"] = self.parts["kl"] / tokens
        if stats.get("zero_spread", 0) >= ZERO_SPREAD_WARNING:
            self.print(f"warning: {stats['zero_spread']:.0%} of groups gave every sample the same reward, so their "
                       "advantages are 0 and the gradient vanishes; try a higher --temperature, a larger --group-size "
                       "or an easier task")
        return stats

    def _announce(self) -> None:
        super()._announce()
        config = self.config
        self.print(f"each step: {config.prompts_per_step} prompts x {config.group_size} samples of up to "
                   f"{config.max_new_tokens} tokens ({config.task}, reward {config.reward}, loss {config.loss}"
                   f"{f', {config.epochs} steps per rollout' if config.epochs > 1 else ''}); rows are as long as the "
                   f"rollout's longest, so tokens/step varies")

    def _restore(self, path: Path | None):
        """As the Trainer's, and completions logged after the checkpoint are dropped (they will be sampled again)."""
        state = super()._restore(path)
        completions = Path(self.config.out) / "completions.jsonl"
        if self.runtime.is_main and completions.is_file():
            kept = [line for line in completions.read_text(encoding="utf-8").splitlines(keepends=True)
                    if line.strip() and json.loads(line)["step"] < state.step]
            atomic_write_text(completions, "".join(kept))
        return state


def load_grpo_task(spec: str):
    """A built-in task from `NAME[options]` (or `task:NAME[options]`), e.g. arithmetic[digits=1]."""
    text = spec.strip()
    (part,) = parse_mixture(text if text.startswith("task:") else f"task:{text}")
    if part.n is not None or part.epochs != 1.0 or part.split != "train":
        raise GptlabError(f"--task {spec}: give the task and its settings only, e.g. arithmetic[digits=1]; "
                          "use --train-examples and --eval-examples for sizes")
    return load_task(part.source.removeprefix("task:"), part.task_options)


def make_scorer(spec: str, task) -> Callable[[list, list[str]], tuple[list[float], dict[str, float]]]:
    """(examples, completions) -> (a reward each, each reward function's mean) for the --reward spec.

    The functions are loaded now, so a bad spec is refused before any compute; they are called
    TRL-style (gptlab.align.rewards) with the questions as prompts and the examples' columns.
    """
    rewards = Rewards.from_spec(spec, task=task)

    def score(examples: list, texts: list[str]) -> tuple[list[float], dict[str, float]]:
        scores = rewards.score([example.question for example in examples], texts, **example_columns(examples))
        means = scores.means if len(scores.means) > 1 else {}  # one function: its mean is the reward itself
        return scores.total, means

    return score


# ---------------------------------------------------------------- held-out measures and the run


@dataclass
class HeldOut:
    """Per held-out question: greedy right or not, and how many of k samples were right."""

    greedy: list[bool]
    samples: list[int]
    k: int

    def summary(self, name: str) -> dict[str, float]:
        n = len(self.greedy)
        return {f"{name}_accuracy": sum(self.greedy) / n, f"{name}_pass@1": sum(self.samples) / (self.k * n),
                f"{name}_pass@{self.k}": sum(c > 0 for c in self.samples) / n, f"{name}_correct": sum(self.greedy),
                f"{name}_n": n}


def heldout(model: GPT, chat: ChatFormat, task, config: GRPOConfig, sampling: SamplingConfig) -> HeldOut:
    """Held-out accuracy (greedy) and k samples per question at the rollouts' temperature, question by question.

    pass@1 is the mean share of a question's k samples the verifier accepts, pass@k the share of
    questions with one accepted (with n = k samples the unbiased estimator is exactly these).
    Under DDP each rank takes questions r, r + world, ... and every rank gets the whole lists.
    """
    from gptlab.eval.chat import grade

    size = getattr(task, "test_size", None)
    n = min(config.eval_examples, size) if size else config.eval_examples
    rank, world = _rank_and_world()
    mine = task.examples("test", n)[rank::world]
    greedy = [g.correct for g in grade(model, chat, task, mine, max_new_tokens=config.max_new_tokens)]
    prompts = [chat.prompt([{"role": "user", "content": example.question}]) for example in mine]
    groups = rollout(model, prompts, sampling, samples=config.eval_samples, seed=config.seed + 1,
                     slots=config.slots or None, keys=list(range(rank, n, world)))
    samples = [sum(task.verify(example, chat.tokenizer.decode([t for t in c.tokens if t not in chat.stop_tokens]))
                   for c in group) for example, group in zip(mine, groups)]
    if world > 1:
        gathered: list = [None] * world
        torch.distributed.all_gather_object(gathered, (greedy, samples))
        greedy = [gathered[i % world][0][i // world] for i in range(n)]
        samples = [gathered[i % world][1][i // world] for i in range(n)]
    return HeldOut(greedy, samples, config.eval_samples)


def heldout_fn(chat: ChatFormat, task, config: GRPOConfig, sampling: SamplingConfig) -> Callable[[GPT], dict[str, float]]:
    """model -> the held-out summary, for the Trainer's periodic task_fn."""
    return lambda model: heldout(model, chat, task, config, sampling).summary(task.name)


def compare(before: HeldOut, after: HeldOut) -> str:
    """The change on the same questions, with 95% paired t intervals over questions (greedy accuracy and pass@1)."""
    from gptlab.eval.stats import mean_interval

    n = len(before.greedy)
    greedy = [float(a) - float(b) for a, b in zip(after.greedy, before.greedy)]
    sampled = [(a - b) / before.k for a, b in zip(after.samples, before.samples)]
    parts = []
    for label, differences in (("accuracy", greedy), ("pass@1", sampled)):
        low, high = mean_interval(differences) if n > 1 else (math.nan, math.nan)
        parts.append(f"{label} {sum(differences) / n:+.3f} (95% CI {low:+.3f} to {high:+.3f})")
    return f"change on the same {n} held-out questions: " + ", ".join(parts) + " (paired t intervals)"


def _rank_and_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


@dataclass
class GRPOResult:
    train: TrainResult
    before: dict[str, float] = field(default_factory=dict)  # held-out measures of the starting model
    after: dict[str, float] = field(default_factory=dict)  # ... and of the trained one

    @property
    def status(self) -> str:
        return self.train.status


def run_grpo(config: GRPOConfig, *, runtime=None, log: Callable[[str], None] = print, resume: bool = True,
             force: bool = False) -> GRPOResult:
    """Train with GRPO (or a relative), with held-out accuracy and pass@k before and after (every rank calls this)."""
    from gptlab.align.sft import chat_sampler

    trainer = GRPOTrainer(config, runtime=runtime, log=log, resume=resume, force=force)
    trainer.sample_fn = chat_sampler(trainer.task.examples("test", 1)[0].question, trainer.config.max_new_tokens)
    task, name = trainer.task, trainer.task.name
    trainer.task_fn = heldout_fn(trainer.chat, task, trainer.config, trainer.sampling)

    def measure_start() -> HeldOut:
        start = heldout(load_pretrained_directory(trainer.init_path, device=trainer.runtime.device), trainer.chat, task,
                        trainer.config, trainer.sampling)
        if trainer.runtime.is_main:
            log("before: " + describe(start.summary(name), name, config.eval_samples))
        return start

    trainer.before_fn = measure_start
    result = trainer.fit()
    start = trainer.before
    before, after = start.summary(name), {}
    if result.status != "interrupted":
        end = heldout(trainer.model, trainer.chat, task, trainer.config, trainer.sampling)
        after = end.summary(name)
        if trainer.runtime.is_main:
            log("after:  " + describe(after, name, config.eval_samples))
            log(compare(start, end))
    if trainer.runtime.is_main:
        log(f"{result.status} after {result.steps} steps in {result.seconds:.0f} s; checkpoint {result.checkpoint}")
    return GRPOResult(result, before, after)


def describe(scores: dict[str, float], name: str, k: int) -> str:
    """One line of held-out measures, accuracy with its 95% Wilson interval."""
    from gptlab.eval.stats import wilson_interval

    n, correct = int(scores[f"{name}_n"]), int(scores[f"{name}_correct"])
    low, high = wilson_interval(correct, n)
    return (f"{name} held-out accuracy {correct}/{n} = {correct / n:.3f} (95% CI {low:.3f}-{high:.3f}), "
            f"pass@1 {scores[f'{name}_pass@1']:.3f}, pass@{k} {scores[f'{name}_pass@{k}']:.3f}")
