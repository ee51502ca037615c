"""Profiling a training step: where its time and memory go, beside the paper arithmetic of gptlab.model.accounting.

`profile_training` builds the model (random weights: a step's time and memory do not depend on their
values), its optimizer and a batch of random ids, runs the Trainer's step in three phases, and writes:

    profile.json            every figure below ({"format": "gptlab-profile", "version": 1, ...})
    ops.txt                 the ops of the traced steps by self time: CPU, and CUDA where it ran
    trace.json              the torch.profiler trace of those steps, phases labelled (chrome://tracing, ui.perfetto.dev)
    memory_timeline.json    the profiler's memory by category over one more step, [times (us), [bytes per
                            category]] (export_memory_timeline; torch 2.13 builds it for the CPU too)
    memory_snapshot.pickle  CUDA only: the allocator's history (torch.cuda.memory._record_memory_history), for
                            pytorch.org/memory_viz

    time    forward (autocast, with the loss), backward, optimizer (unscale, clip to grad_clip, step, zero_grad):
            mean and std over `steps` steps after `warmup`, each phase closed by `synchronize`
    memory  the peak over the warm-up steps, from before the model is built: CUDA max_memory_allocated; CPU the
            most bytes of tensor storage alive at once (LiveTensorBytes), the allocator's slack in neither;
            beside it training_memory's estimate and the profiler timeline's own peak
    FLOPs   per token from accounting (6N + 12 L d T), and counted by torch.utils.flop_counter over one step
            with math attention (its matmuls are counted; the CPU's SDPA kernel has no FLOP formula)
    MFU     accounting FLOPs per token x tokens/s over the device's peak: a GPU's datasheet figure (PEAK_FLOPS, by
            its name) in bf16, else n x n matmuls timed here for a second at the step's precision (n: the MLP's
            width within [1024, 2048] on CPU, [1024, 8192] on CUDA, as `model info --measure`)

With activation checkpointing the step is also measured without it (time and peak memory), to show the trade.
`log` hears one line as each phase begins (the whole takes a minute for the demo model on a CPU). The
profiler's C++ side (kineto) writes "USDT: ... profiler_start" lines to stderr at every start and stop,
whatever KINETO_LOG_LEVEL says: fd 2 is caught around each profiler session and every other line passed on.
Not here: the Trainer (gptlab.train.trainer), the quick `model info --measure` (gptlab.train.measure).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, record_function
from torch.utils.flop_counter import FlopCounterMode

from gptlab.model import GPT, ModelConfig
from gptlab.model.accounting import PEAK_FLOPS, flops_per_token, param_counts, training_memory
from gptlab.runs.machine import cpu_model, usable_cores
from gptlab.runtime import GptlabError, atomic_write_text, check_out_dir
from gptlab.runtime.device import autocast
from gptlab.train.measure import matmul_size, measure_matmul_peak, synchronize, warm_up_measuring_memory
from gptlab.train.optim import OptimizerConfig, build_optimizer

FORMAT, VERSION = "gptlab-profile", 1
PROFILE_FILES = ("profile.json", "ops.txt", "trace.json", "memory_timeline.json", "memory_snapshot.pickle",
                 ".profile-*")  # the last: a temporary folder an interrupted export left
PHASES = ("forward", "backward", "optimizer")
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True, kw_only=True)
class ProfileConfig:
    model: ModelConfig = field(default_factory=ModelConfig)  # the architecture (--model.*)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)  # AdamW or Muon (--optimizer.*)
    batch_size: int = 8  # sequences per step
    seq_len: int = 0  # tokens per sequence (0: the model's block_size)
    precision: str = "fp32"  # fp32 | bf16 (autocast; the weights stay fp32)
    steps: int = 10  # timed steps
    warmup: int = 3  # steps before timing (at least 2: the optimizer makes its state in the first)
    trace_steps: int = 2  # steps the torch.profiler records (after the timed ones)
    grad_clip: float = 1.0  # clip the gradient norm to this (0: no clipping), as the Trainer does
    fused_loss: bool = True  # the Trainer's fused head + cross-entropy (gptlab.model.loss)
    activation_checkpointing: bool = False  # recompute each block in backward; also measured without, to compare
    peak_seconds: float = 1.0  # how long the matmul peak is timed where no datasheet figure applies

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.steps < 1 or self.trace_steps < 1:
            raise GptlabError(f"batch, steps and trace steps must be at least 1, got {self.batch_size}, {self.steps}, "
                              f"{self.trace_steps}")
        if self.warmup < 2:
            raise GptlabError(f"--warmup must be at least 2 (the optimizer makes its state in the first step), got {self.warmup}")
        if self.precision not in PRECISIONS:
            raise GptlabError(f"precision must be one of {', '.join(PRECISIONS)} here, got {self.precision!r}")
        if not 0 <= self.seq_len <= self.model.block_size:
            raise GptlabError(f"seq_len {self.seq_len} is longer than the model's context ({self.model.block_size}); "
                              f"pass --seq-len {self.model.block_size} or less")
        if self.grad_clip < 0 or self.peak_seconds <= 0:
            raise GptlabError(f"grad_clip must be 0 or more and peak_seconds above 0, got {self.grad_clip}, {self.peak_seconds}")

    @property
    def tokens_per_sequence(self) -> int:
        return self.seq_len or self.model.block_size


@dataclass
class _Step:
    """A model, its optimizer and a batch on the device; `run()` is one training step, timed by phase."""

    model: GPT
    optimizer: torch.optim.Optimizer
    batch: tuple[torch.Tensor, torch.Tensor]
    config: ProfileConfig
    device: torch.device

    def forward(self) -> torch.Tensor:
        with autocast(self.device, self.config.precision):
            return self.model(*self.batch, fused_loss=self.config.fused_loss)[1]

    def run(self) -> tuple[float, float, float]:
        """(forward, backward, optimizer) seconds; the loss is read back at the end, as the Trainer does."""
        synchronize(self.device)
        start = time.perf_counter()
        with record_function("forward"):
            loss = self.forward()
            synchronize(self.device)
        forward = time.perf_counter()
        with record_function("backward"):
            loss.backward()
            synchronize(self.device)
        backward = time.perf_counter()
        with record_function("optimizer"):
            clip = self.config.grad_clip if self.config.grad_clip > 0 else float("inf")
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            synchronize(self.device)
        end = time.perf_counter()
        if not torch.isfinite(loss.detach()).item():
            raise GptlabError(f"the profiled step gave a loss of {loss.item()}; try --precision fp32")
        return forward - start, backward - forward, end - backward

    __call__ = run  # what warm_up_measuring_memory runs


def build_step(config: ProfileConfig, device: torch.device, *, checkpointing: bool) -> _Step:
    """The model, optimizer (each group at the peak lr, as the schedule sets it) and random ids of one step."""
    torch.manual_seed(0)
    model = GPT(config.model).to(device).train().set_activation_checkpointing(checkpointing)
    optimizer = build_optimizer(model, config.optimizer, device.type)
    for group in optimizer.param_groups:
        group["lr"] = config.optimizer.lr * group.get("lr_ratio", 1.0)
    shape = (2, config.batch_size, config.tokens_per_sequence)
    x, y = torch.randint(0, config.model.vocab_size, shape, device=device)
    return _Step(model, optimizer, (x, y), config, device)


def _mean_std(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def measure_step(config: ProfileConfig, device: torch.device, *, checkpointing: bool) -> tuple[_Step, dict, dict]:
    """Build, warm up measuring peak memory, then time `steps` steps: (step, times by phase, memory)."""
    step, peak, kind = warm_up_measuring_memory(lambda: build_step(config, device, checkpointing=checkpointing),
                                                device, config.warmup)
    runs = [step.run() for _ in range(config.steps)]
    times = {phase: _mean_std([run[i] for run in runs]) for i, phase in enumerate(PHASES)}
    times["step"] = _mean_std([sum(run) for run in runs])
    return step, times, {"peak": peak, "kind": kind}


def count_flops(step: _Step) -> int:
    """FLOPs of one forward and backward as torch.utils.flop_counter counts them: matmuls only, attention through
    the math path so its two matmuls count (the CPU's SDPA kernel has no formula), experts through the per-expert
    loop (the same numbers, each expert's matmul on its own tokens); the weights are not stepped."""
    impl = step.model.transformer["h"][0].attn.impl
    step.model.set_attention("math")
    layers = step.model.moe_layers()
    settings = [layer.moe for layer in layers]
    for layer in layers:  # the per-expert loop: F.grouped_mm has no FLOP formula, its padded fallback counts padding
        layer.moe = dataclasses.replace(layer.moe, impl="loop")
    try:
        with FlopCounterMode(display=False) as counter:
            step.forward().backward()
    finally:
        step.model.set_attention(impl)
        for layer, moe in zip(layers, settings, strict=True):
            layer.moe = moe
        step.optimizer.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def device_peak(config: ProfileConfig, device: torch.device) -> tuple[float, str]:
    """(FLOP/s, where it comes from): a known GPU's bf16 datasheet peak, else this device's measured matmuls."""
    if device.type == "cuda" and config.precision == "bf16":
        name = torch.cuda.get_device_name(device)
        key = next((key for key in ("h200", "h100", "a100") if key in name.lower()), None)
        if key:
            return PEAK_FLOPS[key], f"datasheet: {name}, bf16 dense (accounting.PEAK_FLOPS[{key!r}])"
    size = matmul_size(config.model, device)
    peak = measure_matmul_peak(device, config.precision, size, seconds=config.peak_seconds)
    return peak, f"measured: {config.precision} {size} x {size} matmuls for {config.peak_seconds:g} s on {device.type}"


# The memory timeline's columns after the first (always 0): torch.profiler._memory_profiler's categories, in order.
TIMELINE_CATEGORIES = ("parameter", "optimizer_state", "input", "temporary", "activation", "gradient", "autograd_detail",
                       "unknown")


def _export(path: Path, write: Callable[[str], object]) -> None:
    """Run a writer that takes a file name and picks the format from its suffix, then rename its file into place:
    a crash leaves the old file or none, never half a trace."""
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".profile-{path.name}.") as folder:
        target = Path(folder) / path.name
        write(str(target))
        os.replace(target, path)


def timeline_peak(timeline: list) -> dict[str, int]:
    """The moment of the memory timeline with the most bytes: its total and its bytes by category."""
    times, sizes = timeline
    if not times:
        return {"total": 0}
    peak = max(sizes, key=lambda row: sum(row[1:]))
    return {"total": sum(peak[1:]), **dict(zip(TIMELINE_CATEGORIES, peak[1:], strict=False))}


# kineto's own log lines: "USDT:2026-11-26 09:36:44 14716:14716 SyncActivityProfilerHandler.cpp:52] profiler_start"
KINETO_LINE = re.compile(r"^[A-Z]+:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \w+\.cpp:\d+\] ")


@contextlib.contextmanager
def without_kineto_lines() -> Iterator[None]:
    """Catch what is written to fd 2 meanwhile (C++ writes there directly, past sys.stderr), and pass on
    every line but kineto's: a warning or error of the profiled code still shows, after the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not KINETO_LINE.match(line)))
            sys.stderr.flush()


def trace(step: _Step, out: Path, steps: int, log: Callable[[str], None] = lambda _: None) -> tuple[dict[str, int], dict]:
    """Record `steps` steps with torch.profiler into trace.json and ops.txt, then one more with stacks for
    memory_timeline.json (and the CUDA allocator's snapshot); return the timeline's peak by category and the
    mixture of experts' ranges (moe_ranges; empty for a dense model).

    Two sessions: the memory timeline needs with_stack, which also puts every Python frame into the ops table."""
    cuda = step.device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    log(f"tracing {steps} steps with torch.profiler")
    with without_kineto_lines(), torch.profiler.profile(activities=activities, record_shapes=True, profile_memory=True) as profiler:
        for _ in range(steps):
            step.run()
    log("writing trace.json and ops.txt")
    _export(out / "trace.json", profiler.export_chrome_trace)
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    table = profiler.key_averages().table(sort_by=sort, row_limit=20, max_name_column_width=64)
    table = "\n".join(line.rstrip() for line in table.splitlines())
    atomic_write_text(out / "ops.txt", f"top ops by self time over {steps} traced steps ({sort})\n{table}\n")
    ranges = moe_ranges(profiler.key_averages(), cuda) if step.model.config.is_moe else {}
    if cuda:
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    log("recording one more step's memory timeline (with stacks)")
    # record_shapes, profile_memory and with_stack: what the memory timeline needs to tell tensors apart
    with without_kineto_lines(), torch.profiler.profile(activities=activities, record_shapes=True, profile_memory=True,
                                                        with_stack=True) as profiler:
        step.run()
    log("writing memory_timeline.json")
    if cuda:
        _export(out / "memory_snapshot.pickle", torch.cuda.memory._dump_snapshot)
        torch.cuda.memory._record_memory_history(enabled=None)
    device = f"cuda:{step.device.index or 0}" if cuda else "cpu"
    with warnings.catch_warnings():  # deprecated for CUDA in favour of the snapshot above; the CPU has nothing else
        warnings.simplefilter("ignore", FutureWarning)
        _export(out / "memory_timeline.json", lambda path: profiler.export_memory_timeline(path, device=device))
    return timeline_peak(json.loads((out / "memory_timeline.json").read_text())), ranges


# record_function ranges of gptlab.model.moe's forward: the router (matmul, scores, top-k, sort by expert), the
# dispatch (gathering each expert's tokens, weighting and adding the outputs back) and the experts' matmuls.
MOE_RANGES = ("moe.router", "moe.dispatch", "moe.experts")
STEP_RANGES = ("forward", "backward", "optimizer")


def moe_ranges(events, cuda: bool) -> dict:
    """Seconds inside each MoE range over the traced steps, and each one's share of the steps' time (forward,
    backward and optimizer ranges). Forward only: autograd runs the backward ops outside the ranges. On CUDA the
    ranges' device time where the profiler gives it (the CPU time there is launch time)."""
    def seconds(name: str) -> float:
        found = [event for event in events if event.key == name]
        if not found:
            return 0.0
        device = getattr(found[0], "device_time_total", 0.0) if cuda else 0.0
        return (device or found[0].cpu_time_total) / 1e6

    step = sum(seconds(name) for name in STEP_RANGES)
    times = {name.removeprefix("moe."): seconds(name) for name in MOE_RANGES}
    return {"seconds": times, "share": {name: value / step if step else 0.0 for name, value in times.items()},
            "step_seconds": step}


def _estimate(config: ProfileConfig, device: torch.device, checkpointing: bool) -> dict[str, int]:
    """training_memory for this step: AdamW's two moments (Muon keeps one per matrix: the estimate leans high)."""
    flash = device.type == "cuda" or config.model.dropout == 0
    return training_memory(config.model, config.batch_size, config.tokens_per_sequence, param_dtype="fp32",
                           amp=config.precision, optimizer="adamw", flash_attention=flash,
                           activation_checkpointing=checkpointing, fused_loss=config.fused_loss)


def profile_training(config: ProfileConfig, device: torch.device, out: str | os.PathLike,
                     log: Callable[[str], None] = lambda _: None) -> dict:
    """Measure, trace and count one training step of `config` on `device`; write OUT (module docstring); return
    the summary that profile.json holds. A non-empty OUT holding anything else is refused before any work.
    `log` hears a line as each phase begins: the whole is quiet for a minute otherwise."""
    out = Path(out)
    for name in check_out_dir(out, PROFILE_FILES):  # a rerun's own files: the old ones would mislead
        shutil.rmtree(out / name) if (out / name).is_dir() else (out / name).unlink()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    checkpointing = config.activation_checkpointing
    log(f"building the model; {config.warmup} warm-up steps (measuring peak memory), then {config.steps} timed steps")
    step, times, memory = measure_step(config, device, checkpointing=checkpointing)
    out.mkdir(parents=True, exist_ok=True)
    timeline, ranges = trace(step, out, config.trace_steps, log)
    log("counting one step's FLOPs (FlopCounterMode)")
    counted = count_flops(step)
    del step
    log("finding this device's matmul peak")
    peak, peak_source = device_peak(config, device)
    tokens = config.batch_size * config.tokens_per_sequence
    flops = flops_per_token(config.model, config.tokens_per_sequence)
    tokens_per_second = tokens / times["step"]["mean"]
    summary = {
        "format": FORMAT, "version": VERSION, "started": started, "machine": _machine(device, load),
        "config": dataclasses.asdict(config), "seq_len": config.tokens_per_sequence, "tokens_per_step": tokens,
        "seconds": times, "tokens_per_second": tokens_per_second,
        "flops_per_token": {"accounting": flops["training"], "accounting_forward": flops["forward"],
                            "counted": counted / tokens},
        "achieved_flops": flops["training"] * tokens_per_second, "peak_flops": peak, "peak_source": peak_source,
        "mfu": flops["training"] * tokens_per_second / peak,
        "memory": {**memory, "estimate": _estimate(config, device, checkpointing), "profiler_timeline_peak": timeline},
    }
    if config.model.is_moe:
        counts = param_counts(config.model)
        summary["moe"] = {**ranges, "active_params": counts["active"], "total_params": counts["total"],
                          "matmul_params": flops["matmul_params"]}
    if checkpointing:
        log(f"the same step without activation checkpointing, to compare: {config.warmup} warm-up and {config.steps} timed steps")
        _, without_times, without_memory = measure_step(config, device, checkpointing=False)
        summary["without_checkpointing"] = {"seconds": without_times, "memory": {
            **without_memory, "estimate": _estimate(config, device, False)}}
    summary["files"] = sorted({path.name for path in out.iterdir() if not path.name.startswith(".")} | {"profile.json"})
    atomic_write_text(out / "profile.json", json.dumps(summary, indent=1) + "\n")
    return summary


def _machine(device: torch.device, load: float | None) -> dict:
    """What ran it: the device's name, torch, the cores and the load when it started (a shared machine shows)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    return {"device": str(device), "name": name, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cores": usable_cores(), "load_average_1min": load}


MIB = 2**20


def _seconds(times: dict) -> str:
    return f"{times['mean']:.4f} ± {times['std']:.4f} s"


def _rate(flops: float) -> str:
    return f"{flops / 1e12:,.2f} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:,.2f} GFLOP/s"


def describe(summary: dict, name: str = "") -> list[str]:
    """The summary as the lines `gptlab profile` prints (the ops table follows them)."""
    config, machine, memory = summary["config"], summary["machine"], summary["memory"]
    times, flops = summary["seconds"], summary["flops_per_token"]
    load = f", load {machine['load_average_1min']:.1f} at start" if machine["load_average_1min"] is not None else ""
    lines = [
        f"profile     {name or 'model'} on {machine['device']} ({machine['name']}, {machine['threads']} threads{load}, "
        f"torch {machine['torch']}): {config['precision']}, batch {config['batch_size']} x {summary['seq_len']} = "
        f"{summary['tokens_per_step']:,} tokens, {config['optimizer']['kind']}, activation checkpointing "
        f"{'on' if config['activation_checkpointing'] else 'off'}",
        f"time        forward {_seconds(times['forward'])}, backward {_seconds(times['backward'])}, optimizer "
        f"{_seconds(times['optimizer'])}; step {_seconds(times['step'])} ({config['steps']} steps after "
        f"{config['warmup']} warm-up): {summary['tokens_per_second']:,.0f} tokens/s",
        f"FLOPs/token accounting {flops['accounting']:,} (6N + 12 L d T; forward {flops['accounting_forward']:,}); "
        f"counted by FlopCounterMode {flops['counted']:,.0f} (x{flops['counted'] / flops['accounting']:.3f})",
        f"MFU         {summary['mfu']:.1%}: achieved {_rate(summary['achieved_flops'])} of {_rate(summary['peak_flops'])} "
        f"({summary['peak_source']})",
        f"memory      peak {memory['peak'] / MIB:,.1f} MiB ({memory['kind']}); estimate {memory['estimate']['total'] / MIB:,.1f} "
        f"MiB (accounting.training_memory, estimate / measured {memory['estimate']['total'] / memory['peak']:.2f})",
        "            estimate " + _by_category(memory["estimate"], ESTIMATE_PARTS)
        + (" (logits: one chunk of the fused loss's)" if config["fused_loss"] else ""),
        "            profiler timeline peak " + _by_category(memory["profiler_timeline_peak"], TIMELINE_CATEGORIES),
    ]
    if "moe" in summary:
        lines.append(_describe_moe(summary["moe"]))
    without = summary.get("without_checkpointing")
    if without:
        peak, before = memory["peak"], without["memory"]["peak"]
        step, slower = times["step"]["mean"], without["seconds"]["step"]["mean"]
        lines.append(f"checkpoint  peak {peak / MIB:,.1f} MiB vs {before / MIB:,.1f} MiB without ({peak / before - 1:+.0%}); "
                     f"step {step:.4f} s vs {slower:.4f} s without ({step / slower - 1:+.0%})")
    lines.append(f"files       {', '.join(summary['files'])} (trace.json: chrome://tracing or ui.perfetto.dev)")
    return lines


def _describe_moe(moe: dict) -> str:
    """The router's, dispatch's and experts' share of the traced steps, and what the FLOPs and MFU counted."""
    share, seconds = moe["share"], moe["seconds"]
    parts = ", ".join(f"{name} {share[name]:.1%} ({seconds[name]:.4f} s)" for name in ("router", "dispatch", "experts"))
    return (f"MoE         of the traced steps' time, forward ranges: {parts}; FLOPs and MFU count the "
            f"{moe['active_params']:,} active of {moe['total_params']:,} parameters (N = {moe['matmul_params']:,} active matmul)")


ESTIMATE_PARTS = ("parameters", "gradients", "optimizer", "activations", "weight_casts", "logits", "logit_grads")


def _by_category(parts: dict[str, int], names: tuple[str, ...]) -> str:
    """"148.7 MiB: parameter 9.0, activation 128.6": the total and its non-zero parts."""
    shown = [f"{name.replace('_', ' ')} {parts[name] / MIB:,.1f}" for name in names if parts.get(name)]
    return f"{parts['total'] / MIB:,.1f} MiB" + (f": {', '.join(shown)}" if shown else "")
