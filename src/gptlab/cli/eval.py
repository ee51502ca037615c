"""`gptlab eval`: a saved model's val loss and bits per byte on prepared shards, and its HellaSwag accuracy.

    gptlab eval --checkpoint runs/shakespeare/train/checkpoints/step_000600 --data runs/shakespeare/data
    gptlab eval --checkpoint gpt2 --task hellaswag --limit 1000

The model is a gptlab model or checkpoint directory, a Hugging Face GPT-2 /
Llama directory, or a hub name already in the local Hugging Face cache
(gptlab.model.hf.from_pretrained). The tokenizer (for task text) is
--tokenizer, else CHECKPOINT/tokenizer, else GPT-2's for a Hugging Face GPT-2
model. Under torchrun, HellaSwag examples are split over the ranks and rank 0
prints.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gptlab.runtime import GptlabError

TASK_NAMES = ("hellaswag",)
GPT2_VOCAB_SIZE = 50257


def register(stages) -> None:
    parser = stages.add_parser("eval", help="evaluate a model: val loss and bits per byte, HellaSwag accuracy")
    parser.add_argument("--checkpoint", required=True, metavar="DIR|NAME",
                        help="gptlab model/checkpoint directory, Hugging Face GPT-2/Llama directory, or cached hub name (gpt2)")
    parser.add_argument("--data", metavar="DIR", help="prepared shards (`gptlab data prepare`): loss and bits per byte of --split")
    parser.add_argument("--split", default="val", help="split of --data to evaluate, all of it (default val)")
    parser.add_argument("--seq-len", type=int, metavar="T", help="tokens per window for --data (default: the model's block size)")
    parser.add_argument("--task", choices=TASK_NAMES, help="a benchmark to score by log-likelihood")
    parser.add_argument("--hellaswag-path", metavar="FILE",
                        help="hellaswag_val.jsonl (default: the gptlab cache, downloaded on first use)")
    parser.add_argument("--limit", type=int, metavar="N", help="evaluate the task's first N examples only")
    parser.add_argument("--tokenizer", "-t", metavar="DIR|NAME", help="tokenizer directory or gpt2 (default: CHECKPOINT/tokenizer)")
    parser.add_argument("--batch-size", type=int, default=16, metavar="B", help="rows per forward pass (default 16)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, mps (default auto)")
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32", help="autocast precision (default fp32)")
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
    for name in ("batch_size", "limit", "seq_len"):
        value = getattr(args, name)
        if value is not None and value < 1:
            args.usage_error(f"--{name.replace('_', '-')} must be at least 1, got {value}")


def run_eval(args: argparse.Namespace) -> int:
    from gptlab.model.hf import from_pretrained
    from gptlab.runtime.device import autocast, init_runtime, resolve_precision, shutdown_runtime

    check_usage(args)
    runtime = init_runtime(args.device)
    try:
        model = from_pretrained(args.checkpoint, device=runtime.device).eval()
        context = autocast(runtime.device, resolve_precision(args.precision, runtime.device))
        say = print if runtime.is_main else (lambda line: None)
        if args.data:
            evaluate_data(model, args, context, say)
        if args.task:
            evaluate_task(model, args, context, say)
        if args.harness:
            evaluate_with_harness(model, args, say)
    finally:
        shutdown_runtime(runtime)
    return 0


def evaluate_data(model, args: argparse.Namespace, context, say) -> dict:
    """Loss and bits per byte over every whole window of the split, as `gptlab run` reports them."""
    from gptlab.data.shards import read_manifest, split_shards
    from gptlab.eval.loss import evaluate_split

    manifest = read_manifest(args.data)
    data_vocab = int(manifest.get("tokenizer", {}).get("vocab_size", 0))
    if data_vocab > model.config.vocab_size:
        raise GptlabError(f"{args.data} was tokenized with {data_vocab} ids but the model has only {model.config.vocab_size}: "
                          "evaluate it on data prepared with its own tokenizer")
    tokenizer = load_tokenizer(args, model, required=False)
    expected = manifest.get("tokenizer", {}).get("fingerprint")
    if tokenizer is not None and expected and tokenizer.fingerprint() != expected:
        raise GptlabError(f"{args.data} was tokenized with tokenizer {expected}, not the model's ({tokenizer.fingerprint()}); "
                          "prepare the data with the model's tokenizer")
    shards = split_shards(args.data, args.split)  # a clear error for a missing or empty split
    T = args.seq_len or model.config.block_size
    if T > model.config.block_size:
        raise GptlabError(f"--seq-len {T} is longer than the model's context ({model.config.block_size})")
    largest = max(tokens for _, tokens in shards)
    if largest < T + 1:
        raise GptlabError(f"the largest shard of the {args.split!r} split holds {largest:,} tokens, fewer than a window "
                          f"of {T} + 1; pass --seq-len {max(1, largest - 1)} or less")
    B = min(args.batch_size, (largest - 1) // T)  # a batch comes from one shard (gptlab.data.loader)
    result = evaluate_split(model, args.data, args.split, batch_size=B, seq_len=T, autocast=context)
    say(f"{args.split}: loss {result['loss']:.4f} nats/token, bits per byte {result['bpb']:.4f} "
        f"({result['tokens']:,} tokens in {B} x {T} windows)")
    return result


def evaluate_task(model, args: argparse.Namespace, context, say) -> dict:
    from gptlab.eval.tasks import HellaSwag

    tokenizer = load_tokenizer(args, model, required=True)
    task = HellaSwag(args.hellaswag_path)
    result = task.evaluate(model, tokenizer.encode_ordinary, batch_size=args.batch_size, limit=args.limit, autocast=context)
    say(f"{task.name}: acc {result['acc']:.4f}, acc_norm {result['acc_norm']:.4f} ({result['n']:,} examples, "
        f"{result['truncated']} rows cut to fit the context; {result['examples_per_second']:.1f} examples/s)")
    return result


def evaluate_with_harness(model, args: argparse.Namespace, say) -> dict:
    """Any lm-evaluation-harness task, through gptlab.eval.harness's registered model."""
    try:
        from gptlab.eval.harness import evaluate_harness, results_table
    except ImportError as error:
        raise GptlabError(f"--harness needs lm-evaluation-harness: pip install lm-eval ({error})") from None
    tokenizer = load_tokenizer(args, model, required=True)
    results = evaluate_harness(
        model, tokenizer, [task for task in args.harness.split(",") if task], limit=args.limit,
        batch_size=args.batch_size, precision=args.precision, num_fewshot=args.num_fewshot,
        include_path=args.harness_include,
    )
    say(results_table(results))
    return results


