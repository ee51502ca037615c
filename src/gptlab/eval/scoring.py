"""Log-likelihood scoring: how likely a model finds a continuation after a context, batched.

A request is (context ids, continuation ids). Its score is the summed log
probability of the continuation tokens, each given everything before it, and
whether every continuation token is the model's greedy (argmax) choice:

    context [5, 9], continuation [2, 7]   ->  input [5, 9, 2], targets [9, 2, 7]
    score = log p(2 | 5 9) + log p(7 | 5 9 2);  greedy = argmax(p(. | 5 9)) == 2 and argmax(p(. | 5 9 2)) == 7

Requests are sorted by length (longest first, so an out-of-memory batch shows
at once), right-padded into batches of `batch_size` rows and scored with one
forward pass per batch: pads sit after a row's real tokens, so causal
attention never lets a real position see them. Results come back in request
order. A request longer than the model's context (block_size + 1 tokens, since
the last token is only a target) keeps its last block_size + 1 tokens: the
context is cut on the left, the continuation stays whole. `count_truncated`
says how many requests that happens to.

`rolling_loglikelihood` scores a whole document (perplexity-style, as
lm-eval's loglikelihood_rolling) through the same batched path.

Ids in, numbers out: tokenizing is the caller's job. Not here: tasks and their
accuracy (gptlab.eval.tasks), loss over shards (gptlab.eval.loss).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import NamedTuple

import torch
import torch.nn.functional as F

from gptlab.runtime import GptlabError

Request = tuple[Sequence[int], Sequence[int]]  # (context ids, continuation ids)


class Score(NamedTuple):
    logprob: float  # summed log p of the continuation tokens, in nats
    greedy: bool  # every continuation token is the argmax of the model's prediction


def count_truncated(requests: Sequence[Request], block_size: int) -> int:
    """How many requests lose context tokens on the left to fit in `block_size` (see the module docstring)."""
    return sum(len(context) + len(continuation) - 1 > block_size for context, continuation in requests)


def fit_request(context: Sequence[int], continuation: Sequence[int], block_size: int) -> list[int]:
    """The tokens that go into the model: context + continuation, cut on the left to block_size + 1."""
    if not continuation:
        raise GptlabError("a continuation is empty: there is nothing to score")
    if not context:
        raise GptlabError("a context is empty: the first continuation token needs a token before it (e.g. end-of-text)")
    if len(continuation) > block_size:
        raise GptlabError(f"a continuation of {len(continuation)} tokens does not fit in the model's context ({block_size})")
    return [*context, *continuation][-(block_size + 1) :]


@torch.no_grad()
def score_continuations(
    model, requests: Sequence[Request], batch_size: int = 32, device: torch.device | str | None = None, *, autocast=None
) -> list[Score]:
    """A Score per request, in request order: batched, one forward pass per `batch_size` rows."""
    if batch_size < 1:
        raise GptlabError(f"batch_size must be at least 1, got {batch_size}")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    block_size = model.config.block_size
    rows = [fit_request(context, continuation, block_size) for context, continuation in requests]
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]), reverse=True)
    scores: list[Score | None] = [None] * len(rows)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            chosen = order[start : start + batch_size]
            batch = [rows[i] for i in chosen]
            lengths = [len(requests[i][1]) for i in chosen]
            for i, score in zip(chosen, _score_batch(model, batch, lengths, device, autocast)):
                scores[i] = score
    finally:
        if was_training:
            model.train()
    return scores


def _score_batch(model, rows: list[list[int]], lengths: list[int], device: torch.device, autocast) -> list[Score]:
    """Score the last `lengths[b]` tokens of each row of `rows` in one forward pass."""
    B, T = len(rows), max(len(row) for row in rows) - 1
    idx = torch.zeros(B, T, dtype=torch.long)  # right-padded with id 0: never attended to by real positions
    targets = torch.zeros(B, T, dtype=torch.long)
    scored = torch.zeros(B, T, dtype=torch.bool)  # positions whose target is a continuation token
    for b, (row, length) in enumerate(zip(rows, lengths)):
        n = len(row) - 1
        idx[b, :n] = torch.tensor(row[:-1])
        targets[b, :n] = torch.tensor(row[1:])
        scored[b, n - length : n] = True
    idx, targets, scored = idx.to(device), targets.to(device), scored.to(device)
    model.check_ids(idx)
    model.check_ids(targets)
    with autocast or nullcontext():
        logits, _ = model(idx)  # (B, T, vocab_size)
    picked = logits[scored].float()  # (N, vocab_size): only the scored positions, in row order
    wanted = targets[scored]  # (N,)
    logprobs = F.log_softmax(picked, dim=-1).gather(1, wanted[:, None]).squeeze(1)
    row_of = scored.nonzero()[:, 0]  # (N,) the row of each scored position
    sums = torch.zeros(B, dtype=torch.float64, device=device).index_add_(0, row_of, logprobs.double())
    misses = torch.zeros(B, dtype=torch.long, device=device).index_add_(0, row_of, (picked.argmax(-1) != wanted).long())
    return [Score(float(total), bool(miss == 0)) for total, miss in zip(sums.tolist(), misses.tolist())]


def rolling_requests(ids: Sequence[int], block_size: int, *, prefix_token: int, stride: int | None = None) -> list[Request]:
    """Cut a document into requests that score every token once, each with as much context as fits.

    The document is read as [prefix_token] + ids; token i is scored given the
    tokens before it in its window. Windows predict `stride` tokens (default
    block_size) and their input is the block_size tokens before the window's
    end. With stride = block_size the windows are disjoint, exactly
    lm-eval's get_rolling_token_windows(context_len=1): the first token of a
    window sees 1 token of context, the last sees block_size. A smaller stride
    gives every token at least block_size - stride tokens of context, at
    block_size / stride times the compute.

        ids [a, b, c, d, e], prefix P, block_size 3:  ([P], [a, b, c]), ([b, c], [d, e])
    """
    stride = stride or block_size
    if not 1 <= stride <= block_size:
        raise GptlabError(f"stride must be in [1, block_size={block_size}], got {stride}")
    tokens = [prefix_token, *ids]
    requests = []
    for start in range(1, len(tokens), stride):  # tokens[start:end] are scored by this window
        end = min(start + stride, len(tokens))
        requests.append((tokens[max(0, end - 1 - block_size) : start], tokens[start:end]))
    return requests


def rolling_loglikelihood(
    model,
    ids: Sequence[int],
    *,
    prefix_token: int,
    stride: int | None = None,
    batch_size: int = 32,
    device: torch.device | str | None = None,
    autocast=None,
) -> float:
    """Sum over the document of log p(token_i | the tokens before it in its window), in nats (see rolling_requests)."""
    requests = rolling_requests(ids, model.config.block_size, prefix_token=prefix_token, stride=stride)
    return sum((score.logprob for score in score_continuations(model, requests, batch_size, device, autocast=autocast)), 0.0)
