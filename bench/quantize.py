"""Quantised weights: quality, decode speed and memory of int8 and int4 against the unquantised model, in one run.

    .venv/bin/python bench/quantize.py                      # the demo run (runs/shakespeare) if there; a GPT-2 (124M) shape
    .venv/bin/python bench/quantize.py --model /tmp/i33/demo --rounds 5

--model is a `gptlab run` folder (what `make demo` trains): its base model (train/), chat model (sft/) and data/.
Without one only the GPT-2-shaped model is measured (random weights: speed and memory, no quality).

- quality (demo): bits per byte of data/'s whole val split (gptlab.eval.loss); the demo's report cards as `gptlab run`
  makes them (gptlab.pipeline.card_stage): the base model on the held-out works (next_line, last_word), the chat model
  on its fine-tuning tasks' held-out questions (arithmetic, spelling), --examples questions each.
- decode tokens/s: `generate` (KV cache, greedy, no stop) of --new-tokens after a 16-token prompt, batch 1 and 8:
  batch x new tokens / seconds, prefill included; the schemes take turns within each of --rounds rounds; medians.
- memory: a child process loads (or builds) the model and quantises it, then reports the bytes of its parameters and
  buffers and its resident set (VmRSS after gc and malloc_trim) minus the same process's RSS before the model.
Ratios are against `none` (the model as saved, float32) of the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from machine import REPO_ROOT, header

from gptlab.infer import SamplingConfig, generate
from gptlab.infer.quantize import quantize_model

SCHEMES = ("none", "int8", "int4")
BATCHES = (1, 8)
GPT2 = "gpt2 (124M shape, random)"

CHILD = """
import ctypes, gc, json, sys, torch
def rss():
    gc.collect(); ctypes.CDLL("libc.so.6").malloc_trim(0)
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) * 1024
from gptlab.load.model_folders import load_model
from gptlab.infer.quantize import quantize_model, quantized_bytes
from gptlab.model import GPT, preset
spec, scheme = sys.argv[1], sys.argv[2]
before = rss()
if spec == "gpt2":
    torch.manual_seed(0)
    model = GPT(preset("gpt2")).eval()
else:
    model, _ = load_model(spec)
if scheme != "none":
    quantize_model(model, scheme)
