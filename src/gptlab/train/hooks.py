"""What the Trainer reports besides each step's line: its opening line, evaluations, tasks, samples, the run's report.

The training loop (gptlab.train.trainer) calls these at the steps the config names (eval_every,
hellaswag_every or a subclass's task_every, sample_every, checkpoint_every) and at the end. All of them use the
plain module, never the compiled or data-parallel wrapper, so compile never gets in their way.
Rank 0 also writes what the run's report reads (gptlab.runs): OUT/machine.json as training begins,
OUT/samples.jsonl as it samples, and OUT/report.html at the end and at checkpoints (while that stays cheap).
MFU is the training FLOPs per token (6N + 12 L d T) times tokens per second over the device's peak.

Not here: val loss itself (gptlab.eval.loss), the report's pages (gptlab.runs), the metrics sinks (gptlab.train.metrics).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from gptlab.eval.loss import evaluate_loss
from gptlab.model.accounting import PEAK_FLOPS, flops_per_token, peak_flops
from gptlab.parallel.expert import experts_elsewhere
from gptlab.parallel.wrap import describe, sharded_forward
from gptlab.runs import append_sample, describe_machine, write_machine, write_report
from gptlab.runs.report import REPORT_FILE
from gptlab.train.config import TrainConfig

# A checkpoint refreshes the report only while that costs under this share of the training time since the last one.
REPORT_SHARE = 0.05


class HooksMixin:
    """The Trainer's reporting (module docstring); it uses the Trainer's config, runtime, model, state and metrics."""

    def _announce(self) -> None:
        config, runtime, model = self.config, self.runtime, self.model
        self.flops, self.peak = _flops_per_token(config), _peak(config, runtime.device)
        ranks = f", {runtime.world_size} ranks, {describe(config.parallel)}" if runtime.distributed else ""
        init = f", from {config.init_from}" if config.init_from and self.state.step == 0 else ""
        self.print(
            f"training {model.num_params() + experts_elsewhere(model):,} parameters on {runtime.device} ({self.precision}"
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
        if not self.config.sample_tokens or self.sample_fn is None or self.tokenizer is None or not self.runtime.is_main:
            return  # --sample-tokens 0: no samples
        if sharded_forward(self.model):
            return  # under FSDP or expert parallelism a forward on rank 0 alone would wait forever for the others
        was_training = self.model.training
        self.model.eval()
        text = self.sample_fn(self.model, self.tokenizer)
        self.print("sample: " + text)
        append_sample(self.config.out, self.state.step, text)
        if was_training:
            self.model.train()

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

    def _mfu(self, tokens_per_second: float) -> float | None:
        """Model FLOPs utilisation at this rate (None without a peak to divide by, e.g. on CPU)."""
        return self.flops * tokens_per_second / self.peak if self.peak else None


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
