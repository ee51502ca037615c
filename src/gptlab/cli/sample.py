"""`gptlab sample`: text from a saved model, streamed to stdout as tokens arrive.

The model is any folder gptlab makes or reads (gptlab.load.model_folders): a run
folder, a checkpoint, a Hugging Face folder. The tokenizer is `--tokenizer`,
else the one saved with the model. Generation stops at the tokenizer's
end-of-text id (and a chat model's at its end-of-turn, `<|end|>`) and never draws an id the tokenizer cannot decode. With --num-samples N the samples run one after the
other, sample k seeded with seed + k, separated by a line of dashes.

With --best-of N --reward SPEC each sample is the best of N candidates drawn together (sample k's
candidate j seeded with seed + k·N + j, so N = 1 is plain sampling), scored by the reward
(gptlab.align.rl.best_of); the chosen text goes to stdout and a line to stderr gives its reward
against the candidates' mean, min and max. With --task NAME the prompts are the first
--num-samples questions of the task's test split, rendered for a chat model, and
`--reward verifier` checks each candidate's answer.

With --tools SPEC a chat model's calls run as it generates (gptlab.tools): the sample shows the whole transcript,
each `<|call|>...<|end|>` followed by the `<|tool|>` result fed back and the model's answer after it; with --task
the questions are rendered offering those tools.
"""

from __future__ import annotations

import argparse
import sys

from gptlab.cli.common import (
    DEVICE_HELP,
    add_decoding_arguments,
    add_model_argument,
    add_tool_arguments,
    check_tool_tokens,
    load_for_decoding,
    load_toolbox,
)
from gptlab.runtime import GptlabError

DEFAULT_NEW_TOKENS = 256
SEPARATOR = "-" * 40


def register(stages) -> None:
    parser = stages.add_parser("sample", help="generate text from a saved model")
    add_model_argument(parser)
    parser.add_argument("--prompt", metavar="TEXT", help="text to continue; \"\" starts from the end-of-text token")
    parser.add_argument("--task", metavar="NAME", help="instead of --prompt: questions of a built-in task's test split "
                        "(a chat model answers them), e.g. arithmetic or arithmetic[digits=2]")
    parser.add_argument("--tokenizer", "-t", metavar="DIR|NAME",
                        help="tokenizer folder, file or .model, or gpt2 / cl100k_base / o200k_base (default: the model's own)")
    parser.add_argument(
        "--max-new-tokens", type=int, metavar="N",
        help=f"tokens to generate per sample (default: {DEFAULT_NEW_TOKENS}, or fewer to fit the model's context)",
    )
    parser.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1.0)")
    parser.add_argument("--top-k", type=int, metavar="K", help="sample from the K most likely tokens only")
    parser.add_argument("--top-p", type=float, metavar="P", help="nucleus sampling: the most likely tokens holding probability P")
    parser.add_argument("--seed", type=int, help="seed for reproducible samples (default: random)")
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)
    add_decoding_arguments(parser)
    add_tool_arguments(parser)
    parser.add_argument("--num-samples", type=int, default=1, metavar="N", help="samples to draw (default 1)")
    parser.add_argument("--best-of", type=int, default=1, metavar="N",
                        help="draw N candidates per sample and print the one --reward scores highest (default 1)")
    parser.add_argument("--reward", metavar="SPEC", help="what --best-of picks by: rm:DIR (a reward model), judge:URL, "
                        "file.py:function, verifier (with --task), or weighted sums such as rm:runs/rm,my.py:brevity*0.1")
    parser.set_defaults(handler=run_sample)


def run_sample(args: argparse.Namespace) -> int:
    from gptlab.infer import SamplingConfig

    if args.num_samples < 1:
        raise GptlabError(f"--num-samples must be at least 1, got {args.num_samples}")
    reward = load_reward(args)  # before the model: a bad spec costs no compute
    toolbox = load_toolbox(args)
    if toolbox is not None and (reward is not None or args.draft):
        raise GptlabError("--tools runs with plain sampling: leave out --best-of/--reward and --draft")
    model, tokenizer, draft = load_for_decoding(args)
    if toolbox is not None:
        check_tool_tokens(args, tokenizer)
    decoder = None
    if draft is not None and reward is None:
        from gptlab.infer.speculative import SpeculativeDecoder

        decoder = SpeculativeDecoder(model, draft, args.draft_tokens)
    specs = toolbox.specs() if toolbox is not None else None
    prompts, stop_tokens = task_prompts(args, tokenizer, specs) if args.task else text_prompts(args, tokenizer)
    engine = None
    try:
        for k, (shown, ids, example) in enumerate(prompts):
            new = new_tokens(args, ids, model.config.block_size)
            seed = None if args.seed is None else args.seed + k * args.best_of  # candidate j: seed + k·N + j
            config = SamplingConfig(max_new_tokens=new, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                    stop_tokens=stop_tokens, seed=seed, vocab_size=tokenizer.vocab_size)
            if k:
                print(SEPARATOR)
            write(shown)
            if reward is None:
                stream_sample(model, tokenizer, ids, config, decoder, tool_turn(tokenizer, toolbox))
                continue
            from gptlab.align.rl.best_of import best_of_reply
            from gptlab.infer import Engine, EngineConfig
            from gptlab.infer.best_of import describe

            engine = engine or Engine(model, EngineConfig(slots=args.best_of, draft_tokens=args.draft_tokens), draft=draft)
            prompt = example.question if example is not None else args.prompt
            result, text = best_of_reply(engine, tokenizer, ids, config, args.best_of, reward, prompt, example)
            write(text + "\n")
            print(describe(result.summary()), file=sys.stderr, flush=True)
    finally:
        if engine is not None:
            engine.close()
    if draft is not None:
        from gptlab.infer.speculative import SpeculativeStats

        stats = decoder.stats if decoder is not None else SpeculativeStats(engine.stats.proposed, engine.stats.accepted, engine.stats.steps)
        print(stats.describe(args.draft_tokens), file=sys.stderr, flush=True)
    return 0


