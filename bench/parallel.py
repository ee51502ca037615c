"""Data parallel step time, variant against variant, on 2 gloo processes of this machine; then 8 GPUs on paper.

    .venv/bin/python bench/parallel.py                  # 5 rounds of 3 steps per side
    .venv/bin/python bench/parallel.py --rounds 9 --steps 5

Sides (gptlab.parallel), each training its own copy of the same small GPT on the same batches, fp32:
- none:       each process alone with plain AdamW, no communication at all: the compute floor.
- torch:      torch's DistributedDataParallel (the Trainer's default).
- allreduce | overlap | bucketed: the hand-written variants (gptlab.parallel.data_parallel).
- zero1:      torch DDP + the hand-written ZeRO-1 around AdamW (gptlab.parallel.zero).
Sides are timed in turn within each round (rotating the order), so drift on a shared machine falls on all alike; a round's time is the
slower rank's. Communication share = (step - none's step) / step; for the hand variants also the time blocked in
finish_gradient_synchronization (waiting for all-reduces) per step. Both processes share the machine's cores, so
the compute floor is what each rank gets while the other computes too.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from machine import header

from gptlab.model import GPT, preset
from gptlab.model.accounting import flops_per_token, param_counts
from gptlab.parallel.data_parallel import DataParallel
from gptlab.parallel.zero import ShardedOptimizer

SIDES = ("none", "torch", "allreduce", "overlap", "bucketed", "zero1")
WORLD, BATCH, BUCKET_MB = 2, 8, 1.0
CONFIG = preset("gpt2-mini", vocab_size=4096, n_layer=4, n_head=2, n_embd=128, block_size=128)


def build(side: str) -> tuple[torch.nn.Module, torch.nn.Module, torch.optim.Optimizer]:
    """(plain model, the module the step runs, optimizer), from the same weights on every side."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = GPT(CONFIG)
    if side == "zero1":
        return model, DistributedDataParallel(model), ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if side == "none":
        return model, model, optimizer
    if side == "torch":
        return model, DistributedDataParallel(model), optimizer
    return model, DataParallel(model, variant=side, bucket_mb=BUCKET_MB), optimizer


