"""`gptlab eval`: how good a model is: its report card (benchmarks, a judge), and val loss and bits per byte.

    gptlab eval runs/shakespeare/train --suite core --tasks mmlu --task-data mmlu=../shared/data/eval/mmlu --limit 100
    gptlab eval gpt2 --suite core --bundle download            # DCLM's 22 CORE tasks, as nanochat reports them
    gptlab eval runs/shakespeare/sft --suite chat --tasks spelling,gsm8k --task-data gsm8k=hf:/data/gsm8k
    gptlab eval runs/shakespeare/sft --judge http://127.0.0.1:8000 --alpaca alpaca_eval.jsonl --safety sst.csv
    gptlab eval --checkpoint runs/shakespeare/train/checkpoints/step_000600 --data runs/shakespeare/data
    gptlab eval --checkpoint gpt2 --task hellaswag --limit 1000
    gptlab eval runs/sft --chat-task "arithmetic[digits=4,min_digits=3,tools=1]" --limit 200   # with its calculator
    gptlab eval runs/sft --chat-task "arithmetic[digits=4,min_digits=3,tools=1]" --limit 200 --tools none

The card (gptlab.eval.suite) is printed and saved as OUT/eval.json with OUT/examples.jsonl (every question as
asked, few-shot ids included, and how it was scored). OUT is --out, else RUN/eval-SUITE (eval-core, eval-chat,
eval-judge) when the model belongs to a training run, so `gptlab runs report RUN` shows the cards; a folder is
claimed as gptlab's run folders are: an evaluation with other settings, or a folder of other files, is refused.

The model is any folder gptlab makes or reads (gptlab.cli.common): a run
folder (its newest checkpoint, or RUN/best), a checkpoint, a Hugging Face
GPT-2 / Llama folder, or a hub name already in the local Hugging Face cache.
--chat-task NAME[OPTIONS] grades a chat model's greedy answers to a built-in task's questions (gptlab.eval.chat):
accuracy with its 95% Wilson interval, and per answer the tokens generated, the tokens tools fed and the tool
calls. The task's own tools run while it answers (a task with tools=1 offers the calculator), or --tools SPEC,
or none with --tools none: the same questions with and without tools (gptlab.chat.tasks keeps them alike).

Its tokenizer is --tokenizer, else the one saved with the model, else GPT-2's
for a Hugging Face GPT-2. Data is evaluated only when that tokenizer is the
one the data was prepared with (checked before any compute). Under torchrun,
HellaSwag examples are split over the ranks and rank 0 prints.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gptlab.cli.common import DEVICE_HELP, add_quantize_argument, add_tool_arguments, positive
from gptlab.runtime import GptlabError
from gptlab.runtime.optional import require

TASK_NAMES = ("hellaswag",)


def register(stages) -> None:
    parser = stages.add_parser("eval", help="evaluate a model: a report card (CORE, chat tasks, an LM judge), val bits per byte")
    parser.add_argument("model", nargs="?", metavar="MODEL", help="the model (as --checkpoint)")
    parser.add_argument("--checkpoint", metavar="MODEL", help="a run folder, a checkpoint, a Hugging Face folder or a cached hub name")
    card = parser.add_argument_group("report card")
    card.add_argument("--suite", choices=("core", "chat"), help="core: few-shot likelihood tasks (CORE); chat: conversations checked")
    card.add_argument("--tasks", metavar="LIST", help="comma-separated tasks of the suite (default: all of them)")
    card.add_argument("--task-data", action="append", default=[], metavar="TASK=SOURCE",
                      help="a task's data: a .jsonl/.parquet file, a folder, or hf:NAME[:CONFIG][@REVISION] (repeatable)")
    card.add_argument("--bundle", metavar="DIR|download", help="DCLM's eval bundle: its 22 CORE tasks (download: into the cache)")
    card.add_argument("--shots", type=int, metavar="K", help="few-shot examples per question for every task (default: CORE's)")
    card.add_argument("--seed", type=int, default=1234, help="few-shot choice and sampling seed (default 1234)")
    card.add_argument("--samples", type=positive, default=1, metavar="N", help="code tasks: samples per problem for pass@k (default 1)")
    card.add_argument("--k", default="1", metavar="LIST", help="code tasks: the k of pass@k, comma-separated (default 1)")
    card.add_argument("--out", metavar="DIR", help="where eval.json and examples.jsonl go (default RUN/eval-SUITE for a run's model)")
    card.add_argument("--force", action="store_true", help="replace an earlier evaluation's files in --out")
    judge = parser.add_argument_group("LM judge")
    judge.add_argument("--judge", metavar="URL", help="an OpenAI-compatible server that judges (gptlab serve, llama-server, vLLM)")
    judge.add_argument("--judge-model", metavar="NAME", help="the judge's model name at that server")
    judge.add_argument("--judge-key-env", default="GPTLAB_JUDGE_API_KEY", metavar="VAR",
                       help="environment variable holding the judge's API key (default GPTLAB_JUDGE_API_KEY; unset: none)")
    judge.add_argument("--judge-prompts", metavar="DIR", help="a folder of prompt files replacing the judge's (pairwise.md, ...)")
    judge.add_argument("--alpaca", metavar="FILE", help="AlpacaEval instructions with reference outputs: win rate, 1-10 grade")
    judge.add_argument("--safety", metavar="FILE", help="harmful requests (SimpleSafetyTests CSV): the share refused")
    judge.add_argument("--benign", metavar="FILE", help="benign requests: the share wrongly refused (default with --safety: built in)")
    asked = parser.add_argument_group("chat task")
    asked.add_argument("--chat-task", metavar="NAME[OPTIONS]",
                       help="a built-in chat task's accuracy, e.g. arithmetic[digits=4,min_digits=3,tools=1]")
    add_tool_arguments(asked, default="default: the task's own, if it offers any; none: answer without tools")
    parser.add_argument("--data", metavar="DIR", help="prepared shards (`gptlab data prepare`): loss and bits per byte of --split")
    parser.add_argument("--split", help="split of --data to evaluate, all of it (default val); of --chat-task: test (default) or train")
    parser.add_argument("--seq-len", type=positive, metavar="T", help="tokens per window for --data (default: the model's block size)")
    parser.add_argument("--task", choices=TASK_NAMES, help="a benchmark to score by log-likelihood")
    parser.add_argument("--hellaswag-path", metavar="FILE",
                        help="hellaswag_val.jsonl (default: the gptlab cache, downloaded on first use)")
    parser.add_argument("--limit", type=positive, metavar="N", help="each task's (or judge file's) first N questions only")
    parser.add_argument("--tokenizer", "-t", metavar="DIR|NAME", help="tokenizer folder or gpt2 (default: the model's own)")
    parser.add_argument("--batch-size", type=positive, default=16, metavar="B", help="rows per forward pass (default 16)")
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)
    add_quantize_argument(parser)
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="fp32",
                        help="autocast precision (default fp32: exact scores; auto as in training)")
    parser.add_argument("--harness", metavar="TASKS", help="lm-evaluation-harness tasks, comma-separated (e.g. lambada_openai,arc_easy)")
    parser.add_argument("--harness-include", metavar="DIR", help="a folder of extra lm-eval task YAMLs (e.g. tasks over local files)")
    parser.add_argument("--num-fewshot", type=int, metavar="K", help="few-shot examples for --harness tasks")
    parser.set_defaults(handler=run_eval, usage_error=parser.error)


def check_usage(args: argparse.Namespace) -> None:
    """Mistakes in the command line itself exit 2, like argparse's own."""
    if args.model and args.checkpoint:
        args.usage_error(f"give the model once: MODEL {args.model} or --checkpoint {args.checkpoint}")
    args.checkpoint = args.checkpoint or args.model
    if not args.checkpoint:
        args.usage_error("which model? pass MODEL (a run folder, a checkpoint, a Hugging Face folder)")
    if (args.alpaca or args.safety or args.benign or args.judge_model or args.judge_prompts) and not args.judge:
        args.usage_error("--alpaca, --safety, --benign, --judge-model and --judge-prompts go with --judge URL")
    if not (args.data or args.task or args.harness or args.suite or args.judge or args.chat_task):
        args.usage_error("nothing to evaluate: give --suite core|chat, --judge URL, --data DIR, --task hellaswag, "
                         "--chat-task NAME and/or --harness TASKS")
    if args.tools and not args.chat_task:
        args.usage_error("--tools goes with --chat-task NAME")
    if args.data and args.chat_task and args.split:
        args.usage_error("--split names a split of --data or of --chat-task: evaluate one of them at a time")
    if args.hellaswag_path and args.task != "hellaswag":
        args.usage_error("--hellaswag-path goes with --task hellaswag")
    if args.limit is not None and not (args.task or args.harness or args.suite or args.judge or args.chat_task):
        args.usage_error("--limit goes with --suite, --judge, --task, --chat-task or --harness")
    if args.out and not (args.suite or args.judge):
        args.usage_error("--out holds a report card: it goes with --suite or --judge")


