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

The output folder belongs to one run (gptlab.runtime.rundir): the same
settings resume it, other settings are refused unless `force` starts over. Settings are compared as the
user asked for them, so a warmup gptlab shortened to fit a short run is never a change the user made.
`extend` takes a larger max_steps and trains the run on from its last checkpoint (a finished run too):
from there the learning rate follows the longer run's schedule, so a cosine that had decayed rises
to that schedule's value at the step (re-warming, as continued pretraining does).
Resume is exact: a checkpoint holds weights, optimizer and GradScaler state,
the step, every rank's loader position and RNG states, so N steps straight
equal k steps + resume + N - k steps, loss for loss. Metrics logged after the
checkpoint a run resumes from are dropped, so logs and plots never mix runs.
Rank 0 also writes what the run's report reads (gptlab.runs): OUT/machine.json as training begins,
OUT/samples.jsonl as it samples, and OUT/report.html at the end and at checkpoints (while that stays cheap).

Memory (gptlab.train.fit): micro_batch 0 is resolved before anything is built
to the largest micro-batch that fits the free memory. A step that runs out of
CUDA memory in its micro-steps is retried at a smaller micro-batch from the same
loader position and random state (accumulation grows; the step's batch does
not), as if the run had started there. Checkpoints record the micro-batch in
use, and a resumed run keeps it.

Not here: the optimizer (gptlab.train.optim), the schedule (gptlab.train.schedule),
checkpoint files (gptlab.train.checkpoint), val loss (gptlab.eval.loss).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gptlab.data.loader import LoaderConfig, ShardLoader
from gptlab.data.match import check_tokenizer, data_tokenizer, find_model_tokenizer, load_matching_tokenizer
from gptlab.data.shards import read_manifest
from gptlab.eval.loss import evaluate_loss, load_token_bytes
from gptlab.model import GPT
from gptlab.model.accounting import PEAK_FLOPS, flops_per_token, peak_flops
from gptlab.model.hf import load_pretrained_directory, pretrained_path, read_pretrained_config
from gptlab.parallel.fsdp import full_model_state, load_full_state
from gptlab.parallel.wrap import (
    check_config,
    describe,
    finish_gradient_synchronization,
    full_optimizer_state,
    gradient_norm,
    is_fsdp,
    no_sync,
    parallelize,
)
from gptlab.runs import append_sample, describe_machine, truncate_samples, write_machine, write_report
from gptlab.runs.machine import MACHINE_FILE
from gptlab.runs.report import REPORT_FILE
from gptlab.runs.samples import SAMPLES_FILE
from gptlab.runtime import GptlabError, atomic_write_text
from gptlab.runtime.config import config_changes, field_defaults
from gptlab.runtime.device import Runtime, autocast, init_runtime, resolve_precision, rng_state, seed_everything, set_rng_state
from gptlab.runtime.processes import ctrl_c_deferred
from gptlab.runtime.rundir import claim_run_folder, read_marker
from gptlab.runtime.threads import BusyWatch, threads_are_automatic
from gptlab.train.checkpoint import (
    checkpoint_dir,
    find_checkpoint,
    forget_after,
    list_checkpoints,
    load_checkpoint,
    prune,
    record_best,
    resume_point,
    save_checkpoint,
)
from gptlab.train.config import TrainConfig
from gptlab.train.fit import choose_micro_batch, free_memory, out_of_memory_error, smaller_micro_batch
from gptlab.train.metrics import MetricsLog, console_line, plot_losses
from gptlab.train.optim import optimizer_recipe
from gptlab.train.schedule import learning_rate

IGNORE = -100  # a target that does not count (the model's ignore_index)
# What a run may change and still be the same run: how it is watched and where it runs, not what it computes.
# micro_batch too: auto picks it per machine, and a run resumes at its checkpoint's (see _adopt_micro_batch).
# activation_checkpointing too: it recomputes the same numbers; parallel too: sharded optimizer states are saved
# whole, in the unsharded optimizer's format.
FREE_FIELDS = ("out", "log_every", "time_limit", "tensorboard", "wandb", "trackio", "sample_every", "sample_tokens", "device",
               "compile", "eval_every", "eval_batches", "hellaswag_every", "hellaswag_path", "hellaswag_limit",
               "checkpoint_every", "keep_last", "mfu_peak", "micro_batch", "activation_checkpointing", "parallel")