def step(wrapped: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    _, loss = wrapped(x, y)
    loss.backward()
    if isinstance(wrapped, DataParallel):
        wrapped.finish_gradient_synchronization()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def time_side(made: tuple, batches: list, steps: int) -> tuple[float, float]:
    """(seconds per step of the slower rank, seconds per step blocked in the hand variants' waits)."""
    _, wrapped, optimizer = made
    waited = getattr(wrapped, "wait_seconds", 0.0)
    dist.barrier()
    start = time.perf_counter()
    for x, y in batches[:steps]:
        step(wrapped, optimizer, x, y)
    seconds = torch.tensor([(time.perf_counter() - start) / steps, (getattr(wrapped, "wait_seconds", 0.0) - waited) / steps])
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return float(seconds[0]), float(seconds[1])


def run_rank(rank: int, init_file: str, rounds: int, steps: int, results_path: str) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // WORLD))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=600))
    generator = torch.Generator().manual_seed(rank)
    batches = [tuple(torch.randint(0, CONFIG.vocab_size, (2, BATCH, CONFIG.block_size), generator=generator)) for _ in range(steps)]
    made = {side: build(side) for side in SIDES}
    buckets = len(made["bucketed"][1].buckets)
    for side in SIDES:  # warm-up: allocator, first-step state
        step(made[side][1], made[side][2], *batches[0])
    times = {side: [] for side in SIDES}
    for round_ in range(rounds):  # each round starts one side later: no side always follows the same one
        for side in SIDES[round_ % len(SIDES):] + SIDES[:round_ % len(SIDES)]:
            times[side].append(time_side(made[side], batches, steps))
    if rank == 0:
        torch.save({"times": times, "buckets": buckets, "threads": torch.get_num_threads()}, results_path)
    dist.destroy_process_group()


def report(results: dict, rounds: int, steps: int) -> list[str]:
    """Medians (the typical step) and the best round (the least disturbed by other work on the machine)."""
    times = results["times"]
    floor, best_floor = statistics.median(t for t, _ in times["none"]), min(t for t, _ in times["none"])
    torch_step = statistics.median(t for t, _ in times["torch"])
    lines = [f"# model: {param_counts(CONFIG)['total']:,} parameters ({CONFIG.n_layer} x {CONFIG.n_embd}, vocab {CONFIG.vocab_size}), "
             f"fp32 gradients {param_counts(CONFIG)['total'] * 4 / 1e6:.1f} MB; {WORLD} gloo processes x {results['threads']} threads, "
             f"batch {BATCH} x {CONFIG.block_size} per rank; {rounds} rounds x {steps} steps, medians; bucketed: "
             f"{results['buckets']} buckets of <= {BUCKET_MB:g} MiB",
             f"{'side':<10} {'step ms':>8} {'vs torch':>9} {'comm share':>11} {'best ms':>8} {'comm share':>11} {'waits ms':>9}"]
    for side in SIDES:
        step_s, best = statistics.median(t for t, _ in times[side]), min(t for t, _ in times[side])
        waits = statistics.median(w for _, w in times[side])
        share = "" if side == "none" else f"{(step_s - floor) / step_s:.1%}"
        best_share = "" if side == "none" else f"{(best - best_floor) / best:.1%}"
        wait = f"{waits * 1e3:>9.1f}" if side in ("allreduce", "overlap", "bucketed") else ""
        lines.append(f"{side:<10} {step_s * 1e3:>8.1f} {torch_step / step_s:>8.2f}x {share:>11} {best * 1e3:>8.1f} {best_share:>11} {wait}")
    lines.append("(medians, then the best round; vs torch: torch DDP's median step over the side's, above 1 is faster; "
                 "comm share: (step - none's step) / step; waits: blocked in finish_gradient_synchronization)")
    return lines


def on_paper(gpus: int = 8) -> list[str]:
    """GPT-2 124M on 8 GPUs: ring all-reduce bytes against the compute of a step (assumptions stated)."""
    config = preset("gpt2")
    params = param_counts(config)["total"]
    tokens_per_gpu = 524_288 // gpus  # the gpt2-124m-fineweb preset's batch
    peak, mfu = 989e12, 0.40  # H100 SXM bf16 dense (datasheet); a utilisation well-tuned GPT-2 runs reach
    compute = flops_per_token(config, 1024)["training"] * tokens_per_gpu / (peak * mfu)
    links = {"NVLink 4, one 8-GPU H100 node": 360e9, "InfiniBand NDR 400 Gb/s, a NIC per GPU": 45e9,
             "Ethernet 100 Gb/s, one GPU per node": 11e9}
    last = config.vocab_size * config.n_embd  # the tied embedding: its gradient is complete only when backward ends
    ring = 2 * (gpus - 1) / gpus
    lines = [f"# on paper: GPT-2 124M ({params / 1e6:.1f}M parameters) on {gpus} GPUs, {tokens_per_gpu:,} tokens per GPU per step",
             f"compute per step: {flops_per_token(config, 1024)['training'] / 1e9:.2f} GFLOP/token x {tokens_per_gpu:,} tokens "
             f"/ ({peak / 1e12:.0f} TFLOP/s x {mfu:.0%} MFU) = {compute * 1e3:.0f} ms (assumed peak and MFU)",
             f"ring all-reduce sends {ring:.2f} x the gradient bytes per GPU (2(N-1)/N, N = {gpus}); bus bandwidths assumed "
             "(nccl-tests-like busbw, not measured here):"]
    for dtype, width in (("bf16", 2), ("fp32", 4)):
        gradient = params * width
        for link, bandwidth in links.items():
            seconds = ring * gradient / bandwidth
            # overlapped: backward (2/3 of the compute) hides all but what is left after it, and at least the last
            # bucket, the embedding's, which can only be sent once backward is over
            exposed = max(seconds - compute * 2 / 3, ring * last * width / bandwidth)
            lines.append(f"  {dtype} {gradient / 1e6:.0f} MB over {link} ({bandwidth / 1e9:.0f} GB/s): {seconds * 1e3:5.1f} ms "
                         f"= {seconds / compute:5.1%} of compute; speed-up over 1 GPU {gpus * compute / (compute + seconds):.2f}x "
                         f"without overlap, {gpus * compute / (compute + exposed):.2f}x overlapped")
    lines.append("(fp32 is what DDP sends under autocast: the parameters, hence the gradients, stay fp32. ZeRO-1 adds a "
                 f"broadcast of the updated weights after the step, about {(gpus - 1) / gpus:.2f} x their bytes, not overlapped)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    print(header("data parallel variants: step time on 2 gloo processes, and 8 GPUs on paper", ["torch"]))
    print(f"# load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores (more than 0 before starting: other work shares the machine)")
    with tempfile.TemporaryDirectory() as folder:
        results_path = os.path.join(folder, "results.pt")
        mp.spawn(run_rank, args=(os.path.join(folder, "init"), args.rounds, args.steps, results_path), nprocs=WORLD, join=True)
        results = torch.load(results_path, weights_only=False)
    print("\n".join(report(results, args.rounds, args.steps)))
    print(f"# load average after: {os.getloadavg()[0]:.2f}")
    print()
    print("\n".join(on_paper()))


if __name__ == "__main__":
    main()
