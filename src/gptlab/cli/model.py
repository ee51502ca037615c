"""`gptlab model info`: a model's size, FLOPs per token and training memory, from a preset or any saved model
(a run folder, a checkpoint, a Hugging Face folder: gptlab.load.model_folders).

The throughput line is datasheet arithmetic (tokens/s at 40% of a named GPU's peak); `--measure`
times the model's training step on this machine instead (gptlab.train.measure) and prints its tokens/s,
achieved FLOP/s, MFU against this device's own matmul peak, and its peak memory beside the estimate.
"""

from __future__ import annotations

import argparse

from gptlab.cli.common import add_model_argument, positive
from gptlab.runtime import GptlabError

GIB = 2**30


def register(stages) -> None:
    parser = stages.add_parser("model", help="inspect model configs: parameters, FLOPs, memory")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True, parser_class=type(parser))
    info = verbs.add_parser("info", help="parameters, FLOPs per token, MFU targets and training memory of a model")
    source = info.add_mutually_exclusive_group(required=True)
    source.add_argument("--preset", metavar="NAME", help="a model preset (gpt2, gpt2-mini, llama-124m, ...)")
    add_model_argument(source, required=False)
    info.add_argument("--seq-len", type=positive, metavar="T", help="tokens per sequence (default: the block size)")
    info.add_argument("--batch-size", type=positive, default=8, metavar="B", help="sequences per step for the memory estimate (default 8)")
    info.add_argument("--device-peak", default="h100", metavar="NAME|FLOPS",
                      help="datasheet arithmetic for a100, h100, h200, cpu, or a peak FLOP/s number (default h100)")
    info.add_argument("--precision", choices=["auto", "bf16", "fp16", "fp32"], default="auto",
                      help="autocast precision (default auto: bf16 on paper; with --measure, the device's, as training picks it)")
    info.add_argument("--no-flash", action="store_true", help="count the T x T attention scores (math attention)")
    info.add_argument("--loss", choices=["fused", "plain"], default="fused",
                      help="the loss the memory follows: fused (training's default, --fused-loss true: one chunk of logits at a time) "
                      "or plain (the whole logits, as with --fused-loss false or --compile)")
    info.add_argument("--activation-checkpointing", action="store_true",
                      help="count the memory of training with --activation-checkpointing true (block inputs + one block)")
    info.add_argument("--measure", action="store_true", help="time the training step here: tokens/s, MFU, peak memory")
    info.add_argument("--device", default="auto", help="--measure on this device: auto, cpu, cuda, cuda:N, mps (default auto)")
    info.add_argument("--steps", type=positive, default=5, metavar="N", help="--measure: timed steps (default 5)")
    info.add_argument("--warmup", type=int, default=2, metavar="N", help="--measure: warm-up steps, at least 2 (default 2)")
    info.set_defaults(handler=run_info)


def _read_config(spec: str):
    from gptlab.load.model_folders import find_model
    from gptlab.model.hf import read_pretrained_config

    return read_pretrained_config(find_model(spec))


def _count(n: int) -> str:
    return f"{n:,} ({n / 1e6:.2f}M)"


def _switches(config) -> str:
    """The architecture switches, resolved: what "" means for this arch is spelled out."""
    windowed = [str(layer) for layer, window in enumerate(config.layer_windows) if window]
    attention = (f"sliding window {config.attn_window} in layers {','.join(windowed)} (pattern {config.window_pattern})"
                 if windowed else "full context in every layer")
    softcap = f"{config.logit_softcap:g}" if config.logit_softcap else "off"
    return (f"position {config.position_kind}, norm {config.norm_kind}, activation {config.activation_kind}, "
            f"logit_softcap {softcap}, zero_init {'yes' if config.zero_init else 'no'}, attention {attention}")


