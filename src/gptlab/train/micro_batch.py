"""The Trainer's micro-batch: chosen to fit the memory, kept across a resume, made smaller when CUDA runs out.

micro_batch 0 is resolved before anything is built to the largest micro-batch that fits the free memory
(every rank the same: the tightest rank decides). A step that runs out of CUDA memory in its micro-steps is
retried at a smaller micro-batch from the same loader position and random state (accumulation grows; the
step's batch does not), as if the run had started there. Checkpoints record the micro-batch in use, and a
resumed run keeps it. Under torchrun a step cannot be retried (the other ranks wait in all-reduce): running
out of memory there ends the run with the fix in its message.

The Trainer (gptlab.train.trainer) mixes this in. Not here: the memory arithmetic and the choice of size
(gptlab.train.fit), re-batching the loader (gptlab.data.loader).
"""

from __future__ import annotations

import dataclasses
import gc
import json
from pathlib import Path

import torch

from gptlab.runtime import atomic_write_text
from gptlab.runtime.device import rng_state, set_rng_state
from gptlab.train.config import TrainConfig
from gptlab.train.fit import choose_micro_batch, free_memory, out_of_memory_error, smaller_micro_batch


class MicroBatchMixin:
    """The Trainer's micro-batch (module docstring); it uses the Trainer's config, runtime, loaders and optimizer."""

    def _fit_micro_batch(self, config: TrainConfig) -> TrainConfig:
        """micro_batch 0 (auto): the largest that divides the step's sequences and fits the free memory."""
        if config.micro_batch:
            return config
        device = self.runtime.device
        free = free_memory(device)
        if self.runtime.distributed:  # every rank must choose the same: the tightest one decides
            least = torch.tensor([free], dtype=torch.int64, device=device)
            torch.distributed.all_reduce(least, op=torch.distributed.ReduceOp.MIN)
            free = int(least.item())
        choice = choose_micro_batch(config.model, config.sequences_per_rank(self.runtime.world_size), config.seq_len,
                                    free=free, precision=self.precision, device=device,
                                    activation_checkpointing=config.activation_checkpointing,
                                    fused_loss=config.fused_loss and not config.compile)
        self.fit_note = choice.describe()
        return dataclasses.replace(config, micro_batch=choice.micro_batch)

    def _adopt_micro_batch(self, saved: dict) -> None:
        """Resume at the checkpoint's micro-batch (auto's pick there, or where a backoff left it): the saved
        loader state counts batches of that size, and the same batches keep the run the same computation."""
        micro_batch = saved.get("config", {}).get("micro_batch")
        if not micro_batch or micro_batch == self.config.micro_batch:
            return
        self.fit_note = (f"micro-batch {micro_batch} as in the checkpoint (not {self.config.micro_batch}): "
                         "a resumed run keeps its batches")
        self._set_micro_batch(micro_batch)
        self.train_loader = self._loader("train")

    def _set_micro_batch(self, micro_batch: int) -> None:
        """A new micro-batch for the run from here: accumulation, val batches and the saved config follow."""
        self.config = dataclasses.replace(self.config, micro_batch=micro_batch)
        self.accum = self.config.accumulation_steps(self.runtime.world_size)
        if self.val_loader is not None:
            self.val_loader = self._loader("val")
        if self.runtime.is_main:
            atomic_write_text(Path(self.config.out) / "train_config.json", json.dumps(dataclasses.asdict(self.config), indent=1) + "\n")

    def _accumulate(self) -> torch.Tensor:
        """The step's micro-steps; after CUDA runs out of memory, the same step again at a smaller micro-batch,
        from the same place in the data and the same random state: as if the run had started at that size."""
        while True:
            before = (self.train_loader.state_dict(), rng_state()) if self._can_back_off() else None
            try:
                return self._micro_steps()
            except torch.OutOfMemoryError:
                pass  # recovered below, outside the handler, whose traceback holds the failed pass's tensors
            self._back_off(before)

    def _can_back_off(self) -> bool:
        """Ranks under torchrun cannot retry together (the others wait in all-reduce), and the loader must re-batch."""
        return not self.runtime.distributed and hasattr(self.train_loader, "rebatch")

    def _back_off(self, before: tuple[dict, dict] | None) -> None:
        """Free the failed pass, then the next smaller micro-batch: accumulation grows, the step's batch stays."""
        smaller = smaller_micro_batch(self.config.micro_batch)
        if before is None or not smaller:
            raise out_of_memory_error(self.config.micro_batch, self.config.seq_len)
        self.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if self.runtime.device.type == "cuda":
            torch.cuda.empty_cache()
        loader_state, rngs = before
        self.train_loader.load_state_dict(loader_state)
        self.train_loader.rebatch(smaller)
        set_rng_state(rngs)
        larger = self.config.micro_batch
        self._set_micro_batch(smaller)
        self.print(f"out of memory at micro-batch {larger} (step {self.state.step}): retrying the step at micro-batch "
                   f"{smaller} x {self.accum} accumulation steps, the same batch")