print(json.dumps({"bytes": quantized_bytes(model), "rss": rss() - before}))
"""


def load(spec: str, scheme: str):
    """(model, its folder) as the CLI loads them with --quantize SCHEME; "gpt2": the random 124M shape, no folder."""
    from gptlab.load.model_folders import load_model
    from gptlab.model import GPT, preset

    if spec == "gpt2":
        torch.manual_seed(0)
        model, path = GPT(preset("gpt2")).eval(), None
    else:
        model, path = load_model(spec)
    return (model if scheme == "none" else quantize_model(model.eval(), scheme)), path


def memory(spec: str, scheme: str) -> dict:
    """Parameter + buffer bytes and the resident set a fresh process spends on the model (module docstring)."""
    env = {"PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": str(torch.get_num_threads()), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", CHILD, spec, scheme], capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def decode_rates(models: dict, new_tokens: int, rounds: int) -> dict:
    """{(scheme, batch): median tokens/s}, the schemes taking turns within each round."""
    vocab = next(iter(models.values())).config.vocab_size
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab, (16,), generator=generator).tolist() for _ in range(max(BATCHES))]
    config = SamplingConfig(max_new_tokens=new_tokens, temperature=0)
    rates = {(scheme, batch): [] for scheme in models for batch in BATCHES}
    with torch.inference_mode():
        for model in models.values():  # warm-up: first calls pay for allocation and kernel selection
            generate(model, prompts[:2], SamplingConfig(max_new_tokens=4, temperature=0))
        for _ in range(rounds):
            for batch in BATCHES:
                for scheme, model in models.items():
                    start = time.perf_counter()
                    generate(model, prompts[:batch], config)
                    rates[scheme, batch].append(batch * new_tokens / (time.perf_counter() - start))
    return {key: statistics.median(values) for key, values in rates.items()}


def speed_memory_rows(name: str, spec: str, args: argparse.Namespace) -> list[str]:
    models = {scheme: load(spec, scheme)[0] for scheme in SCHEMES}
    rates = decode_rates(models, args.new_tokens, args.rounds)
    sizes = {scheme: memory(spec, scheme) for scheme in SCHEMES}
    rows = []
    for scheme in SCHEMES:
        size, base = sizes[scheme], sizes["none"]
        line = (f"{name:28s} {scheme:6s} {size['bytes'] / 1e6:9.1f} {size['bytes'] / base['bytes']:6.2f} "
                f"{size['rss'] / 1e6:9.1f} {size['rss'] / base['rss']:6.2f}")
        for batch in BATCHES:
            line += f" {rates[scheme, batch]:10.1f} {rates[scheme, batch] / rates['none', batch]:6.2f}"
        rows.append(line)
    return rows


def quality_rows(run: Path, examples: int) -> list[str]:
    """Bits per byte and both report cards for each scheme (module docstring)."""
    from gptlab.align.finetune.sft import mixture_tasks
    from gptlab.chat import ChatFormat
    from gptlab.data.corpus import corpus_files
    from gptlab.eval.chat import evaluate_task
    from gptlab.eval.loss import evaluate_split
    from gptlab.eval.tasks.heldout import evaluate_held_out
    from gptlab.load.model_folders import load_model_tokenizer

    settings = json.loads((run / "gptlab_run.json").read_text())["config"]
    texts = [path.read_text(encoding="utf-8") for path in corpus_files(settings["corpus"])[settings["val_every"] - 1 :: settings["val_every"]]]
    tasks = mixture_tasks(settings["sft"]["data"], "auto")
    rows, first = [], None
    for scheme in SCHEMES:
        base, path = load(str(run / "train"), scheme)
        tokenizer, _ = load_model_tokenizer(str(run / "train"), path, base, None)
        with torch.inference_mode():
            bpb = evaluate_split(base, run / "data", "val", batch_size=8, seq_len=base.config.block_size)["bpb"]
            cards, _ = evaluate_held_out(base, tokenizer.encode_ordinary, texts, n=examples)
        chat_model, path = load(str(run / "sft"), scheme)
        chat_tokenizer, _ = load_model_tokenizer(str(run / "sft"), path, chat_model, None)
        chat = ChatFormat(chat_tokenizer)
        accuracies = [evaluate_task(chat_model, chat, task, n=min(examples, getattr(task, "test_size", examples)))["accuracy"]
                      for task in tasks]
        first = first if first is not None else bpb
        scores = [row.score for row in cards] + accuracies
        rows.append(f"{scheme:6s} {bpb:8.4f} {bpb / first:6.3f} " + " ".join(f"{score:10.3f}" for score in scores))
    names = [row.task for row in cards] + [task.name for task in tasks]
    return [f"{'scheme':6s} {'val bpb':>8s} {'ratio':>6s} " + " ".join(f"{name:>10s}" for name in names), *rows]


def find_demo(explicit: str | None) -> Path | None:
    if explicit:
        return Path(explicit)
    default = REPO_ROOT / "runs" / "shakespeare"
    return default if (default / "sft").is_dir() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a `gptlab run` folder: train/, sft/, data/ (default runs/shakespeare, if made)")
    parser.add_argument("--examples", type=int, default=200, help="questions per report-card task (default 200, as the demo)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens decoded per timed call (default 32)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds, schemes taking turns (default 5)")
    parser.add_argument("--skip-gpt2", action="store_true", help="only the demo model")
    parser.add_argument("--skip-demo", action="store_true", help="only the GPT-2-shaped model")
    args = parser.parse_args()
    print(header("Quantised weights: int8 and int4 vs the unquantised model (gptlab.infer.quantize)", ["gptlab", "torch"]))
    print(f"# torch threads {torch.get_num_threads()}, cpu capability {torch.backends.cpu.get_cpu_capability()}; "
          f"decode: {args.new_tokens} new tokens after 16 prompt tokens, greedy, medians of {args.rounds} rounds\n")
    demo = None if args.skip_demo else find_demo(args.model)
    if demo is None and not args.skip_demo:
        print("no demo run (runs/shakespeare): `make demo` or --model RUN for the quality rows\n")
    elif demo is not None:
        print(f"quality, demo run {demo} (base model: bpb and held-out card; chat model: task accuracy), {args.examples} questions a task")
        print("\n".join(quality_rows(demo, args.examples)) + "\n")
    print(f"{'model':28s} {'scheme':6s} {'weights MB':>9s} {'ratio':>6s} {'RSS MB':>9s} {'ratio':>6s}"
          + "".join(f" {f'b{batch} tok/s':>10s} {'ratio':>6s}" for batch in BATCHES))
    models = [("demo base (train/)", str(demo / "train")), ("demo chat (sft/)", str(demo / "sft"))] if demo else []
    models += [] if args.skip_gpt2 else [(GPT2, "gpt2")]
    for name, spec in models:
        print("\n".join(speed_memory_rows(name, spec, args)), flush=True)


if __name__ == "__main__":
    main()