def run_info(args: argparse.Namespace) -> int:
    from gptlab.model import preset
    from gptlab.model.accounting import PEAK_FLOPS, flops_per_token, param_counts, peak_flops, tokens_per_second_at, training_memory

    config = preset(args.preset) if args.preset else _read_config(args.checkpoint)
    seq_len = args.seq_len if args.seq_len is not None else config.block_size
    if seq_len > config.block_size:
        raise GptlabError(f"--seq-len {seq_len} is longer than the model's context ({config.block_size})")
    peak = peak_flops(args.device_peak)
    runtime = _measuring_runtime(args)
    precision = _precision(args, runtime)
    counts = param_counts(config)
    flops = flops_per_token(config, seq_len)
    memory = training_memory(config, args.batch_size, seq_len, amp=precision, flash_attention=not args.no_flash,
                             fused_loss=args.loss == "fused", activation_checkpointing=args.activation_checkpointing)

    name = args.preset or args.checkpoint
    print(f"model       {name}: {config.arch}, n_layer {config.n_layer}, n_head {config.n_head}, n_kv_head {config.kv_heads}, "
          f"n_embd {config.n_embd}, head_dim {config.head_dim}, mlp_hidden {config.hidden_dim}")
    print(f"            vocab {config.vocab_size} (padded to {config.padded_vocab_size}), block_size {config.block_size}, "
          f"tied embeddings {'yes' if config.tie_embeddings else 'no'}, bias {'yes' if config.bias else 'no'}, "
          f"qk_norm {'yes' if config.qk_norm else 'no'}, dropout {config.dropout}")
    print(f"switches    {_switches(config)}")
    print(f"params      total {_count(counts['total'])}, non-embedding {_count(counts['non_embedding'])}, "
          f"embeddings {_count(counts['embeddings'])}")
    if config.is_moe:
        _print_moe(config, counts)
    print(f"FLOPs/token training {flops['training']:,} = 6N {flops['dense']:,} + attention {flops['attention']:,} "
          f"(N = {flops['matmul_params']:,} {'active ' if config.is_moe else ''}matmul params, T = {seq_len}); "
          f"forward {flops['forward']:,}")
    label = args.device_peak.lower() if args.device_peak.lower() in PEAK_FLOPS else "custom"
    print(f"throughput  datasheet arithmetic, {label} peak {peak / 1e12:g} TFLOP/s: "
          f"40% MFU = {tokens_per_second_at(0.4, config, seq_len, peak):,.0f} tokens/s, "
          f"100% = {tokens_per_second_at(1.0, config, seq_len, peak):,.0f} tokens/s"
          f"{'' if runtime else ' (not measured: --measure times this machine)'}")
    if runtime is not None:
        _print_measured(config, args.batch_size, seq_len, precision, runtime.device, args)
    attention = "math attention" if args.no_flash else "flash attention"
    options = f"{args.loss} loss" + (", activation checkpointing" if args.activation_checkpointing else "")
    print(f"memory      batch {args.batch_size} x {seq_len} tokens, fp32 params, {precision} activations, AdamW, {attention}, "
          f"{options} (GiB):")
    for part in ("parameters", "gradients", "optimizer", "activations", "weight_casts", "logits", "logit_grads", "total"):
        print(f"  {part:<13}{memory[part] / GIB:8.2f}")
    return 0


def _print_moe(config, counts: dict[str, int]) -> None:
    """Active vs stored parameters of a mixture of experts, and what each stored parameter costs in training."""
    from gptlab.model.accounting import parameter_memory

    moe, memory = config.moe, parameter_memory(config)
    sparse = sum(config.sparse_layers)
    print(f"experts     {sparse} of {config.n_layer} layers sparse: {moe.n_experts} experts ({config.expert_hidden} wide), "
          f"top {moe.top_k}, {moe.n_shared} shared; routed experts {_count(counts['experts'])}, routers {_count(counts['routers'])}, "
          f"shared experts {_count(counts['shared_experts'])}")
    print(f"active      {_count(counts['active'])} of {_count(counts['total'])} parameters per token "
          f"({counts['active'] / counts['total']:.0%}); FLOPs below count the active ones")
    mib = 2**20
    print(f"per param   {memory['per_param']} bytes for every stored parameter (fp32 weight + gradient + AdamW "
          f"{memory['optimizer_per_param']}): experts {memory['experts'] / mib:,.2f} MiB, the rest {memory['rest'] / mib:,.2f} MiB, "
          f"optimizer state {memory['optimizer'] / mib:,.2f} MiB (every expert's)")


def _measuring_runtime(args: argparse.Namespace):
    """The device to measure on (None without --measure), set up as training sets it up (TF32 on CUDA)."""
    if not args.measure:
        return None
    if args.warmup < 2:
        raise GptlabError(f"--warmup must be at least 2 (AdamW makes its state in the first step), got {args.warmup}")
    from gptlab.runtime.device import init_runtime

    return init_runtime(args.device)


def _precision(args: argparse.Namespace, runtime) -> str:
    """auto: bf16 on paper (the GPUs the datasheet line is about); measured, what training picks on the device."""
    if args.precision != "auto":
        if runtime is not None:
            from gptlab.runtime.device import resolve_precision

            resolve_precision(args.precision, runtime.device)  # refuses fp16 on CPU
        return args.precision
    if runtime is None:
        return "bf16"
    from gptlab.runtime.device import resolve_precision

    return resolve_precision("auto", runtime.device)


def _flop_rate(flops: float) -> str:
    return f"{flops / 1e12:,.1f} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:,.1f} GFLOP/s"


def _print_measured(config, batch_size: int, seq_len: int, precision: str, device, args: argparse.Namespace) -> None:
    from gptlab.train.measure import measure_training

    m = measure_training(config, batch_size=batch_size, seq_len=seq_len, precision=precision, device=device,
                         steps=args.steps, warmup=args.warmup, fused_loss=args.loss == "fused",
                         activation_checkpointing=args.activation_checkpointing)
    print(f"measured    {m.device}, {m.precision}, batch {batch_size} x {seq_len}: {m.tokens_per_second:,.0f} tokens/s "
          f"({m.seconds_per_step:.3f} s/step: forward, backward, clip, AdamW; {m.steps} steps after {args.warmup} warm-up)")
    print(f"            achieved {_flop_rate(m.achieved_flops)}; this device's peak {_flop_rate(m.peak_flops)} "
          f"({m.precision} {m.matmul_size} x {m.matmul_size} matmuls): MFU {m.mfu:.1%}")
    print(f"            peak memory {m.peak_memory / GIB:.2f} GiB measured ({m.memory_kind}), "
          f"{m.estimated_memory / GIB:.2f} GiB estimated (estimate / measured {m.estimated_memory / m.peak_memory:.2f})")
