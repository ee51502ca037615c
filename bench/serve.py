"""Serving: time to first token and tokens/s at 1, 4 and 8 concurrent streams, a shared-prefix workload with and
without the prefix cache, and decode speed vs transformers.

    .venv/bin/python bench/serve.py                          # random gpt2: 4 layers, d=192, 4096 vocab (a BPE trained here)
    .venv/bin/python bench/serve.py --model runs/shakespeare # a trained model (its tokenizer comes with it)
    .venv/bin/python bench/serve.py --shared-prefix-only --quick   # only the prefix-cache comparison, fewer streams

A `gptlab serve` child process serves the model on a free port (its own cores, as
a user runs it); this process runs 1, 4 and 8 client threads, each streaming
--requests completions in turn over raw HTTP (server-sent events): --prompt-tokens
token ids in, --new-tokens out (greedy, `ignore_eos` so every stream is as long).

- ttft: time from sending the request to its first text chunk (queueing and prefill included).
- per-stream tokens/s: (tokens - 1) / (last chunk - first chunk) of each stream: its decode rate.
- aggregate tokens/s: all tokens of the level / the level's wall time. Ratio 8 vs 1 is the batching gain.

Shared prefix: every request is one long system prompt (--shared-tokens ids) and a short distinct question
(--question-tokens), --shared-new-tokens out, at 1 and 4 concurrent clients, against two `gptlab serve` children
up at once, `--prefix-cache-mb 0` (off) and the default (on), taking turns for --shared-rounds rounds (ttft over
all streams, aggregate tok/s the median round). Each server is warmed up with an unrelated prompt, so the first
measured request computes the system prompt and later ones may reuse it (tokens reused are read from /health;
at most the system prompt's full blocks per request). Both servers must give the same greedy text. Then the same
prompts one at a time into two engines in this process: the prefill's share of time to first token, without HTTP.

Then single-stream decode in this process, same weights and prompt: gptlab's engine
(one request, greedy) vs `transformers` `generate` (greedy, `min_new_tokens` so it
never stops early) on the weights written by `gptlab.model.hf.export_hf`. The two
must give the same tokens.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from machine import REPO_ROOT, header

from gptlab.infer import Engine, EngineConfig, SamplingConfig
from gptlab.infer.engine import DEFAULT_PREFIX_CACHE_MB
from gptlab.model import GPT, preset
from gptlab.model.hf import export_hf, load_pretrained_directory
from gptlab.model.io import save_model

LEVELS = (1, 4, 8)
SHARED_LEVELS = (1, 4)  # concurrent clients of the shared-prefix workload


def random_model(folder: Path, block_size: int, seed: int) -> None:
    from gptlab.data.corpus import shakespeare_documents
    from gptlab.tokenizer import Tokenizer

    tokenizer = Tokenizer.train(shakespeare_documents()[:12], vocab_size=4096)
    torch.manual_seed(seed)
    save_model(GPT(preset("gpt2-mini", n_embd=192, n_head=6, vocab_size=tokenizer.vocab_size, block_size=block_size)), folder)
    tokenizer.save(folder / "tokenizer")


def start_server(model: str, slots: int, *options: str) -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}
    child = subprocess.Popen([sys.executable, "-m", "gptlab.cli.main", "serve", model, "--port", "0", "--slots", str(slots),
                              "--no-access-log", *options], stderr=subprocess.PIPE, text=True, env=env)
    for line in child.stderr:
        if match := re.search(r"http://[\d.]+:(\d+)/v1", line):
            return child, int(match.group(1))
    raise SystemExit(f"gptlab serve exited ({child.wait()})")


def one_stream(port: int, prompt: list[int], new_tokens: int) -> tuple[float, float, int]:
    """(ttft, decode tokens/s, tokens) of one streaming completion."""
    body = {"prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    connection.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    first = last = None
    tokens = 0
    for line in response:
        if not line.startswith(b"data: {"):
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        elif chunk["choices"] and chunk["choices"][0]["text"]:
            last = time.perf_counter()
            first = first or last
    connection.close()
    rate = (tokens - 1) / (last - first) if tokens > 1 and last > first else float("nan")
    return first - start, rate, tokens


def run_level(port: int, clients: int, requests: int, prompts: list[list[int]], new_tokens: int) -> dict:
    results: list[tuple[float, float, int]] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        for r in range(requests):
            outcome = one_stream(port, prompts[(k * requests + r) % len(prompts)], new_tokens)
            with lock:
                results.append(outcome)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    ttfts, rates = [r[0] for r in results], [r[1] for r in results]
    return {"ttft": ttfts, "rate": rates, "aggregate": sum(r[2] for r in results) / wall}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def get_json(port: int, method: str, path: str, body: dict | None = None) -> dict:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    connection.request(method, path, body=None if body is None else json.dumps(body), headers={"Content-Type": "application/json"})
    answer = json.loads(connection.getresponse().read())
    connection.close()
    return answer


def complete(port: int, prompt: list[int], new_tokens: int) -> str:
    """The greedy text of one non-streaming completion."""
    body = {"prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    return get_json(port, "POST", "/v1/completions", body)["choices"][0]["text"]


def prefix_hits(port: int) -> int:
    """Prompt tokens the server has reused so far (/health; 0 with the cache off)."""
    return (get_json(port, "GET", "/health")["prefix_cache"] or {}).get("hits", 0)


def shared_prefix_levels(ports: dict[str, int], args: argparse.Namespace, prompts: list[list[int]]) -> dict:
    """results[server][clients]: ttfts, aggregate tok/s per round, prompt tokens reused and sent. The two servers
    take turns round by round, so load drifting on a shared machine falls on both alike."""
    results: dict = {name: {} for name in ports}
    for clients in SHARED_LEVELS:
        for name in ports:
            results[name][clients] = {"ttft": [], "rate": [], "aggregate": [], "reused": 0, "prompt": 0}
        for _ in range(args.shared_rounds):
            for name, port in ports.items():
                before = prefix_hits(port)
                level = run_level(port, clients, args.requests, prompts, args.shared_new_tokens)
                entry = results[name][clients]
                entry["ttft"] += level["ttft"]
                entry["rate"] += level["rate"]
                entry["aggregate"].append(level["aggregate"])
                entry["reused"] += prefix_hits(port) - before
                entry["prompt"] += clients * args.requests * len(prompts[0])
    return results


def shared_prefix(folder: Path, args: argparse.Namespace, vocab: int) -> None:
    """TTFT and throughput on a long shared system prompt + short questions: a server with the prefix cache off and
    one with it on (the default), both up at once, taking turns."""
    generator = torch.Generator().manual_seed(args.seed + 1)
    system = torch.randint(0, min(vocab, 4096), (args.shared_tokens,), generator=generator).tolist()
    prompts = [system + torch.randint(0, min(vocab, 4096), (args.question_tokens,), generator=generator).tolist() for _ in range(16)]
    print(f"\nshared prefix: {args.shared_tokens}-token system prompt + {args.question_tokens}-token distinct question, "
          f"{args.shared_new_tokens} new tokens, greedy; {args.requests} streams per client, {args.shared_rounds} rounds "
          f"alternating between the servers; server slots {args.slots}")
    children = {"off": start_server(str(folder), args.slots, "--prefix-cache-mb", "0"), "on": start_server(str(folder), args.slots)}
    try:
        ports = {name: port for name, (_, port) in children.items()}
        for port in ports.values():
            complete(port, [1, 2, 3, 4], 8)  # warm-up on an unrelated prompt: the system prompt is not cached yet
        results = shared_prefix_levels(ports, args, prompts)
        texts = {name: [complete(port, prompt, args.shared_new_tokens) for prompt in prompts[:4]] for name, port in ports.items()}
    finally:
        for child, _ in children.values():
            child.terminate()
            child.wait()
    print(f"{'prefix cache':>13} {'clients':>7} {'ttft p50':>9} {'ttft p99':>9} {'tok/s/stream p50':>17} {'aggregate tok/s':>16} "
          f"{'prompt tokens reused':>21}")
    for clients in SHARED_LEVELS:
        for name in ("off", "on"):
            level = results[name][clients]
            label = "off (0 MB)" if name == "off" else f"on ({DEFAULT_PREFIX_CACHE_MB} MB)"
            print(f"{label:>13} {clients:>7} {percentile(level['ttft'], .5) * 1000:7.1f}ms {percentile(level['ttft'], .99) * 1000:7.1f}ms "
                  f"{statistics.median(level['rate']):17.1f} {statistics.median(level['aggregate']):16.1f} "
                  f"{level['reused']:>12} of {level['prompt']:<6}")
        off, on = results["off"][clients], results["on"][clients]
        print(f"{'ratio on/off':>13} {clients:>7} ttft p50 {percentile(on['ttft'], .5) / percentile(off['ttft'], .5):.2f}  "
              f"aggregate tok/s {statistics.median(on['aggregate']) / statistics.median(off['aggregate']):.2f}")
    print(f"greedy texts identical with and without the cache: {'yes' if texts['on'] == texts['off'] else 'NO'}")
    engine_ttft(folder, args, prompts)


def engine_ttft(folder: Path, args: argparse.Namespace, prompts: list[list[int]]) -> None:
    """The same prompts one at a time into the engine in this process (no HTTP, no other threads): time to the
    first token, prefix cache off vs on, engines taking turns prompt by prompt."""
    model = load_pretrained_directory(folder).eval()
    config = SamplingConfig(max_new_tokens=2, temperature=0)
    ttfts: dict[str, list[float]] = {"off": [], "on": []}
    with Engine(model, EngineConfig(slots=1, prefix_cache_mb=0)) as off, Engine(model, EngineConfig(slots=1)) as on:
        engines = {"off": off, "on": on}
        for engine in engines.values():
            list(engine.submit(prompts[0], config))  # the first prompt: the system prompt, now cached by `on`
        for prompt in prompts[1:]:
            for name, engine in engines.items():
                start = time.perf_counter()
                tokens = iter(engine.submit(prompt, config))
                next(tokens)
                ttfts[name].append(time.perf_counter() - start)
                list(tokens)
    off_ms, on_ms = statistics.median(ttfts["off"]) * 1000, statistics.median(ttfts["on"]) * 1000
    print(f"engine alone, in process, {len(prompts) - 1} prompts one at a time: ttft p50 off {off_ms:.1f}ms  on {on_ms:.1f}ms  "
          f"ratio on/off {on_ms / off_ms:.2f}")


def decode_speed(folder: Path, prompt: list[int], new_tokens: int, rounds: int) -> None:
    """gptlab's engine alone vs transformers generate, same weights, prompt and tokens, in alternating rounds."""
    import transformers
    from scipy.stats import mannwhitneyu

    model = load_pretrained_directory(folder).eval()
    with tempfile.TemporaryDirectory() as hf_dir:
        export_hf(model, hf_dir)
        reference = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    config = SamplingConfig(max_new_tokens=new_tokens, temperature=0)
    idx = torch.tensor([prompt])
    options = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False, "pad_token_id": 0}
    rates: dict[str, list[float]] = {"gptlab": [], "transformers": []}
    with Engine(model, EngineConfig(slots=1)) as engine, torch.inference_mode():
        list(engine.submit(prompt, SamplingConfig(max_new_tokens=8, temperature=0)))  # warm-up
        reference.generate(idx, **{**options, "max_new_tokens": 8, "min_new_tokens": 8})
        for _ in range(rounds):
            start = time.perf_counter()
            ours = list(engine.submit(prompt, config))
            rates["gptlab"].append(new_tokens / (time.perf_counter() - start))
            start = time.perf_counter()
            theirs = reference.generate(idx, **options)[0, len(prompt):].tolist()
            rates["transformers"].append(new_tokens / (time.perf_counter() - start))
    ours_rate, hf_rate = statistics.median(rates["gptlab"]), statistics.median(rates["transformers"])
    p = mannwhitneyu(rates["gptlab"], rates["transformers"]).pvalue
    print(f"\nsingle stream, in process, {new_tokens} new tokens, prompt {len(prompt)}, greedy (prefill included), "
          f"medians of {rounds} alternating rounds")
    print(f"decode  gptlab engine {ours_rate:8.1f} tokens/s  transformers generate {hf_rate:8.1f} tokens/s  "
          f"ratio {ours_rate / hf_rate:.2f}  p={p:.3f} (Mann-Whitney)  (transformers {transformers.__version__})")
    for name, values in rates.items():
        print(f"  {name:12s} rounds: {', '.join(f'{v:.0f}' for v in values)}")
    print(f"tokens identical: {'yes' if ours == theirs else 'NO'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a model gptlab serve reads (default: a random 4-layer d=192 gpt2, 4096 vocab)")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--requests", type=int, default=3, help="streams each client runs in turn (default 3)")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds of the decode comparison (default 7)")
    parser.add_argument("--decode-only", action="store_true", help="only the single-stream comparison with transformers")
    parser.add_argument("--shared-prefix-only", action="store_true", help="only the shared-prefix workload, prefix cache off vs on")
    parser.add_argument("--shared-tokens", type=int, default=480, help="the shared system prompt's ids (default 480)")
    parser.add_argument("--question-tokens", type=int, default=16, help="each request's own ids after it (default 16)")
    parser.add_argument("--shared-new-tokens", type=int, default=32, help="new tokens per shared-prefix request (default 32)")
    parser.add_argument("--shared-rounds", type=int, default=3, help="rounds of the shared-prefix workload per server (default 3)")
    parser.add_argument("--quick", action="store_true", help="fewer streams and rounds: --requests 2 --rounds 3 --shared-rounds 2")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.rounds, args.shared_rounds = 2, 3, 2
    print(header("Serving: gptlab serve under 1/4/8 concurrent streams; a shared prefix with and without the prefix cache; "
                 "decode vs transformers generate", ["gptlab", "torch", "transformers", "uvicorn"]))
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "model"
        if args.model is None:
            longest = max(args.prompt_tokens + args.new_tokens, args.shared_tokens + args.question_tokens + args.shared_new_tokens)
            random_model(folder, block_size=longest + 64, seed=args.seed)
            name = "random gpt2 (4 layers, d=192, 4096 vocab)"
        else:
            folder, name = Path(args.model), args.model
        model = load_pretrained_directory(folder)
        vocab = model.config.vocab_size
        generator = torch.Generator().manual_seed(args.seed)
        prompts = [torch.randint(0, min(vocab, 4096), (args.prompt_tokens,), generator=generator).tolist() for _ in range(16)]
        print(f"# model: {name}, {model.num_params() / 1e6:.1f}M params, float32 on cpu; server slots {args.slots}, "
              f"torch threads {torch.get_num_threads()}")
        if not args.shared_prefix_only:
            print(f"# each stream: prompt {args.prompt_tokens} ids, {args.new_tokens} new tokens, greedy; "
                  f"{args.requests} streams per client\n")
        if not args.decode_only and not args.shared_prefix_only:
            serve_levels(folder, args, prompts)
        if not args.decode_only:
            shared_prefix(folder, args, vocab)
        if not args.shared_prefix_only:
            decode_speed(folder, prompts[0], args.new_tokens, args.rounds)


def serve_levels(folder: Path, args: argparse.Namespace, prompts: list[list[int]]) -> None:
    """1, 4 and 8 concurrent streaming clients against a `gptlab serve` child process (prefix cache off: the 16
    prompts repeat, and this measures batching alone; the shared-prefix workload measures the cache)."""
    child, port = start_server(str(folder), args.slots, "--prefix-cache-mb", "0")
    try:
        one_stream(port, prompts[0], 8)  # warm-up
        aggregates = {}
        print(f"{'clients':>7} {'ttft p50':>9} {'ttft p99':>9} {'tok/s/stream p50':>17} {'p99 (slowest)':>14} {'aggregate tok/s':>16}")
        for clients in LEVELS:
            level = run_level(port, clients, args.requests, prompts, args.new_tokens)
            aggregates[clients] = level["aggregate"]
            print(f"{clients:>7} {percentile(level['ttft'], .5) * 1000:7.1f}ms {percentile(level['ttft'], .99) * 1000:7.1f}ms "
                  f"{statistics.median(level['rate']):17.1f} {percentile(level['rate'], .01):14.1f} {level['aggregate']:16.1f}")
        print(f"aggregate ratio 8 clients / 1 client: {aggregates[8] / aggregates[1]:.2f}  (target >= 3)")
    finally:
        child.terminate()
        child.wait()


if __name__ == "__main__":
    main()
