"""Measuring a training step on this machine: its speed, the device's own matmul peak, and its peak memory.

`gptlab model info --measure` prints these beside the paper arithmetic of gptlab.model.accounting:

    tokens/s     B x T / seconds per step, timed over `steps` steps after `warmup` steps: the Trainer's
                 step (autocast forward with the loss, backward, clip to norm 1, AdamW, zero_grad, the
                 loss read back) on random ids, without data loading, evaluation or logging; the loss fused
                 or plain and the blocks recomputed or not as the Trainer's options say
    achieved     training FLOPs per token (6N + 12 L d T, flops_per_token) x tokens/s
    peak         this device's matmul peak: square n x n matmuls at the autocast dtype, 2 n^3 FLOPs each,
                 n the MLP's width rounded up to 256 (at least 1024; at most 8192 on CUDA, 2048 on CPU)
    MFU          achieved / peak: the share of what this device multiplies that the step uses
    peak memory  the most bytes allocated at once over the warm-up steps, from before the model is built:
                 CUDA: torch.cuda.max_memory_allocated; elsewhere: LiveTensorBytes, the storages of every
                 tensor an op made, counted until they are freed. Neither counts the allocator's slack.

The weights are random: a step's time and memory do not depend on their values.
Not here: the paper arithmetic (gptlab.model.accounting), the Trainer (gptlab.train.trainer).
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from gptlab.model import GPT, ModelConfig
from gptlab.model.accounting import flops_per_token
from gptlab.runtime import GptlabError
from gptlab.runtime.device import autocast
from gptlab.train.fit import micro_batch_memory
from gptlab.train.optim import OptimizerConfig, build_optimizer

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class TrainingMeasurement:
    device: str
    precision: str
    batch_size: int
    seq_len: int
    steps: int  # timed steps (after the warm-up)
    seconds_per_step: float
    tokens_per_second: float
    flops_per_token: int  # training FLOPs per token (6N + 12 L d T)
    achieved_flops: float  # FLOP/s: flops_per_token x tokens_per_second
    peak_flops: float  # FLOP/s of this device's n x n matmuls at the autocast dtype
    matmul_size: int  # n
    mfu: float  # achieved_flops / peak_flops
    peak_memory: int  # bytes, see memory_kind
    memory_kind: str  # what peak_memory counts
    estimated_memory: int  # bytes, training_memory's total for the same step (gptlab.train.fit.micro_batch_memory)


class LiveTensorBytes(TorchDispatchMode):
    """The most bytes of tensor storage alive at once on one device type, while the mode is on.

    Every op's outputs are seen; a storage counts from the first op that returns it (views and
    in-place results share their input's) until it is freed. This is what a caching allocator's
    max_memory_allocated counts, without rounding blocks up.
    """

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()
        self.device_type, self.live, self.peak = device_type, 0, 0
        self._seen = WeakIdKeyDictionary()

    def _freed(self, nbytes: int) -> None:
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor) or tensor.device.type != self.device_type:
                continue
            storage = tensor.untyped_storage()
            if storage in self._seen:
                continue
            self._seen[storage] = nbytes = storage.nbytes()
            weakref.finalize(storage, self._freed, nbytes)
            self.live += nbytes
            self.peak = max(self.peak, self.live)
        return out


def matmul_size(config: ModelConfig, device: torch.device) -> int:
    """The peak benchmark's n: the MLP's width rounded up to 256, within [1024, 8192 on CUDA or 2048]."""
    largest = 8192 if device.type == "cuda" else 2048
    return min(largest, max(1024, -(-config.hidden_dim // 256) * 256))


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work. CUDA kernels launch asynchronously: without this, a clock read after
    a call measures the launch, not the work (and the next call's wait lands in the wrong phase)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_matmul_peak(device: torch.device, precision: str, size: int, seconds: float = 0.25) -> float:
    """FLOP/s of size x size matmuls at the precision's dtype: at least 3 after 2 warm-up, for `seconds`.

    Through F.linear, as nn.Linear runs them: on a CPU without native bf16, torch.mm in bf16 takes a
    path ten times slower than the oneDNN one F.linear takes, which would make the MFU exceed 1.
    """
    a = torch.randn(size, size, device=device, dtype=DTYPES[precision])
    b = torch.randn_like(a)
    per_check = 10 if device.type == "cuda" else 1  # a GPU matmul is too short to time one by one
    for _ in range(2):
        F.linear(a, b)
    synchronize(device)
    done, start = 0, time.perf_counter()
    while done < 3 or time.perf_counter() - start < seconds:
        for _ in range(per_check):
            F.linear(a, b)
        synchronize(device)
        done += per_check
    return 2 * size**3 * done / (time.perf_counter() - start)


def _training_step(config: ModelConfig, batch_size: int, seq_len: int, precision: str, device: torch.device,
                   fused_loss: bool = True, activation_checkpointing: bool = False) -> Callable[[], float]:
    """A model, its AdamW and a batch of random ids on the device, and the Trainer's step over them."""
    model = GPT(config).to(device).train().set_activation_checkpointing(activation_checkpointing)
    optimizer = build_optimizer(model, OptimizerConfig(), device.type)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    x, y = torch.randint(0, config.vocab_size, (2, batch_size, seq_len), device=device)
    cast = autocast(device, precision)

    def step() -> float:
        with cast:
            loss = model(x, y, fused_loss=fused_loss)[1]  # plain: the logits are not kept, the Trainer drops them too
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()  # the Trainer reads the loss back every step too

    return step


