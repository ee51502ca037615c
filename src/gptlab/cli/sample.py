"""`gptlab sample`: text from a saved model, streamed to stdout as tokens arrive.

The model is any folder gptlab makes or reads (gptlab.align.model_folders): a run
folder, a checkpoint, a Hugging Face folder. The tokenizer is `--tokenizer`,
else the one saved with the model. Generation stops at the tokenizer's
end-of-text id and never draws an id the tokenizer cannot decode. With --num-samples N the samples run one after the
other, sample k seeded with seed + k, separated by a line of dashes.
"""

from __future__ import annotations

import argparse
import codecs
import sys

from gptlab.align.model_folders import load_model, load_model_tokenizer
from gptlab.cli.common import DEVICE_HELP, add_model_argument, pick_device
from gptlab.runtime import GptlabError

DEFAULT_NEW_TOKENS = 256
SEPARATOR = "-" * 40


def register(stages) -> None:
    parser = stages.add_parser("sample", help="generate text from a saved model")
    add_model_argument(parser)
    parser.add_argument("--prompt", required=True, metavar="TEXT", help="text to continue; \"\" starts from the end-of-text token")
    parser.add_argument("--tokenizer", "-t", metavar="DIR|NAME", help="tokenizer folder or gpt2 / cl100k_base (default: the model's own)")
    parser.add_argument(
        "--max-new-tokens", type=int, metavar="N",
        help=f"tokens to generate per sample (default: {DEFAULT_NEW_TOKENS}, or fewer to fit the model's context)",
    )
    parser.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1.0)")
    parser.add_argument("--top-k", type=int, metavar="K", help="sample from the K most likely tokens only")
    parser.add_argument("--top-p", type=float, metavar="P", help="nucleus sampling: the most likely tokens holding probability P")
    parser.add_argument("--seed", type=int, help="seed for reproducible samples (default: random)")
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)
    parser.add_argument("--num-samples", type=int, default=1, metavar="N", help="samples to draw (default 1)")
    parser.set_defaults(handler=run_sample)


def run_sample(args: argparse.Namespace) -> int:
    from gptlab.infer import SamplingConfig, stream

    if args.num_samples < 1:
        raise GptlabError(f"--num-samples must be at least 1, got {args.num_samples}")
    model, path = load_model(args.checkpoint, device=pick_device(args.device))
    tokenizer, _ = load_model_tokenizer(args.checkpoint, path, model, args.tokenizer)
    eot = tokenizer.eot_id
    ids = tokenizer.encode(args.prompt, allowed_special="all")
    if not ids:
        if eot is None:
            raise GptlabError("the prompt is empty and the tokenizer has no end-of-text token to start from; give --prompt TEXT")
        ids = [eot]
    block = model.config.block_size
    room = block - len(ids)
    if room < 1:
        raise GptlabError(f"the prompt is {len(ids)} tokens, which fills the model's context ({block}); shorten it")
    new = args.max_new_tokens if args.max_new_tokens is not None else min(DEFAULT_NEW_TOKENS, room)
    if new > room:
        raise GptlabError(f"prompt of {len(ids)} tokens + --max-new-tokens {new} exceeds the model's context ({block}); use at most {room}")
    for k in range(args.num_samples):
        config = SamplingConfig(
            max_new_tokens=new, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            stop_tokens=() if eot is None else (eot,), seed=None if args.seed is None else args.seed + k,
            vocab_size=tokenizer.vocab_size,
        )
        if k:
            print(SEPARATOR)
        write(args.prompt)
        # Tokens can end inside a UTF-8 character: the incremental decoder holds such bytes back until complete.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for _, token in stream(model, [ids], config):
            write(decoder.decode(tokenizer.decode_bytes([token])))
        write(decoder.decode(b"", final=True) + "\n")
    return 0


def write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
