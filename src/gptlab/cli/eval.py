"""`gptlab eval`: a saved model's val loss and bits per byte on prepared shards, and its HellaSwag accuracy.

    gptlab eval --checkpoint runs/shakespeare/train/checkpoints/step_000600 --data runs/shakespeare/data
    gptlab eval --checkpoint gpt2 --task hellaswag --limit 1000

The model is any folder gptlab makes or reads (gptlab.cli.common): a run
folder (its newest checkpoint, or RUN/best), a checkpoint, a Hugging Face
GPT-2 / Llama folder, or a hub name already in the local Hugging Face cache.
Its tokenizer is --tokenizer, else the one saved with the model, else GPT-2's
for a Hugging Face GPT-2. Data is evaluated only when that tokenizer is the
one the data was prepared with (checked before any compute). Under torchrun,
HellaSwag examples are split over the ranks and rank 0 prints.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gptlab.cli.common import DEVICE_HELP, add_model_argument, load_model_from, load_model_tokenizer, model_path, positive
from gptlab.runtime import GptlabError

TASK_NAMES = ("hellaswag",)


def register(stages) -> None:
    parser = stages.add_parser("eval", help="evaluate a model: val loss and bits per byte, HellaSwag accuracy")
    add_model_argument(parser)
    parser.add_argument("--data", metavar="DIR", help="prepared shards (`gptlab data prepare`): loss and bits per byte of --split")
    parser.add_argument("--split", default="val", help="split of --data to evaluate, all of it (default val)")
    parser.add_argument("--seq-len", type=positive, metavar="T", help="tokens per window for --data (default: the model's block size)")
    parser.add_argument("--task", choices=TASK_NAMES, help="a benchmark to score by log-likelihood")
    parser.add_argument("--hellaswag-path", metavar="FILE",
                        help="hellaswag_val.jsonl (default: the gptlab cache, downloaded on first use)")
    parser.add_argument("--limit", type=positive, metavar="N", help="evaluate the task's first N examples only")
    parser.add_argument("--tokenizer", "-t", metavar="DIR|NAME", help="tokenizer folder or gpt2 (default: the model's own)")
    parser.add_argument("--batch-size", type=positive, default=16, metavar="B", help="rows per forward pass (default 16)")
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="fp32",
                        help="autocast precision (default fp32: exact scores; auto as in training)")
    parser.add_argument("--harness", metavar="TASKS", help="lm-evaluation-harness tasks, comma-separated (e.g. lambada_openai,arc_easy)")
    parser.add_argument("--harness-include", metavar="DIR", help="a folder of extra lm-eval task YAMLs (e.g. tasks over local files)")
    parser.add_argument("--num-fewshot", type=int, metavar="K", help="few-shot examples for --harness tasks")
    parser.set_defaults(handler=run_eval, usage_error=parser.error)


def check_usage(args: argparse.Namespace) -> None:
    """Mistakes in the command line itself exit 2, like argparse's own."""
    if not args.data and not args.task and not args.harness:
        args.usage_error("nothing to evaluate: give --data DIR, --task hellaswag and/or --harness TASKS")
    if args.hellaswag_path and args.task != "hellaswag":
        args.usage_error("--hellaswag-path goes with --task hellaswag")
    if args.limit is not None and not (args.task or args.harness):
        args.usage_error("--limit goes with --task or --harness")


def run_eval(args: argparse.Namespace) -> int:
    from gptlab.data.match import check_tokenizer
    from gptlab.runtime.device import autocast, init_runtime, resolve_precision, shutdown_runtime

    check_usage(args)
    runtime = init_runtime(args.device)
    try:
        path = model_path(args.checkpoint)
        tokenizer, name = load_model_tokenizer(args.checkpoint, path, _config_only(path), args.tokenizer,
                                               required=bool(args.task or args.harness or args.data))
        if args.data:
            check_tokenizer(args.data, tokenizer, name)  # before the weights are even read: mismatched ids mean nothing
        model, _ = load_model_from(str(path), device=runtime.device)
        model.eval()
        context = autocast(runtime.device, resolve_precision(args.precision, runtime.device))
        say = print if runtime.is_main else (lambda line: None)
        if args.data:
            evaluate_data(model, args, context, say)
        if args.task:
            evaluate_task(model, tokenizer, args, context, say)
        if args.harness:
            evaluate_with_harness(model, tokenizer, args, say)
    finally:
        shutdown_runtime(runtime)
    return 0


def _config_only(path: Path):
    """A stand-in with the model's config, so its tokenizer is checked before the weights are loaded."""
    from types import SimpleNamespace

    from gptlab.model.hf import read_pretrained_config

    return SimpleNamespace(config=read_pretrained_config(path))


def evaluate_data(model, args: argparse.Namespace, context, say) -> dict:
    """Loss and bits per byte over every whole window of the split, as `gptlab run` reports them."""
    from gptlab.data.shards import split_shards
    from gptlab.eval.loss import evaluate_split

    shards = split_shards(args.data, args.split)  # a clear error for a missing or empty split
    T = args.seq_len or model.config.block_size
    if T > model.config.block_size:
        raise GptlabError(f"--seq-len {T} is longer than the model's context ({model.config.block_size})")
    largest = max(tokens for _, tokens in shards)
    if largest < T + 1:
        raise GptlabError(f"the largest shard of the {args.split!r} split holds {largest:,} tokens, fewer than a window "
                          f"of {T} + 1; pass --seq-len {max(1, largest - 1)} or less")
    B = min(args.batch_size, (largest - 1) // T)  # a batch comes from one shard (gptlab.data.loader)
    result = evaluate_split(model, args.data, args.split, batch_size=B, seq_len=T, autocast=context, progress=True)
    say(f"{args.split}: loss {result['loss']:.4f} nats/token, bits per byte {result['bpb']:.4f} "
        f"({result['tokens']:,} tokens in {B} x {T} windows)")
    return result


def evaluate_task(model, tokenizer, args: argparse.Namespace, context, say) -> dict:
    from gptlab.eval.tasks import HellaSwag

    task = HellaSwag(args.hellaswag_path)
    result = task.evaluate(model, tokenizer.encode_ordinary, batch_size=args.batch_size, limit=args.limit, autocast=context,
                           progress=True)
    say(f"{task.name}: acc {result['acc']:.4f}, acc_norm {result['acc_norm']:.4f} ({result['n']:,} examples, "
        f"{result['truncated']} rows cut to fit the context; {result['examples_per_second']:.1f} examples/s)")
    return result


def evaluate_with_harness(model, tokenizer, args: argparse.Namespace, say) -> dict:
    """Any lm-evaluation-harness task, through gptlab.eval.harness's registered model."""
    try:
        from gptlab.eval.harness import evaluate_harness, results_table
    except ImportError as error:
        raise GptlabError(f"--harness needs lm-evaluation-harness: pip install lm-eval ({error})") from None
    results = evaluate_harness(
        model, tokenizer, [task for task in args.harness.split(",") if task], limit=args.limit,
        batch_size=args.batch_size, precision=args.precision, num_fewshot=args.num_fewshot,
        include_path=args.harness_include,
    )
    say(results_table(results))
    return results
