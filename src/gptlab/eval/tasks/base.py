"""Multiple-choice tasks: examples, and accuracy from the likelihood the model gives each choice.

An example is a context and a few continuations, one of them right (`gold`).
The model picks the continuation it finds most likely:

    acc       argmax_k  sum_t log p(continuation_k[t] | context, continuation_k[:t])
    acc_norm  argmax_k  (that sum) / len(continuation_k in tokens)

acc_norm divides by the number of continuation tokens, as build-nanogpt's
HellaSwag evaluation does (the mean loss over an ending's tokens); without it
long endings lose for being long. lm-eval divides by the continuation's
characters instead, so its acc_norm differs from ours by a little. Ties go to
the first choice.

Texts go through the `encode` callable the caller passes in (the eval stage
sees ids, never a tokenizer): the context and each continuation are encoded
separately and concatenated, as build-nanogpt and lm-eval do. Every
continuation of every example is one request to gptlab.eval.scoring, and many
examples are scored together in each batch.

A new task is a subclass with a `name` and `examples()` (see
gptlab.eval.tasks.hellaswag). Under torch.distributed, rank r scores examples
r, r + world, r + 2 world, ... of the first `limit` and the counts are summed
over ranks, so every rank returns the same result.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from gptlab.eval.scoring import count_truncated, score_continuations
from gptlab.runtime import GptlabError

Encode = Callable[[str], list[int]]
EXAMPLES_PER_CHUNK = 512  # examples encoded and scored together: enough to sort into well-filled batches


@dataclass(frozen=True)
class Example:
    """A context, its candidate continuations (text or ids) and the index of the right one."""

    context: str | Sequence[int]
    continuations: Sequence[str | Sequence[int]]
    gold: int

    def __post_init__(self) -> None:
        if not self.continuations:
            raise GptlabError("an example needs at least one continuation")
        if not 0 <= self.gold < len(self.continuations):
            raise GptlabError(f"gold index {self.gold} is not one of the {len(self.continuations)} continuations")


def encode_example(example: Example, encode: Encode | None) -> tuple[list[int], list[list[int]]]:
    """(context ids, [continuation ids, ...]); text is encoded, ids pass through."""

    def ids(part: str | Sequence[int]) -> list[int]:
        if not isinstance(part, str):
            return list(part)
        if encode is None:
            raise GptlabError("this task's examples are text: pass an encode function (text -> ids)")
        return list(encode(part))

    return ids(example.context), [ids(continuation) for continuation in example.continuations]


def choose(logprobs: Sequence[float], lengths: Sequence[int]) -> tuple[int, int]:
    """(the choice by summed log-likelihood, the choice by log-likelihood per token); ties go to the first."""
    choices = range(len(logprobs))
    by_sum = max(choices, key=lambda k: logprobs[k])
    by_mean = max(choices, key=lambda k: logprobs[k] / lengths[k])
    return by_sum, by_mean


class MultipleChoiceTask:
    """A task whose examples are multiple choice; subclasses provide `name` and `examples()`."""

    name = "multiple-choice"

    def examples(self) -> Iterable[Example]:
        raise NotImplementedError

    def evaluate(
        self,
        model,
        encode: Encode | None = None,
        *,
        batch_size: int = 32,
        limit: int | None = None,
        device: torch.device | str | None = None,
        autocast=None,
        log: Callable[[str], None] | None = None,
        progress: bool = False,
    ) -> dict:
        """acc, acc_norm, n (examples), truncated (requests cut to fit the context), examples/s, seconds.

        `progress`: a progress bar with an ETA on stderr (rank 0, when stderr is a terminal).
        """
        if limit is not None and limit < 1:
            raise GptlabError(f"limit must be at least 1, got {limit}")
        device = torch.device(device) if device is not None else next(model.parameters()).device
        rank, world_size = _rank_and_world()
        start = time.perf_counter()
        counts = torch.zeros(4, dtype=torch.float64)  # examples, right by sum, right by mean, truncated requests
        mine = itertools.islice(self.examples(), rank, limit, world_size)
        known = [n for n in (limit, self.size()) if n is not None]
        total = len(range(rank, min(known), world_size)) if known else None
        bar = tqdm(total=total, desc=self.name, unit="example", disable=None if progress and rank == 0 else True)
        for chunk in _chunks(mine, EXAMPLES_PER_CHUNK):
            counts += self._score_chunk(model, chunk, encode, batch_size, device, autocast)
            bar.update(len(chunk))
            if log is not None:
                log(f"{self.name}: {int(counts[0])} examples on this rank, acc_norm so far {counts[2] / counts[0]:.4f}")
        bar.close()
        if world_size > 1:
            counts = counts.to(device)
            torch.distributed.all_reduce(counts)
            counts = counts.cpu()
        seconds = time.perf_counter() - start
        n = int(counts[0])
        if n == 0:
            raise GptlabError(f"{self.name} has no examples to evaluate")
        return {
            "acc": float(counts[1] / n),
            "acc_norm": float(counts[2] / n),
            "n": n,
            "truncated": int(counts[3]),
            "examples_per_second": n / seconds,
            "seconds": seconds,
        }

    def size(self) -> int | None:
        """How many examples the task has, if known cheaply (for the progress bar's ETA)."""
        return None

    def _score_chunk(self, model, chunk: list[Example], encode, batch_size, device, autocast) -> torch.Tensor:
        encoded = [encode_example(example, encode) for example in chunk]
        requests = [(context, continuation) for context, continuations in encoded for continuation in continuations]
        scores = iter(score_continuations(model, requests, batch_size, device, autocast=autocast))
        right_by_sum = right_by_mean = 0
        for example, (_, continuations) in zip(chunk, encoded):
            logprobs = [next(scores).logprob for _ in continuations]
            by_sum, by_mean = choose(logprobs, [len(continuation) for continuation in continuations])
            right_by_sum += by_sum == example.gold
            right_by_mean += by_mean == example.gold
        truncated = count_truncated(requests, model.config.block_size)
        return torch.tensor([len(chunk), right_by_sum, right_by_mean, truncated], dtype=torch.float64)


def _rank_and_world() -> tuple[int, int]:
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if not distributed:
        return 0, 1
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def _chunks(items: Iterable[Example], size: int) -> Iterator[list[Example]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk
