"""Batch-1 CPU decode, same weights: gptlab's engine (fp32, bf16, int8) vs llama.cpp on the GGUF export (f16, q8_0).

    .venv/bin/python bench/llamacpp_decode.py                                  # GPT-2 (124M) shape, random weights
    OMP_NUM_THREADS=2 .venv/bin/python bench/llamacpp_decode.py --threads 2    # both runtimes on 2 threads

One model of the gpt2 preset's shape (12 layers, 768 wide, 50257 vocab, learned positions, LayerNorm, GELU:
GGUF architecture "gpt2"), random weights from --seed (speed does not depend on them), or --model. It is
written to GGUF f16 and q8_0 by gptlab.export.gguf.write_gguf, and run:

- gptlab:    gptlab.infer.Engine, one request, greedy, fp32 / bf16 (the model cast) / int8 (gptlab.infer.quantize,
             weight-only, per channel);
- llama.cpp: llama_cpp.Llama (llama-cpp-python) on each file; the prompt in one llama_decode, then one token per
             call, greedy (argmax of the logits, as gptlab's greedy).

Both get the same number of threads: torch.set_num_threads and llama.cpp's n_threads / n_threads_batch (also set
OMP_NUM_THREADS, as above, so that no OpenMP pool is larger). Each round runs every variant once, the order
reversed every other round; the table shows the median and the range over rounds.

- ttft:    prompt in, first token out (prefill of the whole prompt + the first greedy pick).
- decode:  (new tokens - 1) / time from the first token to the last: one token per step, never stopping early.
- weights: bytes of the weight matrices a decode step reads (gptlab: the model's tensors, a tied matrix once;
           GGUF: its tensors), which bounds decode from below at memory bandwidth.
- cpu/wall: CPU seconds the process used per second of decode (all its threads): below the thread count, the
           machine gave the runtime less than it asked for (other work, waiting for a thread or the GIL).
- same tokens: how many of the greedy tokens equal gptlab fp32's, from the first (formats round differently, so
           a near tie may go the other way; random weights give flat logits, full of near ties).

Before the rounds, llama.cpp's logits after the prompt are compared with gptlab fp32's (the files hold the same
model); after them, one gptlab decode step is taken apart on one thread: the blocks' matmuls, the output layer,
the rest (attention over the cache, norms, GELU, residuals, Python and dispatch), the greedy pick.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from machine import header

from gptlab.infer import Engine, EngineConfig, SamplingConfig
from gptlab.infer.engine import SlotCache
from gptlab.infer.gemv import single_row_matmuls
from gptlab.infer.generate import model_device_dtype
from gptlab.infer.quantize import quantize_model, quantized_bytes
from gptlab.model import GPT, preset

GPTLAB_FORMATS = ("fp32", "bf16", "int8")
GGUF_TYPES = ("f16", "q8_0")
PAIRS = (("fp32", "f16"), ("bf16", "f16"), ("int8", "q8_0"))  # the llama.cpp format each gptlab one is compared with


def gptlab_variant(model: GPT, name: str) -> GPT:
    """A copy of the model in one of GPTLAB_FORMATS."""
    copied = copy.deepcopy(model)
    if name == "bf16":
        return copied.to(torch.bfloat16)
    if name == "int8":
        return quantize_model(copied, "int8")
    return copied


Round = tuple[float, float, list[int], float]  # ttft s, decode tokens/s, the tokens, decode CPU seconds per second


def gptlab_round(engine: Engine, prompt: list[int], new_tokens: int) -> Round:
    """One request on a warm engine."""
    start = time.perf_counter()
    tokens = iter(engine.submit(prompt, SamplingConfig(max_new_tokens=new_tokens, temperature=0)))
    first_token = next(tokens)
    first, cpu_first = time.perf_counter(), time.process_time()
    rest = list(tokens)
    last, cpu_last = time.perf_counter(), time.process_time()
    return first - start, (new_tokens - 1) / (last - first), [first_token, *rest], (cpu_last - cpu_first) / (last - first)


class LlamaCppGreedy:
    """llama.cpp on one GGUF file: prefill in one call, then one token per call, argmax of the last logits."""

    def __init__(self, path: Path, threads: int, context: int) -> None:
        from llama_cpp import Llama

        self.llama = Llama(str(path), n_ctx=context, n_batch=context, n_threads=threads, n_threads_batch=threads,
                           logits_all=False, verbose=False)

    def next_token(self, tokens: list[int]) -> int:
        """Feed `tokens` after what is cached; the argmax of the last position's logits, read where llama.cpp left them."""
        import llama_cpp

        self.llama.eval(tokens)  # without logits_all, llama-cpp-python 0.3.36 copies no logits out: read them in place
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.llama.ctx, -1), shape=(self.llama.n_vocab(),))
        return int(np.argmax(logits))

    def logits(self, tokens: list[int]) -> np.ndarray:
        """The last position's logits after `tokens` alone (a copy), to check that llama.cpp runs the same model."""
        import llama_cpp

        self.llama.reset()
        self.llama.eval(tokens)
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.llama.ctx, -1), shape=(self.llama.n_vocab(),)).copy()

    def round(self, prompt: list[int], new_tokens: int) -> Round:
        self.llama.reset()
        start = time.perf_counter()
        tokens = [self.next_token(prompt)]
        first, cpu_first = time.perf_counter(), time.process_time()
        while len(tokens) < new_tokens:
            tokens.append(self.next_token(tokens[-1:]))
        last, cpu_last = time.perf_counter(), time.process_time()
        return first - start, (new_tokens - 1) / (last - first), tokens, (cpu_last - cpu_first) / (last - first)

    def close(self) -> None:
        self.llama.close()  # now, not in __del__ at interpreter exit (where llama-cpp-python 0.3.36 raises)


def best_ms(run, repeats: int) -> float:
    """The fastest of `repeats` calls after a warm-up: the least disturbed by other work on the machine."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times) * 1000


@torch.inference_mode()
def decode_breakdown(model: GPT, prompt: list[int], repeats: int = 10) -> str:
    """Where one batch-1 decode step goes: the blocks' matmuls (all layers in order, so the weights come from memory
    as in a step), the output layer, the rest (attention over the cache, norms, GELU, residuals, Python), the argmax."""
    device, dtype = model_device_dtype(model)
    cache = SlotCache(model, 1)
    cache.select([0], [0], len(prompt))
    model(torch.tensor([prompt]), cache=cache, last_only=True)
    T = len(prompt)
    mask, positions, idx = torch.ones(1, 1, 1, T + 1, dtype=torch.bool), torch.tensor([[T]]), torch.tensor([prompt[-1:]])

    def step() -> torch.Tensor:
        cache.select([0], [T], 1)
        with single_row_matmuls(device, dtype, 1):
            return model(idx, cache=cache, positions=positions, mask=mask, last_only=True)[0]

    x, hidden = torch.randn(1, 1, model.config.n_embd, dtype=dtype), torch.randn(1, 1, model.config.hidden_dim, dtype=dtype)

    def matmuls() -> None:
        with single_row_matmuls(device, dtype, 1):
            for block in model.transformer["h"]:
                for linear, inputs in ((block.attn.c_attn, x), (block.attn.c_proj, x), (block.mlp.c_fc, x), (block.mlp.c_proj, hidden)):
                    linear(inputs)

    def head() -> None:
        with single_row_matmuls(device, dtype, 1):
            model.lm_head(x)

    logits = step()[:, -1]
    total, blocks, output = best_ms(step, repeats), best_ms(matmuls, repeats), best_ms(head, repeats)
    pick = best_ms(lambda: logits.argmax(dim=-1).tolist(), repeats)
    return (f"step {total:6.1f} ms = block matmuls {blocks:5.1f} + output layer {output:5.1f} + rest {total - blocks - output:4.1f}"
            f"; greedy pick {pick:.2f} ms")


def gguf_tensor_bytes(path: Path) -> int:
    from gguf import GGUFReader

    return sum(int(tensor.n_bytes) for tensor in GGUFReader(path).tensors)


def load_or_build(args: argparse.Namespace) -> tuple[GPT, object, str]:
    """(fp32 model, tokenizer, description): --model's, or a seeded random one of --preset's shape with GPT-2's tokenizer."""
    if args.model:
        from gptlab.load.model_folders import load_model, load_model_tokenizer

        model, path = load_model(args.model)
        return model.float().eval(), load_model_tokenizer(args.model, path, model, None)[0], args.model
    from gptlab.tokenizer.pretrained import load_any

    torch.manual_seed(args.seed)
    config = preset(args.preset)
    return GPT(config).eval(), load_any("gpt2"), f"{args.preset} shape, random weights (seed {args.seed})"


def export(model: GPT, tokenizer, folder: Path) -> dict[str, Path]:
    from gptlab.export.gguf import write_gguf

    return {kind: write_gguf(model, tokenizer, folder / f"model-{kind}.gguf", type=kind) for kind in GGUF_TYPES}


def spread(values: list[float], scale: float = 1.0) -> str:
    return f"{statistics.median(values) * scale:8.1f} ({min(values) * scale:7.1f}-{max(values) * scale:7.1f})"


def report(results: dict[str, list], weights: dict[str, int], reference: list[int]) -> None:
    """The table, then each pair's ratio of medians."""
    print(f"{'runtime':<10} {'format':<6} {'decode tokens/s (range)':>26} {'ttft ms (range)':>24} {'weights MB':>11} "
          f"{'same tokens':>12} {'cpu/wall':>9}")
    for name, rounds in results.items():
        runtime, kind = name.split(" ")
        same = next((i for i, (a, b) in enumerate(zip(rounds[-1][2], reference)) if a != b), len(reference))
        print(f"{runtime:<10} {kind:<6} {spread([r[1] for r in rounds]):>26} {spread([r[0] for r in rounds], 1000):>24} "
              f"{weights[name] / 1e6:11.0f} {same:>6}/{len(reference)} {statistics.median(r[3] for r in rounds):9.2f}")
    print()
    for ours, theirs in PAIRS:
        a, b = results[f"gptlab {ours}"], results[f"llama.cpp {theirs}"]
        decode = statistics.median(r[1] for r in a) / statistics.median(r[1] for r in b)
        ttft = statistics.median(r[0] for r in b) / statistics.median(r[0] for r in a)
        print(f"ratio gptlab {ours} / llama.cpp {theirs}:  decode {decode:.2f}   ttft (speed) {ttft:.2f}   "
              f"weights {weights[f'gptlab {ours}'] / weights[f'llama.cpp {theirs}']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="gpt2", help="shape of the random model (default gpt2: 124M; GGUF arch gpt2)")
    parser.add_argument("--model", help="a gptlab model folder instead of random weights (fp32; its tokenizer is written too)")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each variant once, alternating order (default 5)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="threads for both runtimes (default: torch's, which follows OMP_NUM_THREADS)")
    parser.add_argument("--seed", type=int, default=1337)
    args = parser.parse_args()
    if args.new_tokens < 2 or args.prompt_tokens < 1 or args.rounds < 1:
        parser.error("--new-tokens must be at least 2, --prompt-tokens and --rounds at least 1")
    torch.set_num_threads(args.threads)
    print(header("Batch-1 CPU decode, same weights: gptlab engine (fp32, bf16, int8) vs llama.cpp GGUF (f16, q8_0)",
                 ["gptlab", "torch", "llama-cpp-python", "gguf"]))
    model, tokenizer, name = load_or_build(args)
    context = args.prompt_tokens + args.new_tokens
    if context > model.config.block_size:
        parser.error(f"--prompt-tokens + --new-tokens = {context} > the model's context {model.config.block_size}")
    prompt = torch.randint(0, model.config.vocab_size, (args.prompt_tokens,), generator=torch.Generator().manual_seed(args.seed))
    prompt = prompt.tolist()
    config = model.config
    print(f"# model: {name}: {config.n_layer} layers, {config.n_embd} wide, vocab {config.vocab_size}, "
          f"{model.num_params() / 1e6:.1f}M params")
    print(f"# prompt {args.prompt_tokens} ids, {args.new_tokens} new tokens, greedy, batch 1; {args.threads} threads each "
          f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}); {args.rounds} rounds, order alternating")
    with tempfile.TemporaryDirectory() as scratch:
        files = export(model, tokenizer, Path(scratch))
        runners, weights = {}, {}
        for kind in GPTLAB_FORMATS:
            variant = gptlab_variant(model, kind)
            weights[f"gptlab {kind}"] = quantized_bytes(variant)
            runners[f"gptlab {kind}"] = Engine(variant, EngineConfig(slots=1))
        for kind, path in files.items():
            weights[f"llama.cpp {kind}"] = gguf_tensor_bytes(path)
            runners[f"llama.cpp {kind}"] = LlamaCppGreedy(path, args.threads, context)
        try:
            check_same_model(model, runners, prompt)
            results = run_rounds(runners, prompt, args.new_tokens, args.rounds)
        finally:
            for runner in runners.values():
                runner.close()
    report(results, weights, results["gptlab fp32"][-1][2])
    # One thread: an account of the work in a step. A second thread's wake-ups on a busy machine would drown it.
    torch.set_num_threads(1)
    print(f"\nwhere a gptlab decode step goes (one step at position {len(prompt)}, best of 10, 1 thread):")
    for name, runner in runners.items():
        if isinstance(runner, Engine):
            print(f"{name:<12} {decode_breakdown(runner.model, prompt)}")


def check_same_model(model: GPT, runners: dict, prompt: list[int]) -> None:
    """llama.cpp's logits after the prompt against gptlab fp32's: the files hold the same model, within each format's rounding."""
    with torch.inference_mode():
        ours = model(torch.tensor([prompt]))[0][0, -1].numpy()
    for name, runner in runners.items():
        if isinstance(runner, LlamaCppGreedy):
            difference = np.abs(runner.logits(prompt) - ours).max()
            print(f"# {name} logits after the prompt vs gptlab fp32: max |difference| {difference:.4f} (logits' std {ours.std():.3f})")
    print()


def run_rounds(runners: dict, prompt: list[int], new_tokens: int, rounds: int) -> dict[str, list]:
    """Every runner once per round (after one warm-up each), the order reversed every other round."""
    def once(runner) -> Round:
        if isinstance(runner, Engine):
            return gptlab_round(runner, prompt, new_tokens)
        return runner.round(prompt, new_tokens)

    for runner in runners.values():
        once(runner)
    results: dict[str, list] = {name: [] for name in runners}
    for index in range(rounds):
        for name in (list(runners) if index % 2 == 0 else list(reversed(runners))):
            results[name].append(once(runners[name]))
    return results


if __name__ == "__main__":
    main()
