"""GRPO's batches: each step's prompts drawn, sampled G times, scored by the rewards, and weighed for the loss.

    rollout   P prompts of the task's train split (each rank its share), each sampled G times by the
              batched KV-cache engine (gptlab.align.rl.rollout) from the current weights
    reward    each completion scored: the task's verifier, and/or user functions (gptlab.align.rl.rewards)
    weigh     advantages and per-token weights (gptlab.align.rl.grpo_loss), as tensors for the micro-batches

RolloutLoader is the GRPO Trainer's "loader": it makes a rollout on demand, serves it for `epochs` optimizer
steps (a new shuffle each), and saves a rollout still being reused in the checkpoint, with the prompt pool the
start's probe kept (gptlab.align.rl.learnable) and how many rollouts had (nearly) nothing to learn. Resume is exact:
prompts come in a seeded order and each request's sampler is seeded from (seed, rollout, prompt, sample). A few
completions of each rollout go to OUT/completions.jsonl, as TRL's completion tables.
Not here: the loss (gptlab.align.rl.grpo_loss), the loop (gptlab.align.rl.grpo), tasks and verifiers (gptlab.chat.tasks).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from gptlab.align.logprobs import IGNORE, token_logprobs
from gptlab.align.rl.grpo_loss import GRPOConfig, group_advantages, token_weights
from gptlab.align.rl.learnable import FLAT
from gptlab.align.rl.rewards import Rewards, example_columns
from gptlab.align.rl.rollout import answer_text, generated_masks, pad_rows, rollout, tool_stats
from gptlab.chat.data import task_from_spec
from gptlab.infer.generate import SamplingConfig
from gptlab.model import GPT

SHOWN_COMPLETIONS = 2  # completions per rollout written to completions.jsonl


class RolloutLoader:
    """The Trainer's "loader": each optimizer step's micro-batches, sampled from the current weights.

    A rollout serves `epochs` steps (a new shuffle of its completions each), then the next is made.
    Rank r takes prompts r, r + world, ... of each rollout's P. `stats` describes the latest rollout;
    `flat` counts the rollouts whose groups, all ranks together, were at least FLAT without reward spread.
    `trainer` is the GRPOTrainer it serves (gptlab.align.rl.grpo, which imports this module: never the reverse).
    """

    def __init__(self, trainer) -> None:
        self.trainer, self.config = trainer, trainer.config
        self.rank, self.world = trainer.runtime.rank, trainer.runtime.world_size
        self.rollout, self.served, self.buffer, self.flat = 0, 0, None, 0
        self.queue: list[tuple] = []
        self.stats: dict[str, float] = {}

    @property
    def steps_per_rollout(self) -> int:
        """Optimizer steps each rollout serves (GRPO: its epochs; PPO: epochs x minibatches)."""
        return self.config.epochs

    @property
    def prompts_per_rollout(self) -> int:
        return self.config.prompts_per_step

    @property
    def samples_per_prompt(self) -> int:
        return self.config.group_size

    def next_batch(self) -> tuple:
        if not self.queue:
            if self.buffer is None or self.served >= self.steps_per_rollout:
                self.buffer, self.served = self._sample(self.rollout), 0
                self.rollout += 1
            self.queue = self._micro_batches(self.served)
            self.served += 1
        return self.queue.pop(0)

    def state_dict(self) -> dict:
        """Where the run stands; a rollout that will serve more steps is kept whole, and the probe's pool (JSON-able)."""
        pending = self.buffer if self.buffer is not None and self.served < self.steps_per_rollout else None
        return {"rollout": self.rollout, "served": self.served, "buffer": pending, "flat": self.flat, "pool": self.trainer.kept}

    def load_state_dict(self, state: dict) -> None:
        """As saved; the trainer's pool becomes the one the run's probe kept (a resumed run does not probe again)."""
        self.rollout, self.served, self.buffer = state["rollout"], state["served"], state["buffer"]
        self.flat = state.get("flat", 0)
        if state.get("pool") is not None:
            self.trainer.use_pool(state["pool"])
        self.queue = []
        if self.buffer is not None:
            self._tensors = self._to_tensors(self.buffer)

    def _examples(self, rollout: int) -> list:
        return rollout_prompts(self.trainer.pool, self.prompts_per_rollout, rollout, self.rank, self.world, self.config.seed)

    def _sample(self, rollout: int) -> dict:
        """Sample, score and weigh one rollout; returns its JSON-able record (and sets the tensors)."""
        trainer, config = self.trainer, self.config
        start = time.perf_counter()
        examples = self._examples(rollout)
        prompts = [trainer.prompt_ids(example) for example in examples]
        keys = list(range(rollout * config.prompts_per_step + self.rank, (rollout + 1) * config.prompts_per_step, self.world))
        groups = rollout_groups(trainer.model, prompts, trainer.sampling, config, seed=[config.seed, rollout], keys=keys,
                                tools=trainer.tools)
        completions = [completion for group in groups for completion in group]
        texts = [answer_text(trainer.chat, c.tokens, trainer.tools) for c in completions]
        repeated = [example for example in examples for _ in range(config.group_size)]
        rewards, means = trainer.score(repeated, texts)
        buffer = {"sequences": [prompts[i // config.group_size] + c.tokens for i, c in enumerate(completions)],
                  "starts": [len(prompts[i // config.group_size]) for i in range(len(completions))],
                  "rewards": rewards, "old": None}
        self._keep_masks(buffer, completions)
        self._tensors = self._to_tensors(buffer)
        if config.epochs > 1:  # the ratio's denominator: the policy that sampled
            buffer["old"] = self._completion_logprobs(trainer.model)
            self._tensors = self._to_tensors(buffer)
        self.stats = rollout_stats(torch.tensor(rewards).view(-1, config.group_size), completions, means)
        if trainer.tools is not None:
            self.stats.update(tool_stats(trainer.chat, completions))
        groups = len(rewards) // config.group_size
        self.flat += self._per_rank(round(self.stats["zero_spread"] * groups)) >= FLAT * self._per_rank(groups)  # every rank's groups
        self.stats["rollout_s"] = time.perf_counter() - start  # sampling and scoring: most of a step's time
        self._show(rollout, repeated, texts, rewards)
        return buffer

    def _keep_masks(self, buffer: dict, completions: list) -> None:
        """With tools, which completion tokens the model chose (1) and which the tools fed (0: never trained on)."""
        masks = generated_masks(self.trainer.chat, completions, self.trainer.tools)
        if masks is not None:  # without tools the record stays as it was
            buffer["masks"] = masks

    def _to_tensors(self, buffer: dict) -> dict[str, torch.Tensor]:
        config, device = self.config, self.trainer.runtime.device
        width = max(len(sequence) for sequence in buffer["sequences"])  # the rollout's longest row, not seq_len: no wasted padding
        x, y = pad_rows(buffer["sequences"], buffer["starts"], width, device, masks=buffer.get("masks"))
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
            tensors["old_logp"] = place(buffer["old"], y)
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
                 for i in range(0, min(len(texts), SHOWN_COMPLETIONS * self.samples_per_prompt), self.samples_per_prompt)]
        with open(path, "a", encoding="utf-8") as handle:
            handle.writelines(lines)


def rollout_prompts(pool: list, per_rollout: int, rollout: int, rank: int, world: int, seed: int) -> list:
    """This rank's prompts of a rollout (positions rank, rank + world, ... of its per_rollout): the pool in a seeded
    order, reshuffled each pass over it, so a resumed run or another rank count deals the same prompts."""
    picked = []
    for position in range(rollout * per_rollout + rank, (rollout + 1) * per_rollout, world):
        passes, index = divmod(position, len(pool))
        order = np.random.default_rng([seed, passes]).permutation(len(pool))
        picked.append(pool[order[index]])
    return picked


def place(rows: list[list[float]], y: torch.Tensor) -> torch.Tensor:
    """Per-completion-token lists back into a (N, W) float32 tensor at the counted targets' places (0 elsewhere)."""
    out = torch.zeros(y.shape, dtype=torch.float32)
    counted = (y != IGNORE).cpu()
    for row, values in enumerate(rows):
        out[row, counted[row]] = torch.tensor(values, dtype=torch.float32)
    return out.to(y.device)


def rollout_groups(model: GPT, prompts: list[list[int]], sampling: SamplingConfig, config: GRPOConfig, seed: list[int],
                   keys: list[int], tools=None) -> list:
    """G completions of each prompt, in one engine call; the seed list is folded into one integer."""
    folded = int(np.random.SeedSequence(seed).generate_state(1)[0])
    return rollout(model, prompts, sampling, samples=config.group_size, seed=folded, slots=config.slots or None, keys=keys,
                   tools=tools)


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


def load_grpo_task(spec: str):
    """A built-in task from `NAME[options]` (or `task:NAME[options]`), e.g. arithmetic[digits=1]."""
    return task_from_spec(spec, "--task", "--train-examples and --eval-examples")


def make_scorer(spec: str, task) -> Callable[[list, list[str]], tuple[list[float], dict[str, float]]]:
    """(examples, completions) -> (a reward each, each reward function's mean) for the --reward spec.

    The functions are loaded now, so a bad spec is refused before any compute; they are called
    TRL-style (gptlab.align.rl.rewards) with the questions as prompts and the examples' columns.
    """
    rewards = Rewards.from_spec(spec, task=task)

    def score(examples: list, texts: list[str]) -> tuple[list[float], dict[str, float]]:
        scores = rewards.score([example.question for example in examples], texts, **example_columns(examples))
        means = scores.means if len(scores.means) > 1 else {}  # one function: its mean is the reward itself
        return scores.total, means

    return score

