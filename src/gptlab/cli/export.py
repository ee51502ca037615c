"""`gptlab export hf MODEL OUT`: a model and its tokenizer as one Hugging Face folder.

    gptlab export hf runs/shakespeare out/shakespeare-hf

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("out/shakespeare-hf", trust_remote_code=True)  # gptlab's logits
    tokenizer = AutoTokenizer.from_pretrained("out/shakespeare-hf", trust_remote_code=True)    # gptlab's ids

MODEL is any folder gptlab reads (gptlab.cli.common). The weights go through
gptlab.export.export_hf: GPT2LMHeadModel, LlamaForCausalLM or Qwen3ForCausalLM where
one computes the model exactly, else gptlab's own modeling code written into OUT
(trust_remote_code=True); the line printed says which. The tokenizer goes through the
tokenizer's Hugging Face writer.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from gptlab.chat import CHAT_TOKENS, END, chat_template
from gptlab.cli.common import add_model_argument, load_model_from, load_model_tokenizer
from gptlab.runtime import GptlabError, check_out_dir

HF_FILES = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "vocab.json", "merges.txt", "configuration_gptlab.py", "modeling_gptlab.py")


def register(stages) -> None:
    parser = stages.add_parser("export", help="write a model in another format (hf: a Hugging Face folder)")
    formats = parser.add_subparsers(dest="format", metavar="FORMAT", required=True, parser_class=type(parser))
    hf = formats.add_parser("hf", help="a Hugging Face folder: AutoModelForCausalLM and AutoTokenizer load it")
    add_model_argument(hf, positional=True)
    hf.add_argument("out", metavar="OUT", help="the folder to write (new or empty, or an earlier export with --force)")
    hf.add_argument("--tokenizer", "-t", metavar="DIR|NAME", help="the model's tokenizer (default: the one saved with it)")
    hf.add_argument("--force", action="store_true", help="replace an earlier export in OUT")
    hf.set_defaults(handler=run_export_hf)


def run_export_hf(args: argparse.Namespace) -> int:
    from gptlab.export import check_exportable, export_hf

    out = Path(args.out)
    existing = check_out_dir(out, HF_FILES, flag="OUT")
    if existing and not args.force:
        raise GptlabError(f"OUT {out} holds an earlier export ({', '.join(sorted(existing))}); pass --force to replace it")
    model, path = load_model_from(args.checkpoint)
    check_exportable(model.config)  # before the tokenizer is read or anything is written
    tokenizer, _ = load_model_tokenizer(args.checkpoint, path, model, args.tokenizer)
    chat = all(token in tokenizer.special_tokens for token in CHAT_TOKENS)  # a chat model: its template and stop token go along
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:  # written beside OUT, then swapped in: OUT is the old export or the new one, never half of each
        written = export_hf(model, tmp, eos_token_id=tokenizer.special_tokens[END] if chat else tokenizer.eot_id)
        tokenizer.save_huggingface_dir(tmp, model_max_length=model.config.block_size, chat_template=chat_template() if chat else None)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)  # empty, or only an earlier export's files (checked above)
    os.replace(tmp, out)
    print(f"exported {args.checkpoint} ({model.config.arch}, {model.num_params():,} parameters) {written.describe()} with its "
          f"tokenizer ({tokenizer.vocab_size:,} ids) to {out}")
    return 0
