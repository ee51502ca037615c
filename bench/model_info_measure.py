"""`gptlab model info --measure` against a real Trainer run of the same model and micro-batch, side by side.

    .venv/bin/python bench/model_info_measure.py                       # CPU: the shakespeare-cpu model, 32 x 128
    .venv/bin/python bench/model_info_measure.py --model gpt2 --batch 16 --seq-len 1024 --device cuda

The question: do the figures --measure prints (in seconds, before any data is prepared) predict what
training then does? Each side runs in a fresh process (its own allocator and peak), `--rounds` times
in turn, and the medians are compared:

- measure: gptlab.train.measure.measure_training, exactly what --measure prints: tokens/s over the
  timed steps, the peak memory over the warm-up steps.
- trainer: gptlab.train.Trainer on shards of random token ids (the speed does not depend on them),
  micro-batch = batch (no accumulation), `warmup + steps` steps, no evaluation. Tokens/s over the
  steps after the warm-up (from its metrics.jsonl); peak memory over the fit, counted the same way
  (CUDA: torch.cuda.max_memory_allocated; CPU: the live tensor bytes of gptlab.train.measure, in a
  separate run of the warm-up steps, since counting slows every op).

Printed: both, their ratio (measure / trainer: 1.00 = --measure predicted training exactly), and
training_memory's paper estimate against the trainer's peak.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from machine import header

from gptlab.data.shards import MANIFEST_FORMAT, MANIFEST_NAME, VERSION, dtype_for, write_shard
from gptlab.model import ModelConfig, preset
from gptlab.runtime.device import init_runtime, resolve_precision
from gptlab.train import PRESETS, TrainConfig, Trainer, train_preset
from gptlab.train.measure import LiveTensorBytes, measure_training

GIB = 2**30
FINGERPRINT = "0123456789abcdef"  # no tokenizer: the shards hold random ids


def model_config(name: str, seq_len: int) -> ModelConfig:
    """A training preset's model (shakespeare-cpu) or a model preset (gpt2), its context at least seq_len."""
    config = train_preset(name).model if name in PRESETS else preset(name)
    return config if config.block_size >= seq_len else dataclasses.replace(config, block_size=seq_len)


def random_shards(folder: Path, vocab_size: int, tokens: int) -> Path:
    """A prepared folder of one train shard of random ids (what the Trainer reads; no tokenizer, no val split)."""
    folder.mkdir(parents=True)
    ids = np.random.default_rng(0).integers(0, vocab_size, size=tokens).astype(dtype_for(vocab_size))
    write_shard(folder / "train_000000.bin", ids, n_documents=1, fingerprint=FINGERPRINT)
    manifest = {"format": MANIFEST_FORMAT, "version": VERSION, "dtype": str(np.dtype(dtype_for(vocab_size))),
                "tokenizer": {"fingerprint": FINGERPRINT, "vocab_size": vocab_size, "eot_id": 0},
                "splits": {"train": {"tokens": tokens, "documents": 1,
                                     "shards": [{"file": "train_000000.bin", "tokens": tokens, "documents": 1}]}}}
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest))
    return folder


def run_measure(args, config: ModelConfig, device: torch.device, precision: str) -> dict:
    m = measure_training(config, batch_size=args.batch, seq_len=args.seq_len, precision=precision, device=device,
                         steps=args.steps, warmup=args.warmup)
    return {"tokens_per_second": m.tokens_per_second, "peak_memory": m.peak_memory, "memory_kind": m.memory_kind,
            "estimated_memory": m.estimated_memory, "mfu": m.mfu, "peak_flops": m.peak_flops}


