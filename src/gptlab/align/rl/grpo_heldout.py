"""GRPO's held-out measures: greedy accuracy, pass@1 and pass@k on the task's test split, and their change.

Measured before training, every task_every steps, and after, on the same questions; the change is given
with 95% paired t intervals over questions, and accuracy alone with its Wilson interval. Under DDP each
rank answers its share of the questions and every rank gets the whole lists.
Not here: grading an answer (gptlab.eval.chat, the task's verifier), the loop that calls these (gptlab.align.rl.grpo).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gptlab.align.rl.grpo_loss import GRPOConfig
from gptlab.align.rl.rollout import answer_text, rollout, tool_prompt
from gptlab.chat import ChatFormat
from gptlab.eval.chat import ChatTools
from gptlab.infer.generate import SamplingConfig
from gptlab.model import GPT


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


def heldout(model: GPT, chat: ChatFormat, task, config: GRPOConfig, sampling: SamplingConfig,
            tools: ChatTools | None = None) -> HeldOut:
    """Held-out accuracy (greedy) and k samples per question at the rollouts' temperature, question by question.

    pass@1 is the mean share of a question's k samples the verifier accepts, pass@k the share of
    questions with one accepted (with n = k samples the unbiased estimator is exactly these).
    Under DDP each rank takes questions r, r + world, ... and every rank gets the whole lists. With `tools`, they
    run as in the rollouts and the final answers are graded.
    """
    from gptlab.eval.chat import grade

    size = getattr(task, "test_size", None)
    n = min(config.eval_examples, size) if size else config.eval_examples
    rank, world = _rank_and_world()
    mine = task.examples("test", n)[rank::world]
    greedy = [g.correct for g in grade(model, chat, task, mine, tools=tools, max_new_tokens=config.max_new_tokens)]
    prompts = [tool_prompt(chat, [{"role": "user", "content": example.question}], tools) for example in mine]
    groups = rollout(model, prompts, sampling, samples=config.eval_samples, seed=config.seed + 1,
                     slots=config.slots or None, keys=list(range(rank, n, world)), tools=tools)
    samples = [sum(task.verify(example, answer_text(chat, c.tokens, tools)) for c in group) for example, group in zip(mine, groups)]
    if world > 1:
        gathered: list = [None] * world
        torch.distributed.all_gather_object(gathered, (greedy, samples))
        greedy = [gathered[i % world][0][i // world] for i in range(n)]
        samples = [gathered[i % world][1][i // world] for i in range(n)]
    return HeldOut(greedy, samples, config.eval_samples)


def heldout_fn(chat: ChatFormat, task, config: GRPOConfig, sampling: SamplingConfig,
               tools: ChatTools | None = None) -> Callable[[GPT], dict[str, float]]:
    """model -> the held-out summary, for the Trainer's periodic task_fn."""
    return lambda model: heldout(model, chat, task, config, sampling, tools).summary(task.name)


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


def describe(scores: dict[str, float], name: str, k: int) -> str:
    """One line of held-out measures, accuracy with its 95% Wilson interval."""
    from gptlab.eval.stats import wilson_interval

    n, correct = int(scores[f"{name}_n"]), int(scores[f"{name}_correct"])
    low, high = wilson_interval(correct, n)
    return (f"{name} held-out accuracy {correct}/{n} = {correct / n:.3f} (95% CI {low:.3f}-{high:.3f}), "
            f"pass@1 {scores[f'{name}_pass@1']:.3f}, pass@{k} {scores[f'{name}_pass@{k}']:.3f}")


def _rank_and_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1

