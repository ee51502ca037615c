"""The Trainer: the training loop, single process or DDP under torchrun, with exact checkpoint/resume.

One optimizer step:

    for each of `accum` micro-steps:            (gradients sync only on the last one under DDP)
        x, y = loader.next_batch()
        loss = model(x, y) / accum; loss.backward()
    norm = clip_grad_norm_(parameters, grad_clip)
    lr = schedule(step); optimizer.step(); optimizer.zero_grad()

Dividing each micro-batch's mean loss by `accum` makes the accumulated
gradient the gradient of the mean loss over the whole batch (a test checks it
against one big batch). When some targets are ignored (-100, e.g. the user's
turns in fine-tuning), micro-batches hold different numbers of targets, so each
one's summed loss is divided by the targets of the whole step, all micro-batches
and ranks together: the mean over every target of the batch, however they fall.
A loader's batch is (x, y) or (x, y, kwargs), the kwargs passed to the model
(e.g. positions and an attention mask for packed rows). The model is built plain, then wrapped (torch.compile,
then DDP) for the step only; evaluation, sampling and checkpoints use the plain
module, so compile never gets in their way and checkpoints hold clean keys. Under torchrun,
--parallel.* picks how ranks share the work (gptlab.parallel: torch DDP by default, hand-written
data parallel variants, ZeRO-1, FSDP2); sharded optimizer states are saved whole.
A run stops at max_steps or at --time-limit (the schedule then follows the share of the time spent);
a Ctrl-C ends the step first and saves a checkpoint, so the run resumes exactly.

The Trainer's other parts, each a mixin in a module of its own:

    gptlab.train.prepare       checks before compute, the run folder (resume, --extend, --force), building the model
    gptlab.train.resume        what a checkpoint saves and how a run resumes from one (exactly)
    gptlab.train.micro_batch   micro_batch 0 (auto) fitted to the memory; a step retried smaller after CUDA runs out
    gptlab.train.hooks         the opening line, evaluation, tasks, samples, the run's report and machine record
    gptlab.train.moe_stats     mixture of experts: the routing-bias step after each update, the expert-load metrics
                               (the logged loss stays the cross-entropy; the balance losses in it are moe_aux_loss)

Subclasses (gptlab.align: SFT, DPO, GRPO) replace the data, the model and the micro-batch's loss.
Not here: the optimizer (gptlab.train.optim), the schedule (gptlab.train.schedule),
checkpoint files (gptlab.train.checkpoint), val loss (gptlab.eval.loss).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from gptlab.load.checkpoints import list_checkpoints
from gptlab.model import GPT
from gptlab.parallel.wrap import check_config, clip_gradients, finish_gradient_synchronization, no_sync
from gptlab.runtime import GptlabError
from gptlab.runtime.device import Runtime, init_runtime
from gptlab.runtime.processes import ctrl_c_deferred
from gptlab.runtime.threads import BusyWatch, threads_are_automatic
from gptlab.train.config import TrainConfig
from gptlab.train.fit import out_of_memory_error
from gptlab.train.hooks import HooksMixin
from gptlab.train.metrics import console_line, plot_losses
from gptlab.train.micro_batch import MicroBatchMixin
from gptlab.train.moe_stats import balance_loss, clear_statistics, moe_metrics, sparse_layers, update_routing_biases
from gptlab.train.prepare import FREE_FIELDS, RUN_FILES, PrepareMixin
from gptlab.train.resume import ResumeMixin, TrainState
from gptlab.train.schedule import learning_rate

__all__ = ["FREE_FIELDS", "RUN_FILES", "IGNORE", "TrainResult", "TrainState", "Trainer"]

IGNORE = -100  # a target that does not count (the model's ignore_index)


@dataclass
class TrainResult:
    steps: int
    final_loss: float
    val_loss: float | None
    val_bpb: float | None
    checkpoint: Path | None
    seconds: float
    status: str  # "finished", "time limit", "interrupted", "already finished"
    losses: list[float]

    def line(self) -> str:
        """"finished after 600 steps in 51 s; checkpoint runs/a/checkpoints/step_000600": how the run ended."""
        return f"{self.status} after {self.steps} steps in {self.seconds:.0f} s; checkpoint {self.checkpoint}"


class Trainer(PrepareMixin, ResumeMixin, MicroBatchMixin, HooksMixin):
    """The loop (module docstring); set-up, resume, the micro-batch and the reports come from the mixins."""

    command = "train"  # the command that claims its run folder
    fsdp_ok = True  # --parallel.fsdp works here (every rank runs the same forwards)
    run_files = RUN_FILES  # what belongs to a run in its folder

    def __init__(
        self,
        config: TrainConfig,
        *,
        runtime: Runtime | None = None,
        sample_fn: Callable[[GPT, object], str] | None = None,
        task_fn: Callable[[GPT], dict[str, float]] | None = None,
        log: Callable[[str], None] = print,
        resume: bool = True,
        force: bool = False,
        extend: bool = False,
    ) -> None:
        """`resume`: continue the run in config.out (False: refuse a folder that holds one). `force`: start over.
        `extend`: continue the run in config.out for a larger max_steps (gptlab.train.prepare)."""
        self.runtime = runtime or init_runtime(config.device)
        self.sample_fn = sample_fn  # (model, tokenizer) -> text, e.g. gptlab.pipeline.text_sampler
        self.task_fn = task_fn  # e.g. HellaSwag: built by the caller, who holds the tokenizer
        self.print = log if self.runtime.is_main else (lambda *_: None)
        self.resume, self.force, self.extend = resume, force, extend
        self.asked = config  # as the user gave it: what a rerun is compared on (not a warmup gptlab shortened)
        self.started = False  # True once the training loop has begun (fit)
        self.busy_watch: BusyWatch | None = None  # CPU runs: fewer threads, or a warning, while other work holds the cores
        self.before_fn: Callable[[], object] | None = None  # measures the start (e.g. task accuracy), once the folder is ours
        self.before: object = None  # ... and what it measured
        self.fit_note = ""  # how the micro-batch was chosen, for the announcement
        self.moe_layers: list = []  # the model's sparse feed-forward layers, found when it is built (fit)
        self.moe_numbers: list[int] = []  # ... and their block numbers
        self.config = self._check_before_compute(config)
        check_config(self.config.parallel, compile=self.config.compile, moe=self.config.model.is_moe)  # the model as resolved

    # ------------------------------------------------------------ the loop

    def fit(self) -> TrainResult:
        self.folder, self.started = None, False
        resume_from = self._claim()
        try:
            self._build()
            self.state = self._restore(resume_from)
            self.moe_layers, self.moe_numbers = sparse_layers(self.model)  # sparse feed-forward layers (gptlab.train.moe_stats)
        except GptlabError:  # refused before any training: a new run leaves nothing behind
            if self.folder is not None:
                self.folder.undo()
            raise
        if self.before_fn is not None:  # after the folder is claimed: a refused --out costs no compute
            self.before = self.before_fn()
        self._warm_up_compile()
        self.start_time = time.perf_counter()
        self.report_at, self.report_seconds = self.start_time, 1.0  # when the report was last written, and its cost (a guess)
        self.spent = self.state.elapsed_before / self.config.time_limit if self.config.time_limit else 0.0
        if self.state.finished and self.state.step >= self.config.max_steps or self.spent >= 1:
            budget = f"spent its time limit of {self.config.time_limit:g} s (pass a larger --time-limit to go on)"
            more = " (--extend with a larger --max-steps trains it on)" if self.command == "train" else ""
            self.print(f"{self.config.out} already {budget if self.spent >= 1 else f'finished its {self.state.step} steps{more}'}; "
                       "nothing to train")
            self.metrics.close()
            return self._result("already finished", resume_from)
        self._announce()
        self._write_machine()
        if self.runtime.device.type == "cpu":  # CPU threads follow the machine's load when gptlab chose their count
            self.busy_watch = BusyWatch(torch.get_num_threads(), adapt=threads_are_automatic() and not self.runtime.distributed)
        self.model.train()
        self.started = True  # from here on the run's work is worth keeping, whatever happens
        status, half_done = "finished", []
        try:
            while self.state.step < self.config.max_steps:
                with ctrl_c_deferred(half_done, second_stops=True):  # a Ctrl-C ends the step first: exact resume
                    self._train_step()
                    out_of_time = self._out_of_time()
                self._periodic(out_of_time)
                if out_of_time:
                    status = "time limit"
                    break
        except KeyboardInterrupt:
            if half_done:  # a second Ctrl-C inside a step: its state is half updated, so nothing is saved from it
                last = list_checkpoints(self.config.out)
                self.print(f"interrupted twice, inside step {self.state.step + 1}: not saved; "
                           f"{f'the last checkpoint is {last[-1]}' if last else 'no checkpoint was saved yet'}")
                self.metrics.close()
                return self._result("interrupted", last[-1] if last else None)
            self.print(f"interrupted at step {self.state.step}: saving a checkpoint")
            checkpoint = self._save(None)
            self._write_report()
            self.metrics.close()
            return self._result("interrupted", checkpoint)
        except torch.OutOfMemoryError:  # outside the micro-steps (optimizer, evaluation), or under torchrun
            raise out_of_memory_error(self.config.micro_batch, self.config.seq_len) from None
        return self._finish(status)

    def _warm_up_compile(self) -> None:
        """With --compile, trace and compile the training step's forward and backward before the clock starts, as
        modded-nanogpt's records time training alone: a --time-limit then buys training steps, not compilation.
        A batch of zeros in the step's shape, its gradients dropped and the RNG put back: the run is unchanged."""
        if not self.config.compile or self.state.finished:
            return
        started = time.perf_counter()
        ids = torch.zeros(self.config.micro_batch or 1, self.config.seq_len, dtype=torch.long, device=self.runtime.device)
        rng = torch.get_rng_state(), (torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
        self.model.train()
        with self.cast:  # targets a tensor of their own: the step's guards (idx is not targets) hold afterwards
            _, loss = self.wrapped(ids, ids.clone(), loss_reduction="mean", fused_loss=False)
        loss.backward()
        self.optimizer.zero_grad(set_to_none=True)
        torch.set_rng_state(rng[0])
        if rng[1] is not None:
            torch.cuda.set_rng_state_all(rng[1])
        self.print(f"compiled the training step in {time.perf_counter() - started:.1f} s (before the clock starts)")

    def _train_step(self) -> None:
        """One optimizer step (accum micro-steps), then the step's metrics."""
        config, state, device = self.config, self.state, self.runtime.device
        step_start = time.perf_counter()
        lr = learning_rate(state.step, config.optimizer.lr, config.max_steps, config.schedule, self.spent)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_ratio", 1.0)  # Muon's matrices have a peak of their own
        losses = torch.stack([self._accumulate(), self.aux_sum])  # the step's loss, and the balance losses in it (MoE)
        if self.runtime.distributed:
            torch.distributed.all_reduce(losses, op=torch.distributed.ReduceOp.AVG)
        loss_value, self.aux_value = losses.tolist()
        if not math.isfinite(loss_value):
            good = list_checkpoints(config.out)
            where = f"the last good checkpoint is {good[-1]}" if good else "no checkpoint was saved yet"
            raise GptlabError(f"loss is {loss_value} at step {state.step}: stopped before updating the weights; {where}")
        self.scaler.unscale_(self.optimizer)
        clip = config.grad_clip if config.grad_clip > 0 else float("inf")
        norm = clip_gradients(self.model, clip)  # over all ranks' experts under expert parallelism
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        update_routing_biases(self.moe_layers)  # DeepSeek-V3's bias, from the step's load on every rank
        if device.type == "cuda":
            torch.cuda.synchronize()
        loss_value -= self.aux_value  # the logged loss is the cross-entropy, comparable with a dense run's
        state.step += 1
        state.tokens += self._step_tokens()
        state.losses.append(loss_value)
        self._log_step(loss_value, lr, norm, time.perf_counter() - step_start)

    def _micro_steps(self) -> torch.Tensor:
        """Forward and backward of the step's micro-batches, gradients accumulating; their losses summed."""
        loss_sum = torch.zeros((), device=self.runtime.device)
        self.aux_sum = torch.zeros((), device=self.runtime.device)  # the part of loss_sum the MoE balance losses are
        clear_statistics(self.moe_layers)  # this step's statistics only (a retried pass counted some)
        batches, weights = self._step_batches()
        for micro, ((x, y, kwargs), weight) in enumerate(zip(batches, weights)):
            last = micro == self.accum - 1
            sync = no_sync(self.wrapped) if self.runtime.distributed and not last else nullcontext()
            with sync:
                self._forget_balance_losses()
                loss = self._micro_loss(x, y, kwargs, weight)
                loss, aux = self._with_balance_loss(loss, y, weight)
                loss_sum += loss.detach()
                self.aux_sum += aux
                self.scaler.scale(loss).backward()
        finish_gradient_synchronization(self.wrapped)  # the hand-written variants wait for their all-reduces here
        return loss_sum

    def _micro_loss(self, x: torch.Tensor, y: torch.Tensor, kwargs: dict, weight: float | None) -> torch.Tensor:
        """One micro-batch's share of the step's loss, ready for backward (subclasses: DPO, GRPO)."""
        fused = self.config.fused_loss and not self.config.compile
        with self.cast:
            _, loss = self.wrapped(x, y, loss_reduction="mean" if weight is None else "sum", fused_loss=fused, **kwargs)
        return loss / self.accum if weight is None else loss * weight

    def _forget_balance_losses(self) -> None:
        """Before a micro-batch: no balance loss from an earlier forward may pass for this one's (_with_balance_loss)."""
        for layer in self.moe_layers:
            layer.aux_loss = None
        if self.moe_layers and hasattr(self.model, "last_aux_loss"):
            self.model.last_aux_loss = None

    def _with_balance_loss(self, loss: torch.Tensor, y: torch.Tensor, weight: float | None) -> tuple[torch.Tensor, torch.Tensor | float]:
        """The micro-batch's loss with the MoE balance losses, and their part of it, scaled as _micro_loss scales
        the loss. A forward with targets added them itself (gptlab.model.gpt: per counted token under "sum");
        losses computed from logits or scalars without targets (DPO, GRPO, PPO, the reward model) get them here."""
        aux = getattr(self.model, "last_aux_loss", None)
        added = aux is not None
        if not added:
            aux = balance_loss(self.moe_layers)
        if aux is None:  # a dense model
            return loss, 0.0
        share = aux / self.accum if weight is None else aux * (y != IGNORE).sum() * weight
        return (loss, share) if added else (loss + share, share.detach())

    def _step_tokens(self) -> int:
        """Tokens the step trained on: the configured batch (GRPO: its rollout's rows, as long as the longest)."""
        return self.config.batch_tokens

    def _step_metrics(self) -> dict[str, float]:
        """Extra figures for the step's metrics line, gathered by _micro_loss (subclasses; none here)."""
        return {}

    def _step_batches(self) -> tuple[list[tuple], list[float | None]]:
        """The step's micro-batches as (x, y, kwargs), and the factor on each one's loss.

        All targets counted (pretraining): None, each micro-batch's mean / accum, as always.
        Some ignored: 1 / (targets in the whole step, every rank) on each one's summed loss, times
        the world size since DDP averages gradients. A micro-batch without targets adds 0, not NaN.
        """
        batches = []
        for _ in range(self.accum):
            x, y, *extra = self.train_loader.next_batch()
            batches.append((x, y, extra[0] if extra else {}))
        counted = torch.stack([(y != IGNORE).sum() for _, y, _ in batches]).sum()
        if self.runtime.distributed:
            torch.distributed.all_reduce(counted)
        total = int(counted.item())
        full = sum(y.numel() for _, y, _ in batches) * self.runtime.world_size
        if total == full:
            return batches, [None] * len(batches)
        return batches, [self.runtime.world_size / max(total, 1)] * len(batches)

    def _log_step(self, loss: float, lr: float, norm: float, seconds: float) -> None:
        config, state = self.config, self.state
        busy = self.busy_watch.step(seconds) if self.busy_watch else None
        if busy:  # once a run: the machine got busy, and what to do about it
            self.print(busy)
        if state.step % config.log_every and state.step != config.max_steps:
            return
        rate = self._step_tokens() / seconds
        elapsed = time.perf_counter() - self.start_time
        record = {"step": state.step, "loss": loss, "lr": lr, "grad_norm": norm, "tokens": state.tokens,
                  "tokens_per_s": rate, "mfu": self._mfu(rate), "elapsed": state.elapsed_before + elapsed,
                  **self._step_metrics(), **self._moe_metrics()}
        self.metrics.log(record)
        done = len(state.losses)
        eta = elapsed / done * (config.max_steps - state.step) if done else None
        if config.time_limit and eta is not None:
            eta = min(eta, max(0.0, config.time_limit * (1 - self.spent)))
        self.print(console_line(record, config.max_steps, eta, self.spent if config.time_limit else None))

    def _moe_metrics(self) -> dict:
        """Per sparse layer, the logged step's expert load summed over ranks (gptlab.train.moe_stats); {} if dense."""
        if not self.moe_layers:
            return {}
        return moe_metrics(self.moe_layers, self.moe_numbers, self.aux_value)

    def _periodic(self, out_of_time: bool) -> None:
        """Evaluations, samples and checkpoints that fall on this step (not on the last: _finish does those)."""
        config, step = self.config, self.state.step
        before_end = step < config.max_steps
        if config.eval_every and step % config.eval_every == 0 and before_end and not out_of_time:
            self._evaluate()
        if self.task_fn and self._task_every() and step % self._task_every() == 0:
            self._run_tasks()
        if config.sample_every and step % config.sample_every == 0 and before_end:
            self._sample()
        if config.checkpoint_every and step % config.checkpoint_every == 0 and before_end:
            self._save(self.state.val["loss"] if self.state.val else None)
            self._refresh_report()

    def _out_of_time(self) -> bool:
        """Past --time-limit? (The share spent also sets the next step's learning rate.)"""
        self.spent = self._spent()
        return self.spent >= 1

    def _spent(self) -> float:
        """The share of --time-limit spent by this run, earlier processes included (0 without a limit).

        Under DDP the ranks agree on the largest, so they use one learning rate and stop together.
        """
        if not self.config.time_limit:
            return 0.0
        spent = self._elapsed() / self.config.time_limit
        if self.runtime.distributed:
            flag = torch.tensor([spent], dtype=torch.float64, device=self.runtime.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            spent = float(flag.item())
        return spent

    def _elapsed(self) -> float:
        """Seconds this run has trained, earlier processes included: the run's one clock (a test replaces this module's)."""
        return self.state.elapsed_before + time.perf_counter() - self.start_time

    def _finish(self, status: str) -> TrainResult:
        """The last evaluation, checkpoint and sample, and the loss plot."""
        self._evaluate()
        self.state.finished = self.state.step >= self.config.max_steps or self.spent >= 1  # either way, annealed
        checkpoint = self._save(self.state.val["loss"] if self.state.val else None)
        self._sample()
        if self.runtime.is_main:
            plot = plot_losses(self.metrics.records(), Path(self.config.out) / "loss.png")
            if plot:
                self.print(f"loss plot -> {plot}")
        self._write_report(announce=True)
        self.metrics.close()
        return self._result(status, checkpoint)

    def _result(self, status: str, checkpoint: Path | None) -> TrainResult:
        state = self.state
        return TrainResult(
            steps=state.step, final_loss=state.losses[-1] if state.losses else float("nan"),
            val_loss=state.val["loss"] if state.val else None, val_bpb=state.val["bpb"] if state.val else None,
            checkpoint=checkpoint, seconds=time.perf_counter() - self.start_time, status=status, losses=state.losses,
        )
