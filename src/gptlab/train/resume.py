"""Checkpoints from the Trainer's side: what a step saves, and how a run resumes from one.

Resume is exact: a checkpoint holds weights, optimizer and GradScaler state,
the step, every rank's loader position and RNG states, so N steps straight
equal k steps + resume + N - k steps, loss for loss. A run resumes only with the model, batch, data and seed
it was saved with. Metrics, samples and checkpoint records logged after the checkpoint a run resumes from are
dropped, so logs and plots never mix runs. Under FSDP or expert parallelism the weights and optimizer state are
gathered whole to save, and every rank reads the whole checkpoint back and keeps its shards: the files are the
unsharded format, so a run may resume with or without sharding.

The Trainer (gptlab.train.trainer) mixes this in: `_restore` before the loop, `_save` at checkpoints and at the end.
Not here: the files themselves, pruning and the best checkpoint (gptlab.train.checkpoint).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gptlab.load.checkpoints import checkpoint_dir
from gptlab.model import GPT
from gptlab.parallel.expert import gather_expert_weights, is_expert_parallel, load_whole_state
from gptlab.parallel.fsdp import full_model_state, load_full_state
from gptlab.parallel.wrap import full_optimizer_state, is_fsdp
from gptlab.runs import truncate_samples
from gptlab.runtime import GptlabError
from gptlab.runtime.config import config_changes, field_defaults
from gptlab.runtime.device import rng_state
from gptlab.train.checkpoint import forget_after, load_checkpoint, prune, record_best, save_checkpoint
from gptlab.train.schedule import learning_rate


@dataclass
class TrainState:
    """Where the run stands: what a checkpoint saves (with the loader and RNG states) and a resume restores."""

    step: int = 0
    tokens: int = 0
    best_val: float | None = None
    elapsed_before: float = 0.0  # seconds trained by earlier processes of this run
    finished: bool = False
    losses: list[float] = field(default_factory=list)  # this process's steps
    val: dict | None = None  # the latest evaluation


class ResumeMixin:
    """The Trainer's checkpoint glue (module docstring); it uses the Trainer's config, runtime, model, optimizer and loaders."""

    def _restore(self, path: Path | None) -> TrainState:
        """The state to start from: a checkpoint's (loading weights, optimizer, scaler, loader, RNGs), or step 0."""
        state = TrainState()
        if path is not None:
            saved = self._load(path)
            self._check_same_run(saved)
            self._adopt_micro_batch(saved)
            state = TrainState(step=saved["step"], tokens=saved["tokens"], best_val=saved.get("best_val_loss"),
                               elapsed_before=saved.get("elapsed", 0.0), finished=saved.get("finished", False))
            self.train_loader.load_state_dict(saved["loader"][self.runtime.rank])
            self.print(f"resumed from {path} at step {state.step}")
            self._note_extension(saved, state.step)
        if self.runtime.is_main:
            self.metrics.truncate_after(state.step)
            truncate_samples(self.config.out, state.step)
            forget_after(self.config.out, state.step)
        return state

    def _note_extension(self, saved: dict, step: int) -> None:
        """Say what --extend does to the learning rate: from here it follows the longer run's schedule."""
        before = saved.get("config", {}).get("max_steps")
        if not self.extend or before == self.config.max_steps:
            return
        config = self.config
        lr = learning_rate(step, config.optimizer.lr, config.max_steps, config.schedule)
        self.print(f"extending the run from {before} to {config.max_steps} steps: from step {step} the learning rate follows "
                   f"the {config.max_steps}-step schedule ({config.schedule.kind}), starting at {lr:.2e}")

    def _save(self, val_loss: float | None) -> Path | None:
        """A checkpoint of this step (rank 0 writes; every rank contributes its loader and RNG state)."""
        config, state = self.config, self.state
        trainer_state = {
            "step": state.step, "tokens": state.tokens, "loader": self._gather(self.train_loader.state_dict()),
            "best_val_loss": state.best_val, "elapsed": self._elapsed(),
            "finished": state.finished, "data": str(config.data), "tokenizer_fingerprint": self.fingerprint,
            "config": dataclasses.asdict(config),
        }
        rngs = self._gather(rng_state())
        model, optimizer = self._whole_model(), full_optimizer_state(self.optimizer, self.model)  # collectives when sharded
        if not self.runtime.is_main:
            return None
        path = checkpoint_dir(config.out) / f"step_{state.step:06d}"
        save_checkpoint(path, model, optimizer, state=trainer_state, scaler=self.scaler, rng_states=rngs, attach=self._attach)
        record_best(config.out, path, val_loss)
        prune(config.out, config.keep_last, keep=path)
        return path

    def _attach(self, folder: Path) -> None:
        """More files for a checkpoint before it is sealed: the tokenizer (subclasses add theirs, e.g. PPO's value model)."""
        if self.tokenizer is not None:
            self.tokenizer.save(folder / "tokenizer")

    def _load(self, path: Path) -> dict:
        """Weights, optimizer, scaler and RNGs from a checkpoint; under FSDP or expert parallelism every rank reads it
        whole and keeps its shards."""
        runtime = self.runtime
        sharded = is_fsdp(self.model) or is_expert_parallel(self.model)
        if not sharded:
            return load_checkpoint(path, self.model, self.optimizer, scaler=self.scaler, device=runtime.device, rank=runtime.rank)
        whole = GPT(self.config.model)
        saved = load_checkpoint(path, whole, None, scaler=self.scaler, device="cpu", rank=runtime.rank)
        optimizer_state = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
        load = load_whole_state if is_expert_parallel(self.model) else load_full_state
        load(self.model, self.optimizer, whole.state_dict(), optimizer_state)
        return saved

    def _whole_model(self) -> GPT:
        """The model to save: the plain module, or under FSDP a copy holding the gathered weights (on rank 0)."""
        if is_expert_parallel(self.model):  # each rank holds some experts: gathered whole (a collective)
            weights = gather_expert_weights(self.model)
        elif not is_fsdp(self.model):
            return self.model
        else:
            weights = full_model_state(self.model)  # a collective: {} on ranks other than 0
        with torch.device("meta"):  # no memory: the gathered tensors are assigned in
            whole = GPT(self.config.model)
        if weights:
            whole.load_state_dict(weights, assign=True)
        return whole

    def _check_same_run(self, saved: dict) -> None:
        """Resuming with a different model, batch or data would silently be a different run."""
        old, current = saved.get("config", {}), dataclasses.asdict(self.config)
        keys = ("model", "batch_tokens", "seq_len", "loader_mode", "seed")  # micro_batch: the checkpoint's is adopted
        # a field added to gptlab since the checkpoint was saved (model.attention, ...) is no change at its default
        defaults = field_defaults(type(self.config))
        changed = [key for key in keys if config_changes({key: old[key]} if key in old else {}, {key: current.get(key)},
                                                         defaults=defaults)]
        if changed:
            raise GptlabError(f"{self.config.out} holds checkpoints of a run with other settings ({', '.join(changed)}); "
                              "use another --out, or --force to start over")
        if saved.get("tokenizer_fingerprint") != self.fingerprint:
            raise GptlabError(f"the checkpoints in {self.config.out} were trained on data from another tokenizer than {self.config.data}'s")

    def _gather(self, value) -> list:
        if not self.runtime.distributed:
            return [value]
        values: list = [None] * self.runtime.world_size
        torch.distributed.all_gather_object(values, value)
        return values
