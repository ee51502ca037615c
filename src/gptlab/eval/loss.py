"""Validation loss and bits per byte.

Loss is the mean cross-entropy in nats per token, which depends on the
tokenizer. Bits per byte does not: the summed loss over the evaluated target
tokens, converted to bits, divided by the UTF-8 bytes those tokens stand for
(`token_bytes.npy` from `gptlab data prepare`; special tokens count 0 bytes
and are left out of both sums, as in nanochat's evaluate_bpb).

    bpb = sum(loss_i over non-special targets) / (ln 2 * sum(bytes(target_i)))

Under DDP every rank evaluates its own batches and the sums are all-reduced. A batch goes through the
model a few rows at a time, so that its float32 logits (rows x T x vocab) stay under LOGIT_BYTES: training's
fused loss never holds them whole, and a micro-batch that trains (one an out-of-memory back-off chose) must
evaluate too. Rows are independent, so the sums are the same.
Not here: the loader (gptlab.data.loader), the model (gptlab.model).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from gptlab.data.shards import read_manifest
from gptlab.runtime import GptlabError

LOGIT_BYTES = 256 << 20  # float32 logits held at once while evaluating


def load_token_bytes(directory: str | Path, device: torch.device | str = "cpu") -> torch.Tensor:
    manifest = read_manifest(directory)
    path = Path(directory) / manifest.get("token_bytes", "token_bytes.npy")
    if not path.is_file():
        raise GptlabError(f"{path} is missing: rerun `gptlab data prepare` to compute bits per byte")
    return torch.from_numpy(np.load(path).astype(np.int64)).to(device)


@torch.no_grad()
def evaluate_loss(model, loader, n_batches: int, token_bytes: torch.Tensor | None = None, autocast=None,
                  progress: bool = False) -> dict:
    """Mean loss (nats/token) and bits per byte over `n_batches` batches of `loader` (`progress`: a bar with an ETA),
    or all it has when it runs out first."""
    was_training = model.training
    model.eval()
    device = token_bytes.device if token_bytes is not None else torch.device("cpu")
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss sum, tokens, bpb loss sum, bytes
    for _ in tqdm(range(n_batches), desc="eval", unit="batch", disable=None if progress else True):
        try:
            x, y, *extra = loader.next_batch()  # (x, y) or (x, y, model kwargs); targets of -100 do not count
        except StopIteration:  # a loader that serves one pass (held-out conversations) may hold fewer batches
            break
        kwargs = extra[0] if extra else {}
        vocab = getattr(getattr(model, "config", None), "vocab_size", 0)  # a wrapped model: its rows all at once
        rows = max(1, LOGIT_BYTES // (4 * x.shape[1] * vocab)) if vocab else x.shape[0]
        for start in range(0, x.shape[0], rows):
            part = {key: value[start : start + rows] if torch.is_tensor(value) and value.shape[:1] == x.shape[:1] else value
                    for key, value in kwargs.items()}
            with autocast or nullcontext():
                logits, _ = model(x[start : start + rows], **part)
            _add_losses(sums, logits, y[start : start + rows], token_bytes)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(sums)
    if was_training:
        model.train()
    loss = (sums[0] / sums[1]).item() if sums[1] > 0 else float("nan")
    bpb = (sums[2] / (math.log(2) * sums[3])).item() if token_bytes is not None and sums[3] > 0 else float("nan")
    return {"loss": loss, "bpb": bpb, "tokens": int(sums[1].item())}


def _add_losses(sums: torch.Tensor, logits: torch.Tensor, y: torch.Tensor, token_bytes: torch.Tensor | None) -> None:
    """Add the rows' summed loss and counted targets (and, with token_bytes, their bpb sums) to `sums`."""
    losses = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1), reduction="none")
    counted = y.reshape(-1) != -100
    sums[0] += losses.sum().double()  # ignored targets give 0
    sums[1] += counted.sum()
    if token_bytes is not None:
        nbytes = token_bytes[y.reshape(-1).clamp(min=0)] * counted
        counted = nbytes > 0
        sums[2] += losses[counted].sum().double()
        sums[3] += nbytes.sum().double()


def evaluate_split(model, directory: str | Path, split: str = "val", *, batch_size: int, seq_len: int, autocast=None,
                   progress: bool = False) -> dict:
    """Loss and bits per byte over every full (B, T) window of a split, shard by shard, in order."""
    from gptlab.data.loader import LoaderConfig, ShardLoader
    from gptlab.data.shards import split_shards

    device = next(model.parameters()).device
    loader = ShardLoader(directory, split, config=LoaderConfig(batch_size=batch_size, seq_len=seq_len), device=device)
    # A batch needs B*T + 1 tokens (the last target), so a shard serves (tokens - 1) // (B*T) batches.
    n_batches = sum((tokens - 1) // (batch_size * seq_len) for _, tokens in split_shards(directory, split))
    if n_batches < 1:
        raise GptlabError(f"the {split!r} split of {directory} holds less than one batch of {batch_size} x {seq_len} tokens")
    return evaluate_loss(model, loader, n_batches, load_token_bytes(directory, device), autocast, progress)
