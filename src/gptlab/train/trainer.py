"""The Trainer: the training loop, single process or DDP under torchrun, with exact checkpoint/resume.

One optimizer step:

    for each of `accum` micro-steps:            (gradients sync only on the last one under DDP)
        x, y = loader.next_batch()
        loss = model(x, y) / accum; loss.backward()
    norm = clip_grad_norm_(parameters, grad_clip)
    lr = schedule(step); optimizer.step(); optimizer.zero_grad()

Dividing each micro-batch's mean loss by `accum` makes the accumulated
gradient the gradient of the mean loss over the whole batch (a test checks it
against one big batch). The model is built plain, then wrapped (torch.compile,
then DDP) for the step only; evaluation, sampling and checkpoints use the plain
module, so compile never gets in their way and checkpoints hold clean keys.

Resume is exact: a checkpoint holds weights, optimizer state, the step, every
rank's loader position and the RNG states, so N steps straight equal k steps +
resume + N - k steps, loss for loss.

Not here: the optimizer (gptlab.train.optim), the schedule (gptlab.train.schedule),
checkpoint files (gptlab.train.checkpoint), val loss (gptlab.eval.loss).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from gptlab.data.loader import LoaderConfig, ShardLoader
from gptlab.data.shards import read_manifest
from gptlab.eval.loss import evaluate_loss, load_token_bytes
from gptlab.model import GPT
from gptlab.model.accounting import PEAK_FLOPS, flops_per_token, peak_flops
from gptlab.runtime import GptlabError, atomic_write_text
from gptlab.runtime.device import Runtime, autocast, init_runtime, resolve_precision, rng_state, seed_everything, set_rng_state
from gptlab.train.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from gptlab.train.config import TrainConfig
from gptlab.train.metrics import MetricsLog, console_line, plot_losses
from gptlab.train.optim import build_optimizer
from gptlab.train.schedule import learning_rate


@dataclass
class TrainResult:
    steps: int
    final_loss: float
    val_loss: float | None
    val_bpb: float | None
    checkpoint: Path | None
    seconds: float
    status: str  # "finished", "time limit", "interrupted"
    losses: list[float]


class Trainer:
    def __init__(
        self,
        config: TrainConfig,
        *,
        runtime: Runtime | None = None,
        sample_fn: Callable[[GPT], str] | None = None,
        task_fn: Callable[[GPT], dict[str, float]] | None = None,
        log: Callable[[str], None] = print,
        resume: bool = True,
    ) -> None:
        self.config = config
        self.runtime = runtime or init_runtime(config.device)
        self.sample_fn = sample_fn
        self.task_fn = task_fn  # e.g. HellaSwag: built by the caller, who holds the tokenizer
        self.print = log if self.runtime.is_main else (lambda *_: None)
        self.resume = resume
        self._check_before_compute()

    # ------------------------------------------------------------ set-up

    def _check_before_compute(self) -> None:
        """Every mistake we can see before spending compute: data, vocabulary, batch arithmetic."""
        config = self.config
        if not config.data:
            raise GptlabError("no training data: pass --data DIR (made by `gptlab data prepare`)")
        manifest = read_manifest(config.data)
        vocab = manifest["tokenizer"]["vocab_size"]
        if vocab > config.model.vocab_size:
            raise GptlabError(
                f"the data's tokenizer has {vocab:,} ids but the model's vocabulary has {config.model.vocab_size:,}: "
                f"set --model.vocab_size {vocab}"
            )
        if "train" not in manifest["splits"]:
            raise GptlabError(f"{config.data} has no train split")
        self.manifest = manifest
        self.accum = config.accumulation_steps(self.runtime.world_size)
        self.precision = resolve_precision(config.precision, self.runtime.device)

    def _loader(self, split: str) -> ShardLoader:
        config = self.config
        return ShardLoader(
            config.data,
            split,
            config=LoaderConfig(batch_size=config.micro_batch, seq_len=config.seq_len, mode=config.loader_mode, seed=config.seed),
            rank=self.runtime.rank,
            world_size=self.runtime.world_size,
            device=self.runtime.device,
            fingerprint=self.manifest["tokenizer"]["fingerprint"],
        )

    def _wrap(self, model: GPT) -> torch.nn.Module:
        """compile, then DDP: the wrapped module is used for the training step only."""
        wrapped: torch.nn.Module = model
        if self.config.compile:
            wrapped = torch.compile(model)
        if self.runtime.distributed:
            from torch.nn.parallel import DistributedDataParallel

            device_ids = [self.runtime.local_rank] if self.runtime.device.type == "cuda" else None
            wrapped = DistributedDataParallel(wrapped, device_ids=device_ids)
        return wrapped

    # ------------------------------------------------------------ the loop

    def fit(self) -> TrainResult:
        config, runtime = self.config, self.runtime
        device = runtime.device
        out = Path(config.out)
        seed_everything(config.seed)
        model = GPT(config.model).to(device)
        optimizer = build_optimizer(model, config.optimizer, device.type)
        train_loader = self._loader("train")
        val_loader = self._loader("val") if "val" in self.manifest["splits"] else None
        token_bytes = load_token_bytes(config.data, device) if val_loader is not None else None
        step, tokens_seen, best_val, elapsed_before = 0, 0, None, 0.0

        checkpoints = list_checkpoints(out) if self.resume else []
        if checkpoints:
            state, rng = load_checkpoint(checkpoints[-1], model, optimizer, device)
            self._check_same_run(state)
            step, tokens_seen, best_val = state["step"], state["tokens"], state.get("best_val_loss")
            elapsed_before = state.get("elapsed", 0.0)
            train_loader.load_state_dict(state["loader"][runtime.rank])
            set_rng_state(rng)
            self.print(f"resumed from {checkpoints[-1]} at step {step}")
        elif runtime.is_main:
            out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(out / "train_config.json", json.dumps(dataclasses.asdict(config), indent=1) + "\n")

        wrapped = self._wrap(model)
        cast = autocast(device, self.precision)
        scaler = torch.amp.GradScaler(device.type, enabled=self.precision == "fp16")
        metrics = MetricsLog(out, runtime.is_main, config.tensorboard, config.wandb, dataclasses.asdict(config))
        flops, peak = _flops_per_token(config), _peak(config, device)
        self.print(
            f"training {model.num_params():,} parameters on {device} ({self.precision}"
            f"{', compiled' if config.compile else ''}{f', {runtime.world_size} ranks' if runtime.distributed else ''}): "
            f"{config.batch_tokens:,} tokens/step = {self.accum} x {config.micro_batch} x {config.seq_len}"
            f"{f' x {runtime.world_size}' if runtime.distributed else ''}, steps {step}..{config.max_steps}"
        )

        losses: list[float] = []
        val_result: dict | None = None
        status = "finished"
        checkpoint_path = None
        start_time = time.perf_counter()
        start_step = step

        def save(current_val: float | None) -> Path:
            states = self._gather_loader_states(train_loader)
            trainer_state = {
                "step": step,
                "tokens": tokens_seen,
                "loader": states,
                "best_val_loss": best_val,
                "elapsed": elapsed_before + time.perf_counter() - start_time,
                "data": str(config.data),
                "tokenizer_fingerprint": self.manifest["tokenizer"]["fingerprint"],
                "config": dataclasses.asdict(config),
            }
            if not runtime.is_main:
                return None
            path = save_checkpoint(out, step, model, optimizer, trainer_state, rng_state(), config.keep_last, current_val)
            self._copy_tokenizer(path)
            return path

        def evaluate() -> dict | None:
            nonlocal best_val
            if val_loader is None:
                return None
            val_loader.reset()
            result = evaluate_loss(model, val_loader, config.eval_batches, token_bytes, cast)
            best_val = result["loss"] if best_val is None else min(best_val, result["loss"])
            metrics.log({"step": step, "val_loss": result["loss"], "val_bpb": result["bpb"]})
            self.print(f"step {step:>6}: val loss {result['loss']:.4f}, val bpb {result['bpb']:.4f} ({result['tokens']:,} tokens)")
            return result

        model.train()
        try:
            while step < config.max_steps:
                step_start = time.perf_counter()
                lr = learning_rate(step, config.optimizer.lr, config.max_steps, config.schedule)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                loss_sum = torch.zeros((), device=device)
                for micro in range(self.accum):
                    x, y = train_loader.next_batch()
                    last = micro == self.accum - 1
                    sync = wrapped.no_sync() if runtime.distributed and not last else nullcontext()
                    with sync:
                        with cast:
                            _, loss = wrapped(x, y)
                        loss = loss / self.accum
                        loss_sum += loss.detach()
                        scaler.scale(loss).backward()
                if runtime.distributed:
                    torch.distributed.all_reduce(loss_sum, op=torch.distributed.ReduceOp.AVG)
                loss_value = loss_sum.item()
                if not math.isfinite(loss_value):
                    last_good = list_checkpoints(out)
                    where = f"the last good checkpoint is {last_good[-1]}" if last_good else "no checkpoint was saved yet"
                    raise GptlabError(f"loss is {loss_value} at step {step}: stopped before updating the weights; {where}")
                scaler.unscale_(optimizer)
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip if config.grad_clip > 0 else float("inf"))
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                step += 1
                tokens_seen += config.batch_tokens
                losses.append(loss_value)
                seconds = time.perf_counter() - step_start
                if step % config.log_every == 0 or step == config.max_steps:
                    rate = config.batch_tokens / seconds
                    record = {
                        "step": step, "loss": loss_value, "lr": lr, "grad_norm": float(norm), "tokens": tokens_seen,
                        "tokens_per_s": rate, "mfu": _mfu(flops, rate, peak), "elapsed": time.perf_counter() - start_time,
                    }
                    metrics.log(record)
                    done = step - start_step
                    eta = (time.perf_counter() - start_time) / done * (config.max_steps - step) if done else None
                    self.print(console_line(record, config.max_steps, eta))
                out_of_time = config.time_limit > 0 and time.perf_counter() - start_time >= config.time_limit
                if config.eval_every and step % config.eval_every == 0 and step < config.max_steps and not out_of_time:
                    val_result = evaluate()
                if self.task_fn and config.hellaswag_every and step % config.hellaswag_every == 0:
                    self._run_tasks(model, step, metrics)
                if config.sample_every and step % config.sample_every == 0 and step < config.max_steps:
                    self._sample(model)
                if config.checkpoint_every and step % config.checkpoint_every == 0 and step < config.max_steps:
                    checkpoint_path = save(val_result["loss"] if val_result else None)
                if out_of_time:
                    status = "time limit"
                    break
        except KeyboardInterrupt:
            status = "interrupted"
            self.print(f"interrupted at step {step}: saving a checkpoint")
            checkpoint_path = save(None)
            metrics.close()
            return TrainResult(step, losses[-1] if losses else float("nan"), None, None, checkpoint_path, time.perf_counter() - start_time, status, losses)
        except torch.OutOfMemoryError:
            raise GptlabError(
                f"out of GPU memory with micro_batch {config.micro_batch} x seq_len {config.seq_len}: "
                f"try --micro_batch {max(1, config.micro_batch // 2)} (the step's batch stays the same; accumulation grows)"
            ) from None

        val_result = evaluate()
        checkpoint_path = save(val_result["loss"] if val_result else None)
        self._sample(model)
        if runtime.is_main:
            plot = plot_losses(metrics.records(), out / "loss.png")
            if plot:
                self.print(f"loss plot -> {plot}")
        metrics.close()
        return TrainResult(
            steps=step,
            final_loss=losses[-1] if losses else float("nan"),
            val_loss=val_result["loss"] if val_result else None,
            val_bpb=val_result["bpb"] if val_result else None,
            checkpoint=checkpoint_path,
            seconds=time.perf_counter() - start_time,
            status=status,
            losses=losses,
        )

    # ------------------------------------------------------------ helpers

    def _check_same_run(self, state: dict) -> None:
        """Resuming with a different model, batch or data would silently be a different run."""
        saved = state.get("config", {})
        current = dataclasses.asdict(self.config)
        keys = ("model", "batch_tokens", "micro_batch", "seq_len", "loader_mode", "seed")
        changed = [key for key in keys if saved.get(key) != current.get(key)]
        if changed:
            raise GptlabError(
                f"{self.config.out} holds checkpoints of a run with other settings ({', '.join(changed)}); "
                "use another --out, or the same settings to resume"
            )
        if state.get("tokenizer_fingerprint") != self.manifest["tokenizer"]["fingerprint"]:
            raise GptlabError("the checkpoint was trained on data from another tokenizer than --data's")

    def _gather_loader_states(self, loader: ShardLoader) -> list[dict]:
        state = loader.state_dict()
        if not self.runtime.distributed:
            return [state]
        states: list = [None] * self.runtime.world_size
        torch.distributed.all_gather_object(states, state)
        return states

    def _copy_tokenizer(self, checkpoint: Path) -> None:
        """A checkpoint carries its tokenizer (when given), so `gptlab sample --checkpoint` needs nothing else."""
        if not self.config.tokenizer:
            return
        source = Path(self.config.tokenizer)
        source = source / "tokenizer.json" if source.is_dir() else source
        if source.is_file():
            (checkpoint / "tokenizer").mkdir(exist_ok=True)
            shutil.copyfile(source, checkpoint / "tokenizer" / "tokenizer.json")

    def _run_tasks(self, model: GPT, step: int, metrics: MetricsLog) -> None:
        """Benchmarks on the plain module, every rank taking its share (the task all-reduces its counts)."""
        was_training = model.training
        model.eval()
        scores = self.task_fn(model)
        if was_training:
            model.train()
        metrics.log({"step": step, **scores})
        self.print(f"step {step:>6}: " + ", ".join(f"{key} {value:.4f}" for key, value in scores.items()))

    def _sample(self, model: GPT) -> None:
        if self.sample_fn is None or not self.runtime.is_main:
            return
        was_training = model.training
        model.eval()
        self.print("sample: " + self.sample_fn(model))
        if was_training:
            model.train()


def _flops_per_token(config: TrainConfig) -> float:
    """Training FLOPs per token, 6N + 12 L d T (PaLM appendix B, as nanoGPT's estimate_mfu)."""
    return float(flops_per_token(config.model, config.seq_len)["training"])


def _peak(config: TrainConfig, device: torch.device) -> float | None:
    """The peak FLOP/s for MFU: --mfu_peak (a name or a number), or the GPU's datasheet figure; none on CPU."""
    if config.mfu_peak != "auto":
        return peak_flops(config.mfu_peak)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).lower()
    return next((PEAK_FLOPS[key] for key in ("h200", "h100", "a100") if key in name), None)


def _mfu(flops: float, tokens_per_second: float, peak: float | None) -> float | None:
    return flops * tokens_per_second / peak if peak else None