def run_eval(args: argparse.Namespace) -> int:
    from gptlab.data.match import check_tokenizer
    from gptlab.eval.output import claim_card_folder
    from gptlab.load.decoding import quantize_loaded
    from gptlab.load.model_folders import find_model, load_model, load_model_tokenizer
    from gptlab.runtime.device import autocast, init_runtime, resolve_precision, shutdown_runtime

    check_usage(args)
    if args.harness:  # said before any weights load
        require("lm_eval", extra="harness", purpose="--harness")
    runtime = init_runtime(args.device)
    try:
        path = find_model(args.checkpoint)
        tokenizer, name = load_model_tokenizer(args.checkpoint, path, _config_only(path), args.tokenizer,
                                               required=bool(args.task or args.harness or args.data or args.suite or args.judge
                                                             or args.chat_task))
        if args.data:
            check_tokenizer(args.data, tokenizer, name)  # before the weights are even read: mismatched ids mean nothing
        asked = chat_task(args, tokenizer) if args.chat_task else None  # the task and its tools, checked before loading
        config = eval_config(args) if args.suite or args.judge else None  # every option checked before the weights load
        chat = chat_format(tokenizer, config)
        out = claim_card_folder(path, config, out=args.out, force=args.force) if config and runtime.is_main else None
        try:
            model, _ = load_model(str(path), device=runtime.device)
            model = quantize_loaded(model, args.quantize).eval()
            context = autocast(runtime.device, resolve_precision(args.precision, runtime.device))
            say = print if runtime.is_main else (lambda line: None)
            if args.data:
                evaluate_data(model, args, context, say)
            if args.task:
                evaluate_task(model, tokenizer, args, context, say)
            if args.harness:
                evaluate_with_harness(model, tokenizer, args, say)
            if asked:
                evaluate_chat_task(model, *asked, args, context, say)
            if config:
                evaluate_card_to(out, model, tokenizer, chat, config, context, runtime, args, say)
        except (GptlabError, KeyboardInterrupt):  # refused or stopped before the card was saved: a new folder goes
            if out is not None:
                out.undo()
            raise
    finally:
        shutdown_runtime(runtime)
    return 0