def warm_up_measuring_memory(build: Callable[[], Callable[[], Any]], device: torch.device,
                             warmup: int) -> tuple[Callable[[], Any], int, str]:
    """Build and run the warm-up steps, tracking peak memory from before the build (see the module docstring)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step = build()
        for _ in range(warmup):
            step()
        return step, torch.cuda.max_memory_allocated(device) - before, "torch.cuda.max_memory_allocated"
    with LiveTensorBytes(device.type) as live:
        step = build()
        for _ in range(warmup):
            step()
    return step, live.peak, "peak live tensor bytes"


def measure_training(config: ModelConfig, *, batch_size: int, seq_len: int, precision: str, device: torch.device,
                     steps: int = 5, warmup: int = 2, fused_loss: bool = True,
                     activation_checkpointing: bool = False) -> TrainingMeasurement:
    """Time the Trainer's step for this model on `device` and measure its peak memory (see the module docstring).

    Two warm-up steps at least: AdamW makes its moments in the first, so the second is the steady peak.
    """
    if precision not in DTYPES:
        raise GptlabError(f"precision must be one of {', '.join(DTYPES)} here, got {precision!r}")
    if steps < 1 or warmup < 2:
        raise GptlabError(f"measuring needs at least 1 timed step and 2 warm-up steps, got {steps} and {warmup}")
    if seq_len > config.block_size:
        raise GptlabError(f"seq_len {seq_len} is longer than the model's context ({config.block_size})")
    torch.manual_seed(0)
    step, peak_memory, memory_kind = warm_up_measuring_memory(
        lambda: _training_step(config, batch_size, seq_len, precision, device, fused_loss, activation_checkpointing), device, warmup)
    synchronize(device)
    start = time.perf_counter()
    losses = [step() for _ in range(steps)]
    seconds = (time.perf_counter() - start) / steps
    if not all(map(math.isfinite, losses)):
        raise GptlabError(f"the measured steps gave a loss of {losses}; try --precision fp32")
    size = matmul_size(config, device)
    peak = measure_matmul_peak(device, precision, size)
    flops = flops_per_token(config, seq_len)["training"]
    tokens_per_second = batch_size * seq_len / seconds
    return TrainingMeasurement(
        device=str(device), precision=precision, batch_size=batch_size, seq_len=seq_len, steps=steps,
        seconds_per_step=seconds, tokens_per_second=tokens_per_second, flops_per_token=flops,
        achieved_flops=flops * tokens_per_second, peak_flops=peak, matmul_size=size,
        mfu=flops * tokens_per_second / peak, peak_memory=peak_memory, memory_kind=memory_kind,
        estimated_memory=micro_batch_memory(config, batch_size, seq_len, precision=precision, device=device,
                                            activation_checkpointing=activation_checkpointing, fused_loss=fused_loss),
    )
