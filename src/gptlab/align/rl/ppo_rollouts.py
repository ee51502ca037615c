"""PPO's batches: each rollout's prompts drawn, sampled once each, scored, and turned into per-token advantages.

    rollout   P prompts of the pool (the task's train split, or --prompts; each rank its share), one completion each, sampled by the
              batched KV-cache engine (gptlab.align.rl.rollout) from the current policy
    score     each completion scored by the --reward spec (gptlab.align.rl.rewards: rm:DIR, verifier, judge:URL, ...)
    old       one pass without gradients: the policy's log-probs and values, the reference's log-probs
    advantage per-token rewards, GAE and whitening (gptlab.align.rl.ppo_loss), kept as the rollout's record

With tools, the tokens they fed are no targets (gptlab.align.rl.rollout.pad_rows): the old pass, the KL, the values,
GAE and the losses run over the tokens the policy chose, in order, the fed ones read as context between them.

PPORolloutLoader is the PPO Trainer's "loader": a rollout serves ppo_epochs x minibatches optimizer steps, each
epoch a new seeded shuffle cut into minibatches, each minibatch into micro-batches whose per-token weights hold
the minibatch's mean (all ranks together). After each rollout the KL coefficient adapts (when a target is set).
Resume is exact: prompts come in a seeded order, each request's sampler is seeded from (seed, rollout, prompt),
and a rollout still being served is saved in the checkpoint whole, with β. A few completions of each rollout go
to OUT/completions.jsonl.
Not here: the losses (gptlab.align.rl.ppo_loss), the loop and the models (gptlab.align.rl.ppo).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from gptlab.align.logprobs import IGNORE, logits_logprobs, masked_mean, whiten
from gptlab.align.rl.grpo_rollouts import RolloutLoader, place
from gptlab.align.rl.ppo_loss import gae, kl_controller, token_rewards
from gptlab.align.rl.rollout import answer_text, pad_rows, rollout, tool_stats

PER_TOKEN = ("old_logp", "old_values", "advantages", "returns")  # the rollout's per-completion-token lists


class PPORolloutLoader(RolloutLoader):
    """GRPO's rollout "loader" (seeded prompts, serving, resume) with one completion per prompt, PPO's advantages,
    and β: each rollout serves ppo_epochs x minibatches steps. Rank r takes prompts r, r + world, ... of each rollout.
    `trainer` is the PPOTrainer it serves (gptlab.align.rl.ppo, which imports this module: never the reverse)."""

    def __init__(self, trainer) -> None:
        super().__init__(trainer)
        self.kl = kl_controller(self.config)

    @property
    def steps_per_rollout(self) -> int:
        return self.config.ppo_epochs * self.config.minibatches

    @property
    def prompts_per_rollout(self) -> int:
        return self.config.rollout_prompts

    @property
    def samples_per_prompt(self) -> int:
        return 1

    def state_dict(self) -> dict:
        """GRPO's, and β."""
        return {**super().state_dict(), "beta": self.kl.value}

    def load_state_dict(self, state: dict) -> None:
        self.kl.value = state["beta"]
        super().load_state_dict(state)

    def _sample(self, rollout_index: int) -> dict:
        """Sample, score and evaluate one rollout; returns its JSON-able record (and sets the tensors)."""
        trainer, config = self.trainer, self.config
        start = time.perf_counter()
        examples = self._examples(rollout_index)
        prompts = [trainer.prompt_ids(example) for example in examples]  # a task's question or a Prompt's messages
        keys = list(range(rollout_index * config.rollout_prompts + self.rank, (rollout_index + 1) * config.rollout_prompts, self.world))
        folded = int(np.random.SeedSequence([config.seed, rollout_index]).generate_state(1)[0])
        groups = rollout(trainer.model.policy, prompts, trainer.sampling, samples=1, seed=folded, slots=config.slots or None,
                         keys=keys, tools=trainer.tools)
        completions = [group[0] for group in groups]
        texts = [answer_text(trainer.chat, c.tokens, trainer.tools) for c in completions]
        scores, means = trainer.score(examples, texts)
        buffer = {"sequences": [prompt + c.tokens for prompt, c in zip(prompts, completions)],
                  "starts": [len(prompt) for prompt in prompts], "scores": scores,
                  "stopped": [c.stopped for c in completions]}
        self._keep_masks(buffer, completions)  # with tools: the fed tokens, which no term of the loss counts
        buffer.update(self._advantages(buffer))
        self._tensors = self._to_tensors(buffer)
        self.stats["rollout_s"] = time.perf_counter() - start  # sampling, scoring and the old pass: most of a step's time
        self.stats.update({f"reward_{name}": value for name, value in means.items()})
        if trainer.tools is not None:
            self.stats.update(tool_stats(trainer.chat, completions))
        self._show(rollout_index, examples, texts, scores)
        return buffer

    def _advantages(self, buffer: dict) -> dict[str, list[list[float]]]:
        """The old pass, per-token rewards, GAE and whitening; β adapts to the rollout's KL afterwards."""
        config, device = self.config, self.trainer.runtime.device
        width = max(len(sequence) for sequence in buffer["sequences"])  # the rollout's longest row: no wasted padding
        x, y = pad_rows(buffer["sequences"], buffer["starts"], width, device, masks=buffer.get("masks"))
        logp, values = self._no_grad(self.trainer.model, x, y)
        reference, _ = self._no_grad(self.trainer.reference, x, y)
        mask = left_align(y != IGNORE, y).float()
        logp, values, reference = (left_align(t, y) for t in (logp, values, reference))
        kl = (logp - reference) * mask
        stopped = torch.tensor(buffer["stopped"], device=device)
        scores = torch.tensor(buffer["scores"], dtype=torch.float32, device=device)
        scores = scores - config.missing_eos_penalty * (~stopped).float()  # TRL's missing_eos_penalty
        beta = self.kl.value
        rewards = token_rewards(scores, kl, mask, beta)
        advantages, returns = gae(rewards, values, mask, config.gamma, config.lam)
        if config.whiten_advantages:
            advantages = self._whiten(advantages, mask)
        mean_kl = self._mean(kl.sum(1).mean().item())
        self.stats = {"reward": scores.mean().item(), "non_score_reward": (-beta * kl).sum(1).mean().item(), "kl": kl.sum(1).mean().item(),
                      "beta": beta, "length": mask.sum(1).mean().item(), "stopped": stopped.float().mean().item(),
                      "explained_variance": explained_variance(values, returns, mask)}
        self.kl.update(mean_kl, config.rollout_prompts)
        lengths = mask.sum(1).long().tolist()
        return {name: [row[:n].tolist() for row, n in zip(tensor.cpu(), lengths)]
                for name, tensor in zip(PER_TOKEN, (logp, values, advantages, returns))}

    def _no_grad(self, model, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs (and values, for the policy-and-value model) of whole rows in micro-batches."""
        was_training = model.training
        model.eval()
        logps, values = [], []
        with torch.no_grad(), self.trainer.cast:
            for i in range(0, len(x), self.config.micro_batch):
                out = model(x[i : i + self.config.micro_batch])
                logits = out[0] if isinstance(out, tuple) else out
                logps.append(logits_logprobs(logits, y[i : i + self.config.micro_batch]))
                if isinstance(out, tuple) and out[1] is not None and out[1].dim() == 2:
                    values.append(out[1].float())
        model.train(was_training)
        return torch.cat(logps), torch.cat(values) if values else None

    def _whiten(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """logprobs.whiten over every rank's completion tokens together (the same mean and variance on each rank)."""
        if self.world == 1:
            return whiten(values, mask)
        count = self._sum(mask.sum().item())
        mean = self._sum((values * mask).sum().item()) / count
        var = self._sum((((values - mean) * mask) ** 2).sum().item()) / max(count - 1, 1)
        return (values - mean) * (var + 1e-8) ** -0.5 * mask

    def _sum(self, local: float) -> float:
        """A number summed over the ranks (every rank calls this together)."""
        if self.world == 1:
            return local
        total = torch.tensor([local], dtype=torch.float64, device=self.trainer.runtime.device)
        torch.distributed.all_reduce(total)
        return total.item()

    def _mean(self, local: float) -> float:
        return self._sum(local) / self.world

    def _to_tensors(self, buffer: dict) -> dict[str, torch.Tensor]:
        width = max(len(sequence) for sequence in buffer["sequences"])
        x, y = pad_rows(buffer["sequences"], buffer["starts"], width, self.trainer.runtime.device, masks=buffer.get("masks"))
        return {"x": x, "y": y, **{name: place(buffer[name], y) for name in PER_TOKEN}}

    def _micro_batches(self, served: int) -> list[tuple]:
        """Minibatch `served % minibatches` of epoch `served // minibatches`'s seeded shuffle, cut into micro-batches;
        each completion token weighs 1 / the minibatch's completion tokens over every rank (× world: DDP averages)."""
        tensors, config = self._tensors, self.config
        epoch, part = divmod(served, config.minibatches)
        order = np.random.default_rng([config.seed, self.rollout, epoch, self.rank]).permutation(len(tensors["x"]))
        size = len(order) // config.minibatches
        rows = torch.from_numpy(order[part * size : (part + 1) * size]).to(tensors["x"].device)
        counted = tensors["y"][rows] != IGNORE
        weights = counted.float() * self.world / max(self._sum(counted.sum().item()), 1.0)
        batches = []
        for start in range(0, size, config.micro_batch):
            chosen = rows[start : start + config.micro_batch]
            extra = {name: tensors[name][chosen] for name in PER_TOKEN}
            extra["weights"] = weights[start : start + config.micro_batch]
            batches.append((tensors["x"][chosen], tensors["y"][chosen], extra))
        return batches


def left_align(values: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(N, W) values at the counted targets' places -> (N, L) the same values from column 0, L the longest count."""
    counted = y != IGNORE
    lengths = counted.sum(1)
    out = torch.zeros(len(y), max(int(lengths.max()), 1), dtype=values.dtype, device=values.device)
    for row in range(len(y)):
        out[row, : lengths[row]] = values[row][counted[row]]
    return out


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the completion tokens: 1 a perfect value model, <= 0 a useless one."""
    variance = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask).item()
    error = returns - values
    residual = masked_mean((error - masked_mean(error, mask)) ** 2, mask).item()
    return 1.0 - residual / variance if variance > 0 else float("nan")