def eval_config(args: argparse.Namespace):
    """The report card's settings from the command line, checked (gptlab.eval.suite.EvalConfig)."""
    from gptlab.eval.suite import EvalConfig, JudgeSettings

    task_data = {}
    for item in args.task_data:
        task, _, source = item.partition("=")
        if not task or not source:
            raise GptlabError(f"--task-data {item!r}: write TASK=SOURCE, e.g. --task-data mmlu=data/mmlu")
        task_data[task.strip()] = source.strip()
    judge = None
    if args.judge:
        judge = JudgeSettings(url=args.judge, model=args.judge_model, key_env=args.judge_key_env, prompts=args.judge_prompts,
                              alpaca=args.alpaca, safety=args.safety, benign=args.benign)
    return EvalConfig(suite=args.suite, tasks=_names(args.tasks, "--tasks"), task_data=task_data, bundle=_bundle(args.bundle),
                      shots=args.shots, seed=args.seed, limit=args.limit, samples=args.samples,
                      k=tuple(int(k) for k in _names(args.k, "--k", numbers=True)), batch_size=args.batch_size, judge=judge)


def _names(text: str | None, flag: str, numbers: bool = False) -> tuple[str, ...]:
    names = tuple(name.strip() for name in (text or "").split(",") if name.strip())
    if numbers and not all(name.isdigit() for name in names):
        raise GptlabError(f"{flag} {text!r}: give whole numbers separated by commas, e.g. {flag} 1,10")
    return names


def _bundle(spec: str | None) -> str | None:
    """--bundle DIR, or `download`: DCLM's bundle fetched into the gptlab cache (once)."""
    if spec is None:
        return None
    from gptlab.eval.tasks.bundle import bundle_folder, is_bundle

    if spec == "download":
        return str(bundle_folder(download=True))
    if not Path(spec).is_dir() or not is_bundle(spec):
        raise GptlabError(f"--bundle {spec} is not a DCLM eval bundle folder (core.yaml, eval_data/, eval_meta_data.csv); "
                          "pass its folder, or --bundle download")
    return spec


