"""Hugging Face tokenizers, both ways: byte-level BPE as `tokenizers` and `transformers` store it.

Writing: `huggingface_json` is the `tokenizer.json` structure (a Split on the pattern, then
ByteLevel, then BPE); `save_huggingface_dir` writes the folder `AutoTokenizer.from_pretrained`
reads: that file, `tokenizer_config.json` and `special_tokens_map.json`.

Reading: `read_huggingface` takes a folder holding a Hugging Face `tokenizer.json`, or GPT-2's
`vocab.json` + `merges.txt`, or such a `tokenizer.json` itself, and returns TokenizerParts.
Only byte-level BPE is read (GPT-2, GPT-4, Llama 3, Qwen2 style): WordPiece, Unigram, sentencepiece-style
BPE, normalizers other than the Unicode forms and prefix spaces would give other ids, so they are refused
in one line. A Unicode normaliser (NFC, NFKC, NFD, NFKD, alone or in a Sequence of them) is kept as the
Tokenizer's `normalizer` and applied as `tokenizers` applies it (gptlab.tokenizer.normalize); writing
puts it back. Special tokens are matched in the text before normalising, as `tokenizers` does for added
tokens with "normalized": false.
Post-processors (e.g. Llama 3's BOS) are not tokenization and are left out.

gptlab's own file is also named `tokenizer.json` (format "gptlab-bpe"); the two are told apart by
content. Not here: gptlab's format (gptlab.tokenizer.formats), building the Tokenizer (core).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import regex

from gptlab.runtime import GptlabError, atomic_write_text, read_json
from gptlab.tokenizer.formats import (
    FILE_NAME,
    TokenizerParts,
    byte_to_unicode,
    is_tokenizer_json,
    read_gpt2_files,
    unicode_to_byte,
)
from gptlab.tokenizer.normalize import form_from_huggingface
from gptlab.tokenizer.patterns import GPT2_PATTERN, from_oniguruma_form, oniguruma_form

CONFIG_NAME = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_NAME = "special_tokens_map.json"
VOCAB_NAME, MERGES_NAME, ADDED_TOKENS_NAME = "vocab.json", "merges.txt", "added_tokens.json"  # GPT-2's layout
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}


# ------------------------------------------------------------ writing


def huggingface_json(tokenizer) -> dict:
    """The tokenizer.json structure of Hugging Face `tokenizers`: byte-level BPE after a regex split."""
    table = byte_to_unicode()

    def show(token: bytes) -> str:
        return "".join(table[b] for b in token)

    specials = set(tokenizer.special_tokens.values())
    vocab = {show(token): i for i, token in sorted(tokenizer.vocab.items()) if i not in specials}
    for text, i in tokenizer.special_tokens.items():
        # `tokenizers` gives an added token the model's id for its text, else the next id after the model's:
        # wrong where ids have gaps (cl100k has none at 100256), so the model's vocab holds the specials too.
        if vocab.setdefault(text, i) != i:
            raise GptlabError(f"cannot export to Hugging Face: special token {text!r} is spelled like token {vocab[text]}")
    pre_tokenizers = [dict(BYTE_LEVEL)]
    if tokenizer.pattern is not None:
        split = {"type": "Split", "pattern": {"Regex": oniguruma_form(tokenizer.pattern)}, "behavior": "Isolated", "invert": False}
        pre_tokenizers.insert(0, split)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
            for text, i in sorted(tokenizer.special_tokens.items(), key=lambda item: item[1])
        ],
        "normalizer": {"type": tokenizer.normalizer} if tokenizer.normalizer else None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": pre_tokenizers},
        "post_processor": None,
        "decoder": dict(BYTE_LEVEL),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [[show(a), show(b)] for a, b in tokenizer.merges],
        },
    }


def save_huggingface(tokenizer, path: str | os.PathLike) -> Path:
    """Write a Hugging Face `tokenizer.json` (into `path` when it is a folder)."""
    path = Path(path)
    if path.is_dir():
        path = path / FILE_NAME
    atomic_write_text(path, json.dumps(huggingface_json(tokenizer), ensure_ascii=False))
    return path


def to_huggingface(tokenizer):
    """A `tokenizers.Tokenizer` giving the same ids."""
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        raise GptlabError("to_huggingface needs the tokenizers package: pip install tokenizers") from None
    return HFTokenizer.from_str(json.dumps(huggingface_json(tokenizer), ensure_ascii=False))


def tokenizer_config(tokenizer, model_max_length: int | None = None) -> tuple[dict, dict]:
    """`tokenizer_config.json` and `special_tokens_map.json` for transformers' PreTrainedTokenizerFast.

    The end-of-text token serves as BOS, EOS and UNK (as in GPT-2's files), and nothing is added
    around the ids (no BOS), so `AutoTokenizer(text).input_ids` equal gptlab's ids.
    """
    eot_id = tokenizer.eot_id
    eot = next((text for text, i in tokenizer.special_tokens.items() if i == eot_id), None)
    roles = {"bos_token": eot, "eos_token": eot, "unk_token": eot} if eot is not None else {}
    others = [text for text, i in sorted(tokenizer.special_tokens.items(), key=lambda item: item[1]) if text != eot]
    special_map = {**roles, **({"additional_special_tokens": others} if others else {})}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special_map,
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,  # else decode rewrites " ," and " 's"
    }
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    return config, special_map


def save_huggingface_dir(tokenizer, directory: str | os.PathLike, *, model_max_length: int | None = None,
                         chat_template: str | None = None) -> Path:
    """Write a folder `transformers.AutoTokenizer.from_pretrained(directory)` loads with the same ids.

    `chat_template` (Jinja, e.g. gptlab.chat.chat_template()) goes into tokenizer_config.json for
    `apply_chat_template`.
    """
    return write_huggingface_folder(directory, lambda: json.dumps(huggingface_json(tokenizer), ensure_ascii=False),
                                    lambda: tokenizer_config(tokenizer, model_max_length),
                                    model_max_length=model_max_length, chat_template=chat_template)


def write_huggingface_folder(directory: str | os.PathLike, tokenizer_json, config_and_map, *,
                             model_max_length: int | None, chat_template: str | None) -> Path:
    """tokenizer.json (the text `tokenizer_json()` makes), tokenizer_config.json and special_tokens_map.json
    (`config_and_map()`), for either tokenizer family. Everything is checked and made before the first write, so a
    refused export leaves nothing behind. Other files in the folder (a model's config.json and weights) are left alone;
    gptlab's own tokenizer.json is never overwritten."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise GptlabError(f"{directory} is a file; pass a folder for the Hugging Face tokenizer")
    if model_max_length is not None and (isinstance(model_max_length, bool) or not isinstance(model_max_length, int) or model_max_length < 1):
        raise GptlabError(f"model_max_length must be a positive number of tokens (the model's context), got {model_max_length!r}")
    target = directory / FILE_NAME
    if target.is_file() and is_tokenizer_json(read_json(target)):
        raise GptlabError(f"{target} is gptlab's own tokenizer file; write the Hugging Face folder elsewhere")
    text = tokenizer_json()
    config, special_map = config_and_map()
    if chat_template is not None:
        config["chat_template"] = chat_template
    atomic_write_text(target, text)
    atomic_write_text(directory / CONFIG_NAME, json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    atomic_write_text(directory / SPECIAL_TOKENS_MAP_NAME, json.dumps(special_map, indent=2, ensure_ascii=False) + "\n")
    return directory


# ------------------------------------------------------------ reading


def is_huggingface_json(data) -> bool:
    """Whether parsed JSON has the shape of a `tokenizers` tokenizer.json (a model and its type)."""
    return isinstance(data, dict) and isinstance(data.get("model"), dict) and "type" in data["model"]


def read_huggingface(path: str | os.PathLike) -> TokenizerParts:
    """A Hugging Face tokenizer folder (tokenizer.json, else vocab.json + merges.txt) or tokenizer.json file."""
    path = Path(path)
    if path.is_file():
        return _read_json_file(path)
    if not path.is_dir():
        raise GptlabError(f"no Hugging Face tokenizer at {path}: it does not exist")
    if (path / FILE_NAME).is_file():
        return _read_json_file(path / FILE_NAME)
    if (path / VOCAB_NAME).is_file() and (path / MERGES_NAME).is_file():
        return read_vocab_and_merges(path)
    raise GptlabError(f"no tokenizer in {path}: expected {FILE_NAME}, or {VOCAB_NAME} + {MERGES_NAME}")


def _read_json_file(path: Path) -> TokenizerParts:
    data = read_json(path)
    if is_tokenizer_json(data):
        raise GptlabError(f"{path} is gptlab's own tokenizer file, not Hugging Face's; load it with Tokenizer.load")
    return parse_huggingface_json(data, path)


def _refuse(path: Path, reason: str) -> GptlabError:
    return GptlabError(f"{path} is not a byte-level BPE tokenizer ({reason}); gptlab reads byte-level BPE only (GPT-2, GPT-4, Llama 3 style)")


def parse_huggingface_json(data, path: Path) -> TokenizerParts:
    """Check a parsed tokenizer.json and turn it into gptlab's parts; `path` names the file in errors."""
    if not is_huggingface_json(data):
        raise GptlabError(f"{path} is neither gptlab's tokenizer file nor a Hugging Face tokenizer.json")
    model = data["model"]
    if model.get("type") != "BPE":
        raise _refuse(path, f"its model is {model.get('type')}")
    normalizer = form_from_huggingface(data.get("normalizer"), lambda reason: _refuse(path, reason))
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise _refuse(path, f"{key} is {model[key]!r}")
    if model.get("dropout"):
        raise _refuse(path, f"BPE dropout {model['dropout']} makes ids random")
    decoder = data.get("decoder")
    if decoder is not None and decoder.get("type") != "ByteLevel":
        raise _refuse(path, f"its decoder is {decoder.get('type')}")
    pattern = _pattern_of(data.get("pre_tokenizer"), path)
    special_tokens = {}
    for added in data.get("added_tokens") or []:
        if not isinstance(added, dict) or not isinstance(added.get("content"), str) or not isinstance(added.get("id"), int):
            raise GptlabError(f"{path}: added_tokens entries need a content string and an id")
        special_tokens[added["content"]] = added["id"]
    vocab, merges = _vocab_and_merges(model, set(special_tokens.values()), path)
    return TokenizerParts(vocab, merges, special_tokens, pattern, normalizer)


def _pattern_of(pre_tokenizer, path: Path) -> str | None:
    """The split regex of [Split(regex), ByteLevel] or [ByteLevel(use_regex)]; None for a lone ByteLevel."""
    if not isinstance(pre_tokenizer, dict):
        raise _refuse(path, "it has no ByteLevel pre-tokenizer")
    steps = pre_tokenizer.get("pretokenizers", []) if pre_tokenizer.get("type") == "Sequence" else [pre_tokenizer]
    kinds = [step.get("type") for step in steps]
    if kinds not in (["ByteLevel"], ["Split", "ByteLevel"]):
        raise _refuse(path, f"its pre-tokenizers are {kinds}, not a Split then ByteLevel")
    byte_level = steps[-1]
    if byte_level.get("add_prefix_space"):
        raise _refuse(path, "ByteLevel adds a prefix space, which changes the ids of the first word")
    if len(steps) == 1:
        return GPT2_PATTERN if byte_level.get("use_regex", True) else None
    split = steps[0]
    if byte_level.get("use_regex", True):
        raise _refuse(path, "ByteLevel splits again with GPT-2's regex after the Split")
    if split.get("behavior") != "Isolated" or split.get("invert"):
        raise _refuse(path, f"its Split has behavior {split.get('behavior')!r}, invert {split.get('invert')!r}")
    pattern = split.get("pattern") or {}
    if "Regex" in pattern:
        return from_oniguruma_form(pattern["Regex"])
    if "String" in pattern:
        return regex.escape(pattern["String"])
    raise _refuse(path, f"its Split pattern is {pattern!r}")


def _to_bytes(text: str, path: Path) -> bytes:
    reverse = unicode_to_byte()
    try:
        return bytes([reverse[char] for char in text])
    except KeyError:
        raise _refuse(path, f"the token {text[:40]!r} is not spelled in byte-level characters") from None


def _vocab_and_merges(model: dict, special_ids: set[int], path: Path) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    tokens, merge_entries = model.get("vocab"), model.get("merges")
    if not isinstance(tokens, dict) or not isinstance(merge_entries, list):
        raise GptlabError(f"{path}: the BPE model needs a vocab mapping and a merges list")
    vocab = {i: _to_bytes(text, path) for text, i in tokens.items() if i not in special_ids}
    merges = []
    for number, entry in enumerate(merge_entries):
        parts = entry.split(" ") if isinstance(entry, str) else entry
        if not isinstance(parts, list) or len(parts) != 2 or not all(isinstance(part, str) for part in parts):
            raise GptlabError(f"{path}: merge {number} is {entry!r}, not two tokens")
        merges.append((_to_bytes(parts[0], path), _to_bytes(parts[1], path)))
    return vocab, merges


def read_vocab_and_merges(directory: Path) -> TokenizerParts:
    """GPT-2's layout as transformers saves it: vocab.json + merges.txt, and added tokens if any."""
    vocab, merges, special_tokens = read_gpt2_files(directory / VOCAB_NAME, directory / MERGES_NAME)
    if (directory / ADDED_TOKENS_NAME).is_file():
        added = read_json(directory / ADDED_TOKENS_NAME)
        if not isinstance(added, dict) or not all(isinstance(i, int) for i in added.values()):
            raise GptlabError(f"{directory / ADDED_TOKENS_NAME} must map token text to ids")
        special_tokens.update(added)
    config = read_json(directory / CONFIG_NAME) if (directory / CONFIG_NAME).is_file() else {}
    if isinstance(config, dict) and config.get("add_prefix_space"):
        raise _refuse(directory / CONFIG_NAME, "add_prefix_space is true, which changes the ids of the first word")
    for i, entry in ((config.get("added_tokens_decoder") or {}) if isinstance(config, dict) else {}).items():
        if isinstance(entry, dict) and isinstance(entry.get("content"), str) and str(i).isdigit():
            special_tokens[entry["content"]] = int(i)
    return TokenizerParts(vocab, merges, special_tokens, GPT2_PATTERN)