def load_reward(args: argparse.Namespace):
    """The --reward, loaded; None for plain sampling. Exactly one of --prompt and --task."""
    from gptlab.align.rl.best_of import best_of_reward

    if (args.prompt is None) == (args.task is None):
        raise GptlabError("give --prompt TEXT (text to continue) or --task NAME (questions of a built-in task), one of them")
    return best_of_reward(args.best_of, args.reward, task=args.task, where="`gptlab sample --prompt`")


def text_prompts(args: argparse.Namespace, tokenizer) -> tuple[list, tuple[int, ...]]:
    """--prompt, once per sample: (shown text, ids, no example), and the stop tokens: end-of-text, and a chat model's
    end-of-turn (past it a chat model writes the next turn's junk, which a --best-of reward would score as the reply)."""
    from gptlab.chat import ChatFormat

    eot = tokenizer.eot_id
    ids = tokenizer.encode(args.prompt, allowed_special="all")
    if not ids:
        if eot is None:
            raise GptlabError("the prompt is empty and the tokenizer has no end-of-text token to start from; give --prompt TEXT")
        ids = [eot]
    try:
        stops = ChatFormat(tokenizer).stop_tokens
    except GptlabError:  # not a chat model
        stops = () if eot is None else (eot,)
    return [(args.prompt, ids, None)] * args.num_samples, stops


def tool_turn(tokenizer, toolbox):
    """A fresh tool loop for one sample (gptlab.tools.turn), or None without --tools."""
    if toolbox is None:
        return None
    from gptlab.chat import ChatFormat
    from gptlab.tools.turn import ToolTurn

    return ToolTurn(ChatFormat(tokenizer), toolbox)


def task_prompts(args: argparse.Namespace, tokenizer, tools: list | None = None) -> tuple[list, tuple[int, ...]]:
    """The task's first --num-samples test questions as chat prompts: (question line, ids, example), and the chat stop tokens."""
    from gptlab.align.rl.best_of import task_questions
    from gptlab.chat import ChatFormat

    try:
        chat = ChatFormat(tokenizer)
    except GptlabError:
        raise GptlabError(f"--task needs a chat model, and {args.checkpoint}'s tokenizer has no chat tokens; fine-tune it "
                          "with `gptlab sft` first, or give --prompt TEXT") from None
    _, examples = task_questions(args.task, args.num_samples)
    prompts = [(example.question + "\n", chat.prompt([{"role": "user", "content": example.question}], tools=tools), example)
               for example in examples]
    return prompts, chat.stop_tokens


def new_tokens(args: argparse.Namespace, ids: list[int], block: int) -> int:
    """--max-new-tokens, or as many as fit (up to the default); one error when the prompt leaves no room."""
    room = block - len(ids)
    if room < 1:
        raise GptlabError(f"the prompt is {len(ids)} tokens, which fills the model's context ({block}); shorten it")
    new = args.max_new_tokens if args.max_new_tokens is not None else min(DEFAULT_NEW_TOKENS, room)
    if new > room:
        raise GptlabError(f"prompt of {len(ids)} tokens + --max-new-tokens {new} exceeds the model's context ({block}); use at most {room}")
    return new


def stream_sample(model, tokenizer, ids: list[int], config, decoder=None, turn=None) -> None:
    """One sample written as its tokens arrive (through the speculative `decoder` when --draft is given; with the
    tool loop `turn`, tools' results included)."""
    from gptlab.chat.text import TextStream
    from gptlab.infer import stream

    # Tokens can end inside a UTF-8 character: TextStream holds such bytes back until complete. It reads the
    # prompt (already shown) first, so a SentencePiece continuation keeps its leading space, as `decode` would.
    text = TextStream(tokenizer)
    for token in ids:
        text.add(token)
    tokens = decoder.stream(ids, config) if decoder is not None else (token for _, token in stream(model, [ids], config, tools=[turn]))
    for token in tokens:
        write(text.add(token))
    write(text.flush() + "\n")


def write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