def chat_format(tokenizer, config):
    """The chat format when the tokenizer has gptlab's chat tokens (None otherwise: a base model)."""
    from gptlab.chat import ChatFormat

    if tokenizer is None or config is None or not (config.suite == "chat" or config.judge):
        return None
    try:
        return ChatFormat(tokenizer)
    except GptlabError:
        raise GptlabError("--suite chat and --judge talk to a chat model (one with gptlab's chat tokens, made by `gptlab sft`); "
                          "this model's tokenizer has none: use --suite core for a base model") from None


def evaluate_card_to(folder, model, tokenizer, chat, config, context, runtime, args, say) -> None:
    """Run the card, print it, and save it (rank 0) through gptlab.eval.output."""
    from gptlab.eval.output import save_card, shown
    from gptlab.eval.suite import evaluate_card

    card, examples = evaluate_card(model, config, encode=tokenizer.encode_ordinary, chat=chat, autocast=context,
                                   progress=True, name=str(args.checkpoint))
    if args.quantize != "none":  # a quantised model's card must not pass for the model's own
        card.settings["quantize"] = args.quantize
    say(card.text())
    if folder is None:
        say("(not saved: pass --out DIR to keep eval.json and every question in examples.jsonl)")
    elif runtime.is_main:
        count, where = save_card(folder.path, card, examples), shown(folder.path)
        say(f"saved: {where / 'eval.json'} and {where / 'examples.jsonl'} ({count:,} questions)")


def _config_only(path: Path):
    """A stand-in with the model's config, so its tokenizer is checked before the weights are loaded."""
    from types import SimpleNamespace

    from gptlab.model.hf import read_pretrained_config

    return SimpleNamespace(config=read_pretrained_config(path))


def evaluate_data(model, args: argparse.Namespace, context, say) -> dict:
    """Loss and bits per byte over every whole window of the split, as `gptlab run` reports them."""
    from gptlab.data.shards import split_shards
    from gptlab.eval.loss import evaluate_split

    args.split = args.split or "val"
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
    from gptlab.eval.harness import evaluate_harness, results_table

    results = evaluate_harness(
        model, tokenizer, [task for task in args.harness.split(",") if task], limit=args.limit,
        batch_size=args.batch_size, precision=args.precision, num_fewshot=args.num_fewshot,
        include_path=args.harness_include,
    )
    say(results_table(results))
    return results


def chat_task(args: argparse.Namespace, tokenizer) -> tuple:
    """(chat format, task, tools or None) for --chat-task: the task, its tools and the model's tool tokens checked."""
    from gptlab.chat import ChatFormat
    from gptlab.chat.data import task_from_spec
    from gptlab.tools import reply_limits, task_toolbox
    from gptlab.tools.turn import chat_tools

    task = task_from_spec(args.chat_task, "--chat-task", "--limit")
    toolbox = task_toolbox(args.tools or "auto", task, reply_limits(args.tool_calls, args.tool_seconds))
    try:
        chat = ChatFormat(tokenizer)
    except GptlabError:
        raise GptlabError(f"--chat-task talks to a chat model (one with gptlab's chat tokens, made by `gptlab sft`); "
                          f"{args.checkpoint}'s tokenizer has none") from None
    return chat, task, chat_tools(chat, toolbox)


def evaluate_chat_task(model, chat, task, tools, args: argparse.Namespace, context, say) -> dict:
    """Accuracy with its interval, and what an answer cost (gptlab.eval.chat.evaluate_task)."""
    from gptlab.eval.chat import evaluate_task as evaluate
    from gptlab.eval.stats import wilson_interval

    split = args.split or "test"
    size = getattr(task, "test_size", None) if split == "test" else None
    n = args.limit or 200
    result = evaluate(model, chat, task, n=min(n, size) if size else n, split=split, tools=tools, costs=True,
                      batch_size=args.batch_size, autocast=context)
    low, high = wilson_interval(result["correct"], result["total"])
    offered = ", ".join(spec["function"]["name"] for spec in tools.specs) if tools else "none"
    say(f"{args.chat_task} {split}: accuracy {result['correct']}/{result['total']} = {result['accuracy']:.3f} "
        f"(95% CI {low:.3f}-{high:.3f}), tools {offered}; per answer {result['generated_tokens']:.1f} tokens generated, "
        f"{result['fed_tokens']:.1f} fed by tools, {result['tool_calls']:.2f} tool calls")
    return result
