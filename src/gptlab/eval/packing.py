"""Shared-prefix, packed log-likelihood scoring: the fast path beside gptlab.eval.scoring, proven equal to it.

A group is the (context ids, continuation ids) requests of one question. Multiple choice shares the context
(and sometimes the first continuation tokens); Winogrande shares the continuation, so its contexts share only
their first tokens. `score_groups` gives the same Scores as scoring.score_continuations on each group, but:

1. The longest common prefix of a group's input tokens goes into a row once; each request's remainder
   follows it as a branch that sees the prefix and its own earlier tokens, at the positions it would have
   alone (so learned positions and RoPE see the same numbers):

       context [5, 9, 4], continuations [2, 7] and [3]:  inputs [5 9 4 2] and [5 9 4]
       packed unit  tokens    5 9 4 2       prefix 5 9 4, branch 1 = [2], branch 2 = []
                    positions 0 1 2 3
       request 1 reads its logits at 2 (-> 2) and 3 (-> 7); request 2 at 2 (-> 3), inside the prefix.

2. Units from many groups are packed into rows of up to block_size tokens (best-fit, largest first), with a
   block-diagonal mask so no unit sees another, and `batch_size` rows go through one forward pass. Pads form a
   unit of their own (they attend to themselves, so no query row is fully masked and no NaN appears).
3. Only the scored positions reach the output layer and log_softmax: the head over every position is the
   costly part of a forward pass on a CPU, and its (B, T, vocab) logits the largest tensor.

A request longer than the model's context is cut on the left exactly as scoring.fit_request cuts it, and a group
whose packed form does not fit in one row is split into its requests, each packed alone: results never change.
`plan_rows` shows the layout (the tests count its tokens). Ids in, numbers out. Not here: tasks and their
accuracy (gptlab.eval.tasks), the readable one-request-per-row reference (gptlab.eval.scoring).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gptlab.eval.scoring import Request, Score, fit_request
from gptlab.runtime import GptlabError


@dataclass(frozen=True)
class PackedUnit:
    """One group (or one request of a group too long to pack) as laid out in a row.

    tokens/positions/branches are parallel: branch 0 is the shared prefix, branch k the remainder of the
    unit's k-th request. For request k: `keys[k]` = (group index, request index in the group), `reads[k]`
    the unit indices whose logits predict its continuation, `targets[k]` those continuation tokens."""

    tokens: list[int]
    positions: list[int]
    branches: list[int]
    keys: list[tuple[int, int]]
    reads: list[list[int]]
    targets: list[list[int]]


def _common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every sequence shares: [[1, 2, 3], [1, 2, 4], [1, 2]] -> 2."""
    first, length = sequences[0], min(len(sequence) for sequence in sequences)
    for other in sequences[1:]:
        shared = 0
        while shared < length and other[shared] == first[shared]:
            shared += 1
        length = shared
    return length


def _pack_unit(fitted: list[list[int]], continuation_lengths: list[int], keys: list[tuple[int, int]]) -> PackedUnit:
    """Lay out requests already cut to fit (context + continuation tokens): their shared prefix once, then branches."""
    inputs = [sequence[:-1] for sequence in fitted]  # the last token is only a target
    shared = _common_prefix_length(inputs)
    tokens, positions, branches = list(inputs[0][:shared]), list(range(shared)), [0] * shared
    reads, targets = [], []
    for branch, (sequence, source, length) in enumerate(zip(fitted, inputs, continuation_lengths), start=1):
        start = len(tokens)  # input position j >= shared sits at start + j - shared
        tokens += source[shared:]
        positions += range(shared, len(source))
        branches += [branch] * (len(source) - shared)
        first = len(source) - length  # the input position that predicts the first continuation token
        reads.append([j if j < shared else start + j - shared for j in range(first, len(source))])
        targets.append(sequence[first + 1 :])
    return PackedUnit(tokens, positions, branches, keys, reads, targets)


def plan_units(groups: Sequence[Sequence[Request]], block_size: int) -> list[PackedUnit]:
    """A unit per group, or a unit per request for a group whose packed form is longer than block_size."""
    units = []
    for g, group in enumerate(groups):
        if not group:
            continue
        fitted = [fit_request(context, continuation, block_size) for context, continuation in group]
        lengths = [len(continuation) for _, continuation in group]
        unit = _pack_unit(fitted, lengths, [(g, r) for r in range(len(group))])
        if len(unit.tokens) <= block_size:
            units.append(unit)
        else:  # each request alone is at most block_size inputs (fit_request), so this always fits
            units += [_pack_unit([sequence], [length], [(g, r)]) for r, (sequence, length) in enumerate(zip(fitted, lengths))]
    return units


def plan_rows(groups: Sequence[Sequence[Request]], block_size: int) -> list[list[PackedUnit]]:
    """The packed layout: rows of units, each row at most block_size tokens, longest rows first.

    Best-fit decreasing (the bin-packing heuristic; first-fit decreasing's sibling with the same 11/9
    bound): units largest first, each into the row it leaves least room in, found by bisect, so planning
    stays O(n log n) for a whole benchmark."""
    units = sorted(plan_units(groups, block_size), key=lambda unit: len(unit.tokens), reverse=True)
    rows: list[list[PackedUnit]] = []
    room: list[tuple[int, int]] = []  # (free tokens, row index), sorted
    for unit in units:
        size = len(unit.tokens)
        at = bisect.bisect_left(room, (size, -1))
        if at == len(room):
            rows.append([unit])
            free, row = block_size - size, len(rows) - 1
        else:
            free, row = room.pop(at)
            rows[row].append(unit)
            free -= size
        bisect.insort(room, (free, row))
    return sorted(rows, key=lambda row: sum(len(unit.tokens) for unit in row), reverse=True)