# A checkpoint refreshes the report only while that costs under this share of the training time since the last one.
REPORT_SHARE = 0.05
RUN_FILES = ("checkpoints", "metrics.jsonl", "loss.png", "train_config.json", "tensorboard", "wandb",
             MACHINE_FILE, SAMPLES_FILE, REPORT_FILE)


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


class Trainer:
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
        `extend`: continue the run in config.out for a larger max_steps (see _claim_extension)."""
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
        self.config = self._check_before_compute(config)

    # ------------------------------------------------------------ set-up

    def _check_before_compute(self, config: TrainConfig) -> TrainConfig:
        """Every mistake we can see before spending compute: data, tokenizer, vocabulary, batch arithmetic."""
        if not config.data:
            raise GptlabError("no training data: pass --data DIR (made by `gptlab data prepare`)")
        self.manifest = read_manifest(config.data)
        if "train" not in self.manifest["splits"]:
            raise GptlabError(f"{config.data} has no train split")
        self.fingerprint = self.manifest["tokenizer"]["fingerprint"]
        self.has_val = "val" in self.manifest["splits"]
        # the tokenizer saved with the data is the default: checkpoints then carry it, and samples can be read
        self.tokenizer = load_matching_tokenizer(config.data, config.tokenizer) if config.tokenizer else data_tokenizer(config.data)
        if config.init_from:
            self._check_init(config)
        vocab = self.manifest["tokenizer"]["vocab_size"]
        if vocab > config.model.vocab_size:
            raise GptlabError(
                f"the data's tokenizer has {vocab:,} ids but the model's vocabulary has {config.model.vocab_size:,}: "
                f"set --model.vocab-size {vocab}"
            )
        if vocab < config.model.vocab_size:
            self.print(f"note: the model has {config.model.vocab_size:,} ids, the data's tokenizer {vocab:,}; "
                       "the extra rows are never trained, and sampling draws only the tokenizer's ids")
        self.precision = resolve_precision(config.precision, self.runtime.device)
        config = self._fit_micro_batch(config)
        self.accum = config.accumulation_steps(self.runtime.world_size)
        return self._shorten_warmup(config)

    def _check_init(self, config: TrainConfig) -> None:
        """--init-from: its architecture is the config's, and its tokenizer (when it has one) the data's."""
        self.init_path = find_checkpoint(config.init_from) or pretrained_path(config.init_from)
        init = read_pretrained_config(self.init_path)
        ours = dataclasses.replace(config.model, dropout=init.dropout)
        if ours != init:
            changed = [f"{f.name} {getattr(init, f.name)} != {getattr(ours, f.name)}" for f in dataclasses.fields(init)
                       if getattr(init, f.name) != getattr(ours, f.name)]
            raise GptlabError(f"--init-from {config.init_from} is a model with other settings than the config's model "
                              f"({', '.join(changed)}); leave out the --model options (only --model.dropout may differ)")
        tokenizer = find_model_tokenizer(self.init_path)
        if tokenizer is not None:
            check_tokenizer(config.data, tokenizer, f"the tokenizer of --init-from {config.init_from}")
            self.tokenizer = self.tokenizer or tokenizer  # checkpoints carry it, samples use it

    def _shorten_warmup(self, config: TrainConfig) -> TrainConfig:
        warmup = config.schedule.warmup_steps
        if warmup < config.max_steps:
            return config
        shorter = max(1, config.max_steps // 10)
        self.print(f"note: a warmup of {warmup} steps is not shorter than the run ({config.max_steps} steps); "
                   f"shortened to {shorter}, a tenth of the run")
        return dataclasses.replace(config, schedule=dataclasses.replace(config.schedule, warmup_steps=shorter))

    def _claim(self) -> Path:
        """Rank 0 names the folder (a new one when --out is empty) and claims it; every rank learns where to resume."""
        config = self.config
        resume_from = None
        if self.runtime.is_main:
            out = Path(config.out) if config.out else _new_run_folder()
            if not config.out:
                self.print(f"no --out given: training into {out} (pass --out {out} to resume this run)")
            if self.extend:
                self._check_extension(out)
            folder = claim_run_folder(out, command=self.command, config=dataclasses.asdict(dataclasses.replace(config, out=str(out))),
                                      ours=self.run_files, free=FREE_FIELDS + (("max_steps",) if self.extend else ()),
                                      force=self.force, fresh=not self.resume,
                                      legacy=lambda path: (path / "train_config.json").is_file(),
                                      defaults=field_defaults(type(config)),
                                      asked=dataclasses.asdict(dataclasses.replace(self.asked, out=str(out))),
                                      hints={"max_steps": "pass --extend to train it on to the new --max-steps"})
            self.folder = folder
            resume_from = resume_point(out, self.print) if folder.status == "resume" else None
            atomic_write_text(out / "train_config.json", json.dumps(dataclasses.asdict(dataclasses.replace(config, out=str(out))), indent=1) + "\n")
            shared = [str(out), str(resume_from) if resume_from else None]
        else:
            shared = [None, None]
        if self.runtime.distributed:
            torch.distributed.broadcast_object_list(shared, src=0)
        self.config = dataclasses.replace(config, out=shared[0])
        return Path(shared[1]) if shared[1] else None

    def _check_extension(self, out: Path) -> None:
        """--extend continues a run that is there, for at least the steps it had: the steps trained stay as they are."""
        if self.force or not self.resume:
            raise GptlabError("--extend continues the run in --out; it cannot be combined with --force or --no-resume")
        record = read_marker(out) if out.is_dir() else None
        if record is None or record.get("command") != self.command:
            raise GptlabError(f"--extend continues a `gptlab {self.command}` run, but {out} holds none; leave out --extend to start one")
        before = record.get("config", {}).get("max_steps")
        if isinstance(before, int) and self.config.max_steps < before:
            raise GptlabError(f"--extend lengthens a run: --max-steps {self.config.max_steps} is fewer than the run's {before} steps; "
                              "pass a larger --max-steps")

    def _note_extension(self, saved: dict, step: int) -> None:
        """Say what --extend does to the learning rate: from here it follows the longer run's schedule."""
        before = saved.get("config", {}).get("max_steps")
        if not self.extend or before == self.config.max_steps:
            return
        config = self.config
        lr = learning_rate(step, config.optimizer.lr, config.max_steps, config.schedule)
        self.print(f"extending the run from {before} to {config.max_steps} steps: from step {step} the learning rate follows "
                   f"the {config.max_steps}-step schedule ({config.schedule.kind}), starting at {lr:.2e}")

    def _loader(self, split: str) -> ShardLoader:
        config = self.config
        return ShardLoader(
            config.data,
            split,
            config=LoaderConfig(batch_size=config.micro_batch, seq_len=config.seq_len, mode=config.loader_mode, seed=config.seed),
            rank=self.runtime.rank,
            world_size=self.runtime.world_size,
            device=self.runtime.device,
            fingerprint=self.fingerprint,
        )

    def _build(self) -> None:
        """Model (random or --init-from weights), optimizer, scaler, loaders, metrics: everything the loop touches."""
        config, device = self.config, self.runtime.device
        seed_everything(config.seed)
        self.model = self._make_model().set_activation_checkpointing(config.activation_checkpointing)
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.precision == "fp16")
        self.train_loader = self._loader("train")
        self.val_loader = self._loader("val") if self.has_val else None
        self.token_bytes = self._token_bytes() if self.val_loader is not None else None
        self.wrapped, self.optimizer = self._wrap(self.model)
        self.cast = autocast(device, self.precision)
        self.metrics = MetricsLog(config.out, self.runtime.is_main, config.tensorboard, config.wandb, dataclasses.asdict(config),
                                  trackio_project=config.trackio)

    def _make_model(self) -> GPT:
        """The model to train: random, or the --init-from weights."""
        model = GPT(self.config.model).to(self.runtime.device)
        if self.config.init_from:
            model.load_state_dict(load_pretrained_directory(self.init_path, device=self.runtime.device).state_dict())
        return model

    def _token_bytes(self) -> torch.Tensor | None:
        """Bytes per token id, for val bits per byte."""
        return load_token_bytes(self.config.data, self.runtime.device)

    def _task_every(self) -> int:
        """Steps between the task_fn's evaluations (0: never)."""
        return self.config.hellaswag_every

    def _wrap(self, model: GPT) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """compile, then data parallel as --parallel.* says (gptlab.parallel), and the optimizer (sharded or not):
        the wrapped module is used for the training step only."""
        config, runtime = self.config, self.runtime
        wrapped: torch.nn.Module = model
        if runtime.distributed:
            check_config(config.parallel, compile=config.compile)
            if config.parallel.fsdp and not self.fsdp_ok:
                raise GptlabError(f"gptlab {self.command} does not support --parallel.fsdp; use --parallel.shard-optimizer zero1 "
                                  "to shard the optimizer state")
        if config.compile:
            wrapped = torch.compile(model)
        device_ids = [runtime.local_rank] if runtime.device.type == "cuda" else None
        return parallelize(wrapped, lambda: optimizer_recipe(model, config.optimizer, runtime.device.type), config.parallel,
                           distributed=runtime.distributed, device_ids=device_ids, blocks=model.transformer["h"],
                           precision=self.precision)

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

    # ------------------------------------------------------------ the loop

    def fit(self) -> TrainResult:
        self.folder, self.started = None, False
        resume_from = self._claim()
        try:
            self._build()
            self.state = self._restore(resume_from)
        except GptlabError:  # refused before any training: a new run leaves nothing behind
            if self.folder is not None:
                self.folder.undo()
            raise
        if self.before_fn is not None:  # after the folder is claimed: a refused --out costs no compute
            self.before = self.before_fn()
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

    def _train_step(self) -> None:
        """One optimizer step (accum micro-steps), then the step's metrics."""
        config, state, device = self.config, self.state, self.runtime.device
        step_start = time.perf_counter()
        lr = learning_rate(state.step, config.optimizer.lr, config.max_steps, config.schedule, self.spent)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_ratio", 1.0)  # Muon's matrices have a peak of their own
        loss_sum = self._accumulate()
        if self.runtime.distributed:
            torch.distributed.all_reduce(loss_sum, op=torch.distributed.ReduceOp.AVG)
        loss_value = loss_sum.item()
        if not math.isfinite(loss_value):
            good = list_checkpoints(config.out)
            where = f"the last good checkpoint is {good[-1]}" if good else "no checkpoint was saved yet"
            raise GptlabError(f"loss is {loss_value} at step {state.step}: stopped before updating the weights; {where}")
        self.scaler.unscale_(self.optimizer)
        clip = config.grad_clip if config.grad_clip > 0 else float("inf")
        norm = gradient_norm(torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip))
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        state.step += 1
        state.tokens += self._step_tokens()
        state.losses.append(loss_value)
        self._log_step(loss_value, lr, norm, time.perf_counter() - step_start)

    def _micro_steps(self) -> torch.Tensor:
        """Forward and backward of the step's micro-batches, gradients accumulating; their losses summed."""
        loss_sum = torch.zeros((), device=self.runtime.device)
        batches, weights = self._step_batches()
        for micro, ((x, y, kwargs), weight) in enumerate(zip(batches, weights)):
            last = micro == self.accum - 1
            sync = no_sync(self.wrapped) if self.runtime.distributed and not last else nullcontext()
            with sync:
                loss = self._micro_loss(x, y, kwargs, weight)
                loss_sum += loss.detach()
                self.scaler.scale(loss).backward()
        finish_gradient_synchronization(self.wrapped)  # the hand-written variants wait for their all-reduces here
        return loss_sum

    def _micro_loss(self, x: torch.Tensor, y: torch.Tensor, kwargs: dict, weight: float | None) -> torch.Tensor:
        """One micro-batch's share of the step's loss, ready for backward (subclasses: DPO, GRPO)."""
        fused = self.config.fused_loss and not self.config.compile
        with self.cast:
            _, loss = self.wrapped(x, y, loss_reduction="mean" if weight is None else "sum", fused_loss=fused, **kwargs)
        return loss / self.accum if weight is None else loss * weight

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
                  "tokens_per_s": rate, "mfu": _mfu(self.flops, rate, self.peak), "elapsed": state.elapsed_before + elapsed,
                  **self._step_metrics()}
        self.metrics.log(record)
        done = len(state.losses)
        eta = elapsed / done * (config.max_steps - state.step) if done else None
        if config.time_limit and eta is not None:
            eta = min(eta, max(0.0, config.time_limit * (1 - self.spent)))
        self.print(console_line(record, config.max_steps, eta, self.spent if config.time_limit else None))

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
        spent = (self.state.elapsed_before + time.perf_counter() - self.start_time) / self.config.time_limit
        if self.runtime.distributed:
            flag = torch.tensor([spent], dtype=torch.float64, device=self.runtime.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            spent = float(flag.item())
        return spent

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

    # ------------------------------------------------------------ fitting the memory (gptlab.train.fit)

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

    # ------------------------------------------------------------ helpers

    def _announce(self) -> None:
        config, runtime, model = self.config, self.runtime, self.model
        self.flops, self.peak = _flops_per_token(config), _peak(config, runtime.device)
        ranks = f", {runtime.world_size} ranks, {describe(config.parallel)}" if runtime.distributed else ""
        init = f", from {config.init_from}" if config.init_from and self.state.step == 0 else ""
        self.print(
            f"training {model.num_params():,} parameters on {runtime.device} ({self.precision}"
            f"{', compiled' if config.compile else ''}{ranks}{init}): "
            f"{config.batch_tokens:,} tokens/step = {self.accum} x {config.micro_batch} x {config.seq_len}"
            f"{f' x {runtime.world_size}' if runtime.distributed else ''}, "
            + (f"from step {self.state.step} for {config.time_limit:g} s" if config.max_steps >= 10**8 and config.time_limit
               else f"steps {self.state.step}..{config.max_steps}")
        )
        if self.fit_note:
            self.print(self.fit_note)

    def _evaluate(self) -> None:
        if self.val_loader is None:
            return
        self.val_loader.reset()
        result = evaluate_loss(self.model, self.val_loader, self.config.eval_batches, self.token_bytes, self.cast)
        state = self.state
        state.best_val = result["loss"] if state.best_val is None else min(state.best_val, result["loss"])
        state.val = result
        self.metrics.log({"step": state.step, "val_loss": result["loss"], "val_bpb": result["bpb"]})
        bpb = f", val bpb {result['bpb']:.4f}" if math.isfinite(result["bpb"]) else ""
        self.print(f"step {state.step:>6}: val loss {result['loss']:.4f}{bpb} ({result['tokens']:,} tokens)")

    def _save(self, val_loss: float | None) -> Path | None:
        """A checkpoint of this step (rank 0 writes; every rank contributes its loader and RNG state)."""
        config, state = self.config, self.state
        trainer_state = {
            "step": state.step, "tokens": state.tokens, "loader": self._gather(self.train_loader.state_dict()),
            "best_val_loss": state.best_val, "elapsed": state.elapsed_before + time.perf_counter() - self.start_time,
            "finished": state.finished, "data": str(config.data), "tokenizer_fingerprint": self.fingerprint,
            "config": dataclasses.asdict(config),
        }
        rngs = self._gather(rng_state())
        model, optimizer = self._whole_model(), full_optimizer_state(self.optimizer, self.model)  # collectives when sharded
        if not self.runtime.is_main:
            return None
        path = checkpoint_dir(config.out) / f"step_{state.step:06d}"
        attach = (lambda folder: self.tokenizer.save(folder / "tokenizer")) if self.tokenizer is not None else None
        save_checkpoint(path, model, optimizer, state=trainer_state, scaler=self.scaler, rng_states=rngs, attach=attach)
        record_best(config.out, path, val_loss)
        prune(config.out, config.keep_last, keep=path)
        return path

    def _load(self, path: Path) -> dict:
        """Weights, optimizer, scaler and RNGs from a checkpoint; under FSDP every rank reads it whole and keeps its shards."""
        runtime = self.runtime
        if not is_fsdp(self.model):
            return load_checkpoint(path, self.model, self.optimizer, scaler=self.scaler, device=runtime.device, rank=runtime.rank)
        whole = GPT(self.config.model)
        saved = load_checkpoint(path, whole, None, scaler=self.scaler, device="cpu", rank=runtime.rank)
        optimizer_state = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
        load_full_state(self.model, self.optimizer, whole.state_dict(), optimizer_state)
        return saved

    def _whole_model(self) -> GPT:
        """The model to save: the plain module, or under FSDP a copy holding the gathered weights (on rank 0)."""
        if not is_fsdp(self.model):
            return self.model
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

    def _write_machine(self) -> None:
        """OUT/machine.json, as training begins (rank 0): what the report says the run ran on."""
        if self.runtime.is_main:
            runtime = self.runtime
            write_machine(self.config.out, describe_machine(runtime.device, precision=self.precision, world_size=runtime.world_size,
                                                            compile=self.config.compile, start_step=self.state.step))

    def _refresh_report(self) -> None:
        """At a checkpoint: rewrite the report, unless that would cost more than REPORT_SHARE of the time since the last
        (drawing takes about a second: a long run's checkpoints all refresh it, a run of seconds waits for its end)."""
        if time.perf_counter() - self.report_at >= self.report_seconds / REPORT_SHARE:
            self._write_report()

    def _write_report(self, announce: bool = False) -> None:
        """Write OUT/report.html (rank 0). A report that cannot be written costs a warning, never the run."""
        if not self.runtime.is_main:
            return
        start = time.perf_counter()
        try:
            path = write_report(self.config.out)
        except Exception as error:  # the run's checkpoints and metrics are safe; `gptlab runs report` can redo it
            self.print(f"warning: {Path(self.config.out) / REPORT_FILE} not written: {type(error).__name__}: {error}")
            return
        self.report_at = time.perf_counter()
        self.report_seconds = self.report_at - start
        if announce:
            self.print(f"report -> {path}")

    def _run_tasks(self) -> None:
        """Benchmarks on the plain module, every rank taking its share (the task all-reduces its counts)."""
        was_training = self.model.training
        self.model.eval()
        scores = self.task_fn(self.model)
        if was_training:
            self.model.train()
        self.metrics.log({"step": self.state.step, **scores})
        self.print(f"step {self.state.step:>6}: " + ", ".join(f"{key} {value:.4f}" for key, value in scores.items()))

    def _sample(self) -> None:
        if self.sample_fn is None or self.tokenizer is None or not self.runtime.is_main or is_fsdp(self.model):
            return  # under FSDP a forward on rank 0 alone would wait forever for the others' shards
        was_training = self.model.training
        self.model.eval()
        text = self.sample_fn(self.model, self.tokenizer)
        self.print("sample: " + text)
        append_sample(self.config.out, self.state.step, text)
        if was_training:
            self.model.train()


def _new_run_folder(root: str = "runs") -> Path:
    """runs/train-20261123-201500 (with -2, -3, ... if that exists): a training run's own folder."""
    base = Path(root) / time.strftime("train-%Y%m%d-%H%M%S")
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def _flops_per_token(config: TrainConfig) -> float:
    """Training FLOPs per token, 6N + 12 L d T (PaLM appendix B, as nanoGPT's estimate_mfu)."""
    return float(flops_per_token(config.model, config.seq_len)["training"])


def _peak(config: TrainConfig, device: torch.device) -> float | None:
    """The peak FLOP/s for MFU: --mfu-peak (a name or a number), or the GPU's datasheet figure; none on CPU."""
    if config.mfu_peak != "auto":
        return peak_flops(config.mfu_peak)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).lower()
    return next((PEAK_FLOPS[key] for key in ("h200", "h100", "a100") if key in name), None)


def _mfu(flops: float, tokens_per_second: float, peak: float | None) -> float | None:
    return flops * tokens_per_second / peak if peak else None