def load_tokenizer(args: argparse.Namespace, model, *, required: bool):
    """--tokenizer, else CHECKPOINT/tokenizer, else GPT-2's for a Hugging Face GPT-2; None (or an error) otherwise."""
    from gptlab.tokenizer.pretrained import load_any

    tokenizer = None
    beside = Path(args.checkpoint) / "tokenizer"
    if args.tokenizer:
        tokenizer = load_any(args.tokenizer)
    elif beside.is_dir():
        tokenizer = load_any(str(beside))
    elif required and _is_hf_gpt2(args.checkpoint, model):
        tokenizer = load_any("gpt2")
    if tokenizer is None:
        if required:
            raise GptlabError(f"no tokenizer for {args.checkpoint}: {beside} does not exist; pass --tokenizer DIR (or gpt2)")
        return None
    if tokenizer.vocab_size > model.config.vocab_size:
        raise GptlabError(f"the tokenizer has {tokenizer.vocab_size} ids but the model only {model.config.vocab_size}: "
                          "is it the model's tokenizer?")
    return tokenizer


def _is_hf_gpt2(checkpoint: str, model) -> bool:
    """A Hugging Face GPT-2 with GPT-2's vocabulary (a directory whose config says gpt2, or a hub name)."""
    if model.config.arch != "gpt2" or model.config.vocab_size != GPT2_VOCAB_SIZE:
        return False
    config = Path(checkpoint).expanduser() / "config.json"
    if not config.is_file():
        return True  # from_pretrained took it for a hub name and found it in the Hugging Face cache
    try:
        return json.loads(config.read_text()).get("model_type") == "gpt2"
    except (OSError, json.JSONDecodeError):
        return False