@torch.no_grad()
def score_groups(
    model, groups: Sequence[Sequence[Request]], *, batch_size: int = 32, device: torch.device | str | None = None, autocast=None
) -> list[list[Score]]:
    """[score_continuations(model, group) for group in groups], with shared prefixes computed once and rows packed.

    `batch_size` counts rows of up to block_size tokens per forward pass (each holding many requests)."""
    if batch_size < 1:
        raise GptlabError(f"batch_size must be at least 1, got {batch_size}")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    rows = plan_rows(groups, model.config.block_size)
    scores: list[list[Score | None]] = [[None] * len(group) for group in groups]
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(rows), batch_size):
            for (g, r), score in _score_rows(model, rows[start : start + batch_size], device, autocast):
                scores[g][r] = score
    finally:
        if was_training:
            model.train()
    return scores


def _row_tensors(rows: list[list[PackedUnit]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """idx (B, T), positions (B, T) and the attention mask (B, 1, T, T), True = may attend.

    A query sees a key of its own unit, at its position or before, in the prefix or its own branch.
    Pads (id 0, position 0) are unit -1: they see only one another, never a real token, nor it them."""
    T = max(sum(len(unit.tokens) for unit in row) for row in rows)
    idx, positions, branches = (torch.zeros(len(rows), T, dtype=torch.long) for _ in range(3))
    units = torch.full((len(rows), T), -1, dtype=torch.long)
    for b, row in enumerate(rows):
        flat_tokens, flat_positions, flat_branches, flat_units = [], [], [], []
        for u, unit in enumerate(row):
            flat_tokens += unit.tokens
            flat_positions += unit.positions
            flat_branches += unit.branches
            flat_units += [u] * len(unit.tokens)
        n = len(flat_tokens)
        idx[b, :n], positions[b, :n] = torch.tensor(flat_tokens), torch.tensor(flat_positions)
        branches[b, :n], units[b, :n] = torch.tensor(flat_branches), torch.tensor(flat_units)
    same_unit = units[:, :, None] == units[:, None, :]  # (B, T query, T key)
    earlier = positions[:, None, :] <= positions[:, :, None]
    visible_branch = (branches[:, None, :] == 0) | (branches[:, None, :] == branches[:, :, None])
    return idx, positions, (same_unit & earlier & visible_branch)[:, None]


def _reads(rows: list[list[PackedUnit]]) -> tuple[list[tuple[int, int]], list[int], list[int], list[int], list[int]]:
    """Per request: its key; per scored token: its row, column, target, and the index of its request."""
    keys, row_of, column_of, targets, request_of = [], [], [], [], []
    for b, row in enumerate(rows):
        offset = 0
        for unit in row:
            for key, reads, wanted in zip(unit.keys, unit.reads, unit.targets):
                request_of += [len(keys)] * len(reads)
                keys.append(key)
                row_of += [b] * len(reads)
                column_of += [offset + read for read in reads]
                targets += wanted
            offset += len(unit.tokens)
    return keys, row_of, column_of, targets, request_of


@contextmanager
def _head_only_at(model, rows: torch.Tensor, columns: torch.Tensor):
    """While open, model.lm_head sees only the hidden states at (rows, columns), as a (1, N, n_embd) batch;
    yields a list that holds True once the hook has run.

    GPT.forward applies the head to every position; narrowing its input with a pre-hook keeps the model code
    in one place (the head, the vocab cut and the softcap all still run in GPT.forward)."""
    ran: list[bool] = []

    def select(module, args):
        ran.append(True)
        return (args[0][rows, columns].unsqueeze(0), *args[1:])

    handle = model.lm_head.register_forward_pre_hook(select)
    try:
        yield ran
    finally:
        handle.remove()


def _score_rows(model, rows: list[list[PackedUnit]], device: torch.device, autocast) -> list[tuple[tuple[int, int], Score]]:
    """One forward pass over `rows`: the (group, request) key and Score of every request in them."""
    idx, positions, mask = (tensor.to(device) for tensor in _row_tensors(rows))
    keys, row_of, column_of, wanted, request_of = _reads(rows)
    row_of, column_of, wanted, request_of = (torch.tensor(values, device=device) for values in (row_of, column_of, wanted, request_of))
    model.check_ids(idx)
    model.check_ids(wanted)
    with autocast or nullcontext(), _head_only_at(model, row_of, column_of) as narrowed:
        logits, _ = model(idx, positions=positions, mask=mask)
    # (1, N, vocab_size); without the hook (a compiled model may not call new hooks) all of (B, T, vocab_size), picked here
    picked = (logits[0] if narrowed else logits[row_of, column_of]).float()  # (N, vocab_size): the scored positions only
    logprobs = F.log_softmax(picked, dim=-1).gather(1, wanted[:, None]).squeeze(1)
    sums = torch.zeros(len(keys), dtype=torch.float64, device=device).index_add_(0, request_of, logprobs.double())
    misses = torch.zeros(len(keys), dtype=torch.long, device=device).index_add_(0, request_of, (picked.argmax(-1) != wanted).long())
    return [(key, Score(float(total), bool(miss == 0))) for key, total, miss in zip(keys, sums.tolist(), misses.tolist())]