def run_trainer(args, config: ModelConfig, device: torch.device, precision: str) -> dict:
    steps = args.warmup + args.steps
    with tempfile.TemporaryDirectory() as root:
        data = random_shards(Path(root) / "data", config.vocab_size, steps * args.batch * args.seq_len + 1)
        train = TrainConfig(data=str(data), out=str(Path(root) / "run"), model=config, batch_tokens=args.batch * args.seq_len,
                            micro_batch=args.batch, seq_len=args.seq_len, max_steps=steps, precision=precision,
                            device=str(device), eval_every=0, checkpoint_every=0, log_every=1)
        runtime = init_runtime(str(device))
        if device.type == "cuda":  # the allocator's own count costs nothing: one run gives both figures
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            Trainer(train, runtime=runtime, log=lambda line: None, resume=False).fit()
            peak = torch.cuda.max_memory_allocated(device) - before
        else:  # counting live tensors slows every op: a short run for the memory, then an untouched one for the speed
            short = dataclasses.replace(train, out=str(Path(root) / "memory"), max_steps=args.warmup)
            with LiveTensorBytes(device.type) as live:
                Trainer(short, runtime=runtime, log=lambda line: None, resume=False).fit()
            peak = live.peak
            Trainer(train, runtime=runtime, log=lambda line: None, resume=False).fit()
        records = [json.loads(line) for line in (Path(root) / "run" / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in records if "tokens_per_s" in r and r["step"] > args.warmup]
    seconds = sum(args.batch * args.seq_len / r["tokens_per_s"] for r in timed)
    return {"tokens_per_second": args.batch * args.seq_len * len(timed) / seconds, "peak_memory": peak}


def child(args) -> None:
    """One side, in this fresh process: a JSON line on stdout."""
    device = init_runtime(args.device).device
    precision = resolve_precision(args.precision, device)
    config = model_config(args.model, args.seq_len)
    run = run_measure if args.role == "measure" else run_trainer
    print(json.dumps({**run(args, config, device, precision), "device": str(device), "precision": precision}))


def side(role: str) -> dict:
    command = [sys.executable, __file__, *sys.argv[1:], "--role", role]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"the {role} process failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="shakespeare-cpu", help="a training preset's model or a model preset (default shakespeare-cpu)")
    parser.add_argument("--batch", type=int, default=32, help="sequences per step: the micro-batch (default 32)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (default 128)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda (default auto)")
    parser.add_argument("--precision", default="auto", help="auto, fp32, bf16, fp16 (default auto: as training picks)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps on each side (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up steps on each side (default 2)")
    parser.add_argument("--rounds", type=int, default=3, help="measure and trainer processes, in turn (default 3)")
    parser.add_argument("--role", choices=["measure", "trainer"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        return child(args)
    print(header("gptlab model info --measure vs a Trainer run (same model, micro-batch, device)", ["torch"]))
    rounds = [(side("measure"), side("trainer")) for _ in range(args.rounds)]
    measured, trained = [m for m, _ in rounds], [t for _, t in rounds]
    first = measured[0]
    config = model_config(args.model, args.seq_len)
    print(f"model: {args.model} ({config.arch} {config.n_layer} layers x {config.n_embd}, vocab {config.vocab_size}); "
          f"{first['device']} {first['precision']}; micro-batch {args.batch} x {args.seq_len}; {args.steps} timed steps "
          f"after {args.warmup} warm-up; medians of {args.rounds} rounds")

    def median(sides: list[dict], key: str) -> float:
        return statistics.median(s[key] for s in sides)

    for label, key, unit, scale, digits in (("tokens/s", "tokens_per_second", "", 1, 0), ("peak memory", "peak_memory", " GiB", GIB, 2)):
        m, t = median(measured, key) / scale, median(trained, key) / scale
        rounds_text = ", ".join(f"{a[key] / scale:,.{digits}f}/{b[key] / scale:,.{digits}f}" for a, b in rounds)
        print(f"{label:<12} measure {m:,.{digits}f}{unit}  trainer {t:,.{digits}f}{unit}  ratio {m / t:.2f}  "
              f"(rounds, measure/trainer: {rounds_text})")
    estimate, peak = first["estimated_memory"] / GIB, median(trained, "peak_memory") / GIB
    print(f"{'estimate':<12} training_memory {estimate:,.2f} GiB  trainer {peak:,.2f} GiB  ratio {estimate / peak:.2f}  "
          f"(memory counted as {first['memory_kind']})")
    print(f"{'MFU':<12} measure {median(measured, 'mfu'):.1%} of this device's matmul peak "
          f"{median(measured, 'peak_flops') / 1e9:,.1f} GFLOP/s")


if __name__ == "__main__":
    main()
