"""A model and its tokenizer written as one Hugging Face folder, replacing an earlier export all at once.

    check_export_dir("out/hf", force=False)                 refused before anything is read or written
    write_hf_folder(model, tokenizer, "out/hf")   ->  HFExport(architecture="GPT2LMHeadModel", remote_code=False)

The folder is written beside OUT (`.OUT.tmp`) and swapped in, so OUT is the old export or the new one, never half of
each. OUT must be new, empty, or an earlier export (only the files an export writes); with force an earlier export is
replaced. A chat model (its tokenizer holds the chat tokens) carries its chat template, and <|end|> as its eos in
config.json and the tokenizer's files; generate stops at <|end|> or <|endoftext|> (generation_config.json).

Not here: the weights' formats (gptlab.export.hf), the tokenizer's files (gptlab.tokenizer), finding the model a
user names (gptlab.load.model_folders: the command loads it there and passes the model in).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

from gptlab.chat import CHAT_TOKENS, END, chat_template
from gptlab.export.hf import HFExport, check_exportable, export_hf, set_eos_token
from gptlab.model import GPT
from gptlab.runtime import GptlabError, check_out_dir
from gptlab.tokenizer import Tokenizer

HF_FILES = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model", "configuration_gptlab.py", "modeling_gptlab.py")


def check_export_dir(out: str | os.PathLike, *, force: bool = False) -> Path:
    """OUT as a Path if an export may be written there: new, empty, or (with force) an earlier export."""
    out = Path(out)
    existing = check_out_dir(out, HF_FILES, flag="OUT")
    if existing and not force:
        raise GptlabError(f"OUT {out} holds an earlier export ({', '.join(sorted(existing))}); pass --force to replace it")
    return out


def write_hf_folder(model: GPT, tokenizer: Tokenizer, out: str | os.PathLike, *, force: bool = False) -> HFExport:
    """Write `model` and `tokenizer` to OUT so transformers' Auto classes load both (gptlab.export.hf says which class)."""
    out = check_export_dir(out, force=force)
    check_exportable(model.config)
    chat = all(token in tokenizer.special_tokens for token in CHAT_TOKENS)  # a chat model: its template and stop token go along
    eot = tokenizer.eot_id
    eot_text = next((text for text, i in tokenizer.special_tokens.items() if i == eot), None)
    if chat:  # the end of a turn is the eos; the end of text stops generation too, opens a conversation, and pads
        end = tokenizer.special_tokens[END]
        ids = {"eos_token_id": end, "bos_token_id": eot, "stop_token_ids": (end,) if eot is None else (end, eot), "pad_token_id": eot}
    else:
        ids = {"eos_token_id": eot, "pad_token_id": eot}
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        written = export_hf(model, tmp, **ids)
        template = chat_template(start=eot_text) if chat else None
        tokenizer.save_huggingface_dir(tmp, model_max_length=model.config.block_size, chat_template=template)
        if chat:
            set_eos_token(tmp, END)
        if tokenizer.FILE_NAME == "tokenizer.model":  # as Llama folders: the SentencePiece model too, which gptlab reads back
            tokenizer.save(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)  # empty, or only an earlier export's files (checked above)
    os.replace(tmp, out)
    return dataclasses.replace(written, directory=out)
