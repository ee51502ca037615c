"""SentencePiece BPE models written as Hugging Face tokenizers (Llama style), with the library's ids.

`to_huggingface_json` is the `tokenizer.json` text of a `tokenizers` BPE model: every piece in the vocab
at its id, merges derived from the pieces (each split of a normal piece into two normal pieces, ranked by
the merged piece's score, as SentencePiece merges the highest score first), byte fallback and fuse_unk
as in Llama 2. The pipeline is the one transformers' LlamaConverter writes for legacy=False: the
model's charsmap (Precompiled) and whitespace rules as the normaliser, a Metaspace pre-tokenizer that
turns spaces into "▁" and prepends the dummy prefix to the text's start, and a decoder that undoes both
and joins byte pieces into characters. User-defined pieces are cut out whole before BPE (a Split), as
SentencePiece never merges through them.

`save_huggingface_dir` writes the folder `transformers.AutoTokenizer.from_pretrained` reads:
tokenizer.json, tokenizer_config.json and special_tokens_map.json. No BOS is added (add_bos_token
false), because gptlab's encode adds none: AutoTokenizer's input_ids equal gptlab's and the library's
`encode(text)`.

Not here: reading such files back (not supported), byte-level BPE (gptlab.tokenizer.huggingface).
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import regex

from gptlab.runtime import GptlabError
from gptlab.tokenizer.huggingface import write_huggingface_folder
from gptlab.tokenizer.sp_model import CONTROL, NORMAL, SPACE, UNKNOWN, USER_DEFINED, SentencePieceModel


def _model_of(tokenizer) -> SentencePieceModel:
    model = tokenizer if isinstance(tokenizer, SentencePieceModel) else getattr(tokenizer, "model", None)
    if not isinstance(model, SentencePieceModel):
        raise GptlabError(f"{type(tokenizer).__name__} is not a SentencePiece tokenizer; export byte-level ones with gptlab.tokenizer.huggingface")
    return model


def _special_tokens(tokenizer, model: SentencePieceModel) -> dict[str, int]:
    """The tokenizer's special tokens (control pieces, and any added later), else the model's control and unknown pieces."""
    specials = dict(getattr(tokenizer, "special_tokens", None) or {})
    for i, piece in enumerate(model.pieces):
        if piece.kind == CONTROL:
            specials.setdefault(piece.text, i)
    return specials


def merges_of(model: SentencePieceModel) -> list[tuple[str, str]]:
    """Every (left, right) of normal pieces whose join is a normal piece; highest-scoring join first.

    Pieces "▁", "t", "h", "▁t", "he", "▁th" with scores 0, -1, -2, ... (joins first) give
    [("▁", "t"), ("h", "e")... ] ranked by the join's score, then its id, then the left part's length.
    """
    normal = {piece.text: (piece.score, i) for i, piece in enumerate(model.pieces) if piece.kind == NORMAL}
    ranked = []
    for text, (score, i) in normal.items():
        for cut in range(1, len(text)):
            left, right = text[:cut], text[cut:]
            if left in normal and right in normal:
                ranked.append((-score, i, cut, left, right))
    return [(left, right) for *_, left, right in sorted(ranked)]


def _normalizer(model: SentencePieceModel) -> dict | None:
    spec = model.normalizer
    steps = []
    if spec.charsmap:
        steps.append({"type": "Precompiled", "precompiled_charsmap": base64.b64encode(spec.charsmap).decode("ascii")})
    if spec.remove_extra_whitespaces:  # only spaces: SentencePiece leaves newlines and tabs alone
        steps.append({"type": "Replace", "pattern": {"Regex": r"\A +| +\z"}, "content": ""})
        steps.append({"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "})
    if spec.add_dummy_prefix:
        # the dummy prefix here, after the whitespace rules, not by Metaspace: Metaspace skips it when the text
        # starts with a space or "▁", or when stripping moved the start; SentencePiece always adds it
        steps.append({"type": "Prepend", "prepend": SPACE})
    return {"type": "Sequence", "normalizers": steps} if steps else None


def _pre_tokenizer(model: SentencePieceModel) -> dict:
    steps = [{"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "never", "split": False}]  # spaces to "▁"
    user_defined = [piece.text for piece in model.pieces if piece.kind == USER_DEFINED]
    if user_defined:
        pattern = "|".join(regex.escape(text) for text in sorted(user_defined, key=len, reverse=True))
        steps.append({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False})
    return {"type": "Sequence", "pretokenizers": steps}


def _decoder(model: SentencePieceModel) -> dict:
    steps = [{"type": "Replace", "pattern": {"String": SPACE}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]
    unk = next((piece.text for piece in model.pieces if piece.kind == UNKNOWN), None)
    if unk is not None:  # <unk> is an ordinary vocab token (not skipped as special) that decodes as the library's " ⁇ "
        steps.insert(0, {"type": "Replace", "pattern": {"String": unk}, "content": model.unk_surface})
    if model.normalizer.add_dummy_prefix:  # the dummy prefix's space, once, at the start of the text
        steps.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {"type": "Sequence", "decoders": steps}


def huggingface_json(tokenizer) -> dict:
    """The tokenizer.json structure of a Llama-style (BPE, byte fallback, Metaspace) Hugging Face tokenizer."""
    model = _model_of(tokenizer)
    if model.treat_whitespace_as_suffix or not model.normalizer.escape_whitespaces:
        raise GptlabError("cannot export to Hugging Face: the model treats whitespace as a suffix or does not escape it, which Llama's pipeline cannot express")
    vocab = {piece.text: i for i, piece in enumerate(model.pieces)}
    specials = _special_tokens(tokenizer, model)
    for text, i in specials.items():
        if vocab.setdefault(text, i) != i:
            raise GptlabError(f"cannot export to Hugging Face: special token {text!r} (id {i}) is spelled like piece {vocab[text]}")
    unk = next((piece.text for piece in model.pieces if piece.kind == UNKNOWN), None)
    added = [
        {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
        for text, i in sorted(specials.items(), key=lambda item: item[1])
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": _normalizer(model),
        "pre_tokenizer": _pre_tokenizer(model),
        "post_processor": None,  # no BOS: gptlab's encode adds none
        "decoder": _decoder(model),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": unk,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": model.byte_fallback,
            "ignore_merges": any(piece.kind == USER_DEFINED for piece in model.pieces),  # user-defined pieces stay whole
            "vocab": vocab,
            "merges": [list(pair) for pair in merges_of(model)],
        },
    }


def to_huggingface_json(tokenizer) -> str:
    """`tokenizer.json` text for `tokenizers.Tokenizer.from_str`, giving the same ids as the model."""
    return json.dumps(huggingface_json(tokenizer), ensure_ascii=False)


def tokenizer_config(tokenizer, model_max_length: int | None = None) -> tuple[dict, dict]:
    """`tokenizer_config.json` and `special_tokens_map.json`: Llama's roles (<s>, </s>, <unk>), nothing added to the ids."""
    model = _model_of(tokenizer)
    specials = _special_tokens(tokenizer, model)
    unk = next((piece.text for piece in model.pieces if piece.kind == UNKNOWN), None)
    roles = {role: text for role, text in (("bos_token", "<s>"), ("eos_token", "</s>")) if text in specials}
    if unk is not None:
        roles["unk_token"] = unk
    others = [text for text, _ in sorted(specials.items(), key=lambda item: item[1]) if text not in roles.values()]
    special_map = {**roles, **({"additional_special_tokens": others} if others else {})}
    config = {
        # not LlamaTokenizer(Fast): transformers 5 rebuilds that class's normaliser and loses the leading-space rule
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special_map,
        "add_bos_token": False,  # gptlab's encode adds no BOS; prepend <s> yourself where a model wants it
        "add_eos_token": False,
        "legacy": False,
        "add_prefix_space": None,
        "clean_up_tokenization_spaces": False,  # else decode rewrites " ," and " 's"
    }
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    return config, special_map


def save_huggingface_dir(tokenizer, directory: str | os.PathLike, *, model_max_length: int | None = None,
                         chat_template: str | None = None) -> Path:
    """Write a folder `transformers.AutoTokenizer.from_pretrained(directory)` loads with the same ids.

    As gptlab.tokenizer.huggingface.save_huggingface_dir: other files in the folder (a model's config.json
    and weights) are left alone, gptlab's own tokenizer.json is never overwritten. `chat_template` (Jinja)
    goes into tokenizer_config.json for `apply_chat_template`.
    """
    return write_huggingface_folder(directory, lambda: to_huggingface_json(tokenizer),
                                    lambda: tokenizer_config(tokenizer, model_max_length),
                                    model_max_length=model_max_length, chat_template=chat_template)
