"""Runs that fit the machine: the memory at hand, the micro-batch chosen from it, and the next smaller one.

`micro_batch = 0` (auto) asks the Trainer for the largest micro-batch B that divides the sequences
each rank trains on per step (batch_tokens / (seq_len × world)) and whose estimated training memory
fits in SAFETY × the free memory:

    training_memory(model, B, seq_len)["total"] <= SAFETY × free
    free: torch.cuda.mem_get_info on CUDA (what other processes left too), MemAvailable (/proc/meminfo) on CPU

The estimate (gptlab.model.accounting: parameters, gradients, AdamW moments, activations, autocast
copies, logits and their gradients, or the fused loss's chunk and gradients) leaves out the allocator's slack and the CUDA context's
workspaces; the 15% margin is for those. When a step still runs out of memory, the Trainer retries
it at `smaller_micro_batch(B)`: half of B (the largest proper divisor when B is odd), which divides
the step's sequences whenever B did, so the optimizer's batch never changes.

Not here: the retry itself and the loader's re-batching (gptlab.train.micro_batch, gptlab.data.loader).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from gptlab.model import ModelConfig
from gptlab.model.accounting import training_memory
from gptlab.runtime import GptlabError

SAFETY = 0.85  # the share of the free memory a micro-batch's estimate may take
CGROUP = Path("/sys/fs/cgroup")  # a container's memory limit (cgroup v2)
GIB = 2**30


def free_memory(device: torch.device) -> int:
    """Bytes this process may still allocate on `device`: CUDA's free memory, or the host's available RAM
    (within a container's cgroup limit, which /proc/meminfo does not show)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "mps":
        return int(torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory())
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024  # the file says kB and means KiB
                room = cgroup_room()
                return available if room is None else min(available, room)
    except OSError:
        pass
    raise GptlabError(f"cannot tell how much memory is free on {device} here (no /proc/meminfo); "
                      "pass --micro-batch N instead of 0 (auto)")


def micro_batch_memory(model: ModelConfig, micro_batch: int, seq_len: int, *, precision: str, device: torch.device,
                       activation_checkpointing: bool = False, fused_loss: bool = True) -> int:
    """Estimated bytes of one training step at this micro-batch: fp32 weights, AdamW, autocast at `precision`,
    the loss fused (the Trainer's default, TrainConfig.fused_loss) or plain, blocks recomputed or not.

    Attention keeps no T x T scores where SDPA runs a flash kernel: always on CUDA; on CPU only
    without dropout (with dropout it falls back to the math kernel). attention "flash" and "triton" (no dropout)
    keep none either; "math", the spelled-out reference, keeps them.
    """
    flash = model.attention != "math" and (device.type == "cuda" or model.dropout == 0)
    return training_memory(model, micro_batch, seq_len, param_dtype="fp32", amp=precision, optimizer="adamw",
                           flash_attention=flash, activation_checkpointing=activation_checkpointing, fused_loss=fused_loss)["total"]


def cgroup_room(root: Path = CGROUP) -> int | None:
    """Bytes left under this cgroup's memory limit (cgroup v2: memory.max - memory.current); None without one."""
    try:
        limit = (root / "memory.max").read_text().strip()
        used = int((root / "memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(int(limit) - used, 0)


@dataclass(frozen=True)
class MicroBatchChoice:
    micro_batch: int
    estimate: int  # bytes one training step at this micro-batch needs (estimated)
    free: int  # bytes free when it was chosen
    accumulation: int  # micro-steps per optimizer step

    def describe(self) -> str:
        return (f"micro-batch auto: {self.micro_batch} (estimated {self.estimate / GIB:.1f} GiB of "
                f"{self.free / GIB:.1f} GiB free; {self.accumulation} accumulation steps)")


def choose_micro_batch(model: ModelConfig, sequences: int, seq_len: int, *, free: int, precision: str,
                       device: torch.device, activation_checkpointing: bool = False, fused_loss: bool = True) -> MicroBatchChoice:
    """The largest divisor of `sequences` (per rank and step) whose estimate fits SAFETY × free."""
    budget = SAFETY * free
    for micro_batch in sorted((d for d in range(1, sequences + 1) if sequences % d == 0), reverse=True):
        estimate = micro_batch_memory(model, micro_batch, seq_len, precision=precision, device=device,
                                      activation_checkpointing=activation_checkpointing, fused_loss=fused_loss)
        if estimate <= budget:
            return MicroBatchChoice(micro_batch, estimate, free, sequences // micro_batch)
    raise GptlabError(
        f"the model does not fit: one sequence of {seq_len} tokens needs an estimated {estimate / GIB:.2f} GiB "
        f"to train, and {free / GIB:.2f} GiB are free on {device} ({SAFETY:.0%} usable); "
        "use a smaller model (--model.n-layer, --model.n-embd), a shorter --seq-len, or --precision bf16"
    )


def smaller_micro_batch(micro_batch: int) -> int:
    """The largest proper divisor: half when even (16 -> 8), 9 -> 3, a prime -> 1; 0 below 1 sequence."""
    for divisor in range(2, micro_batch + 1):
        if micro_batch % divisor == 0:
            return micro_batch // divisor
    return 0


def out_of_memory_error(micro_batch: int, seq_len: int) -> GptlabError:
    """What ends a run out of memory, with what to change."""
    if micro_batch == 1:
        return GptlabError(f"out of memory with micro_batch 1 x seq_len {seq_len}: one sequence does not fit; use a "
                           "shorter --seq-len, a smaller model (--model.n-layer, --model.n-embd) or --precision bf16")
    return GptlabError(f"out of memory with micro_batch {micro_batch} x seq_len {seq_len}: try --micro-batch "
                       f"{smaller_micro_batch(micro_batch)} (the step's batch stays the same; accumulation grows)")
