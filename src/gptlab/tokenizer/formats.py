"""Tokenizer files: gptlab's own format, GPT-2's files, tiktoken rank files (and export to tiktoken).

gptlab's format is one human-readable JSON file, `DIR/tokenizer.json`:

    {"format": "gptlab-bpe", "version": 1, "pattern": "<regex or null>",
     "special_tokens": {"<|endoftext|>": 4095},
     "vocab": [[0, "\\x00"], ..., [256, " t"], ...],      # id, token
     "merges": [[" ", "t"], ...]}                         # in rank order

A token is written as its text when its bytes are UTF-8, with a backslash
doubled and any byte that is not valid UTF-8 written as \\xNN. Loading only
parses JSON and checks it; it never executes anything.

Version 2 adds `"normalizer": "NFC"` (or NFKC, NFD, NFKD: the Unicode form applied before splitting,
from a Hugging Face tokenizer that declares one). A tokenizer without a normaliser is still written as
version 1, so files an older gptlab reads stay readable there; one with a normaliser is version 2, which
an older gptlab refuses rather than encoding without it. This gptlab reads both.

Readers return TokenizerParts; building the Tokenizer is core's job (this module never imports it).
Not here: encoding (gptlab.tokenizer.core), Hugging Face folders (gptlab.tokenizer.huggingface).
"""

from __future__ import annotations

import base64
import codecs
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

from gptlab.runtime import GptlabError, atomic_write_text, read_json
from gptlab.tokenizer.normalize import FORMS

FORMAT_NAME = "gptlab-bpe"
FORMAT_VERSION = 1
NORMALIZER_VERSION = 2  # the version of a file holding a normaliser
FILE_NAME = "tokenizer.json"


class TokenizerParts(NamedTuple):
    """What a reader returns and `Tokenizer(*parts)` takes; `pattern` is regex text (None: no pre-split)."""

    vocab: dict[int, bytes]
    merges: list[tuple[bytes, bytes]]
    special_tokens: dict[str, int]
    pattern: str | None
    normalizer: str | None = None  # Unicode form applied before splitting (gptlab.tokenizer.normalize)


# ------------------------------------------------------------ token <-> readable text


def token_to_text(token: bytes) -> str:
    """b"caf\\xc3\\xa9" -> "café"; b"\\xe4\\xb8" -> "\\\\xe4\\\\xb8"; backslashes doubled."""
    return token.replace(b"\\", b"\\\\").decode("utf-8", errors="backslashreplace")


def text_to_token(text: str) -> bytes:
    data = text.encode("utf-8")
    return codecs.escape_decode(data)[0] if "\\" in text else data  # most tokens hold no escape


# ------------------------------------------------------------ gptlab format


def save_tokenizer(tokenizer, directory: str | os.PathLike) -> Path:
    path = Path(directory) / FILE_NAME
    atomic_write_text(path, tokenizer_file_text(tokenizer))
    return path


def tokenizer_file_text(tokenizer) -> str:
    """The text of `tokenizer.json` in gptlab's format (one token or merge per line, for diffs and reading)."""
    specials = set(tokenizer.special_tokens.values())
    encode = json.JSONEncoder(ensure_ascii=False).encode  # one encoder: json.dumps with options builds one per call
    lines = [
        "{",
        f'"format": {json.dumps(FORMAT_NAME)},',
        f'"version": {NORMALIZER_VERSION if tokenizer.normalizer else FORMAT_VERSION},',
        f'"pattern": {json.dumps(tokenizer.pattern)},',
        *([f'"normalizer": {json.dumps(tokenizer.normalizer)},'] if tokenizer.normalizer else []),
        f'"special_tokens": {json.dumps(tokenizer.special_tokens, ensure_ascii=False)},',
        '"vocab": [',
        ",\n".join(
            encode([i, token_to_text(tokenizer.vocab[i])])
            for i in sorted(tokenizer.vocab)
            if i not in specials
        ),
        "],",
        '"merges": [',
        ",\n".join(encode([token_to_text(a), token_to_text(b)]) for a, b in tokenizer.merges),
        "]",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _require(condition: bool, path: Path, what: str) -> None:
    if not condition:
        raise GptlabError(f"{path} is not a valid gptlab tokenizer file: {what}")


def read_tokenizer_file(path: str | os.PathLike) -> TokenizerParts:
    """The parts stored in gptlab's `tokenizer.json` (or the directory holding it), checked."""
    given = Path(path)
    path = given / FILE_NAME if given.is_dir() else given
    if not path.is_file():
        raise GptlabError(f"no tokenizer at {given} (expected {FILE_NAME}; make one with `gptlab tokenizer train`)")
    return parse_tokenizer_json(read_json(path), path)


def is_tokenizer_json(data) -> bool:
    """Whether parsed JSON claims to be gptlab's format (gptlab's and Hugging Face's files share a name)."""
    return isinstance(data, dict) and data.get("format") == FORMAT_NAME


def parse_tokenizer_json(data, path: Path) -> TokenizerParts:
    """Check and decode the JSON of gptlab's format; `path` only names the file in errors."""
    if isinstance(data, dict) and isinstance(data.get("model"), dict):
        raise GptlabError(f"{path} is a Hugging Face tokenizer.json, not gptlab's format; load it with Tokenizer.from_huggingface")
    _require(isinstance(data, dict) and data.get("format") == FORMAT_NAME, path, f"format is not {FORMAT_NAME!r}")
    version = data.get("version")
    _require(version in (FORMAT_VERSION, NORMALIZER_VERSION), path,
             f"version {version!r}, this gptlab reads {FORMAT_VERSION} and {NORMALIZER_VERSION}")
    normalizer = data.get("normalizer") if version == NORMALIZER_VERSION else None
    _require(normalizer in (None, *FORMS), path, f"normalizer {normalizer!r} is not one of {', '.join(FORMS)} (or null)")
    vocab, merges, specials = data.get("vocab"), data.get("merges"), data.get("special_tokens")
    _require(isinstance(vocab, list) and all(isinstance(e, list) and len(e) == 2 and isinstance(e[0], int) and isinstance(e[1], str) for e in vocab), path, "vocab must be a list of [id, token]")
    _require(isinstance(merges, list) and all(isinstance(e, list) and len(e) == 2 and all(isinstance(t, str) for t in e) for e in merges), path, "merges must be a list of [token, token]")
    _require(isinstance(specials, dict) and all(isinstance(i, int) for i in specials.values()), path, "special_tokens must map text to ids")
    _require(data.get("pattern") is None or isinstance(data["pattern"], str), path, "pattern must be a string or null")
    try:
        token_vocab = {i: text_to_token(text) for i, text in vocab}
        token_merges = [(text_to_token(a), text_to_token(b)) for a, b in merges]
    except ValueError as error:
        raise GptlabError(f"{path} has a badly escaped token: {error}") from None
    _require(len(token_vocab) == len(vocab), path, "an id appears twice in vocab")
    return TokenizerParts(token_vocab, token_merges, specials, data["pattern"], normalizer)


# ------------------------------------------------------------ GPT-2 files


@lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte, used by encoder.json, vocab.bpe and HF tokenizer.json.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes map to
    U+0100 upwards, in byte order (so a space, 0x20, is "Ġ", U+0120).
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in mapping:
            mapping[byte] = chr(256 + extra)
            extra += 1
    return mapping


@lru_cache(maxsize=1)
def unicode_to_byte() -> dict[str, int]:
    return {char: byte for byte, char in byte_to_unicode().items()}


def _unicode_to_bytes(text: str, source: Path) -> bytes:
    reverse = unicode_to_byte()
    try:
        return bytes([reverse[char] for char in text])
    except KeyError:
        raise GptlabError(f"{source}: {text!r} is not a byte-level token") from None


def read_gpt2_files(encoder_json, vocab_bpe) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]], dict[str, int]]:
    encoder_path, merges_path = Path(encoder_json), Path(vocab_bpe)
    for path in (encoder_path, merges_path):
        if not path.is_file():
            raise GptlabError(f"GPT-2 tokenizer file not found: {path}")
    try:
        encoder = json.loads(encoder_path.read_text(encoding="utf-8"))
        lines = merges_path.read_text(encoding="utf-8").split("\n")
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise GptlabError(f"malformed GPT-2 tokenizer files: {error}") from None
    if not isinstance(encoder, dict) or not all(isinstance(i, int) for i in encoder.values()):
        raise GptlabError(f"{encoder_path} must map token strings to ids")
    merge_lines = [line for line in lines[1:] if line.strip()] if lines and lines[0].startswith("#version") else [line for line in lines if line.strip()]
    merges = []
    for number, line in enumerate(merge_lines, start=2):
        parts = line.split(" ")
        if len(parts) != 2:
            raise GptlabError(f"{merges_path}, line {number}: expected two tokens, got {line!r}")
        merges.append((_unicode_to_bytes(parts[0], merges_path), _unicode_to_bytes(parts[1], merges_path)))
    merged = {a + b for a, b in merges}
    vocab: dict[int, bytes] = {}
    special_tokens: dict[str, int] = {}
    for text, i in encoder.items():
        token = _unicode_to_bytes(text, encoder_path) if all(c in unicode_to_byte() for c in text) else None
        if token is not None and (len(token) == 1 or token in merged):
            vocab[i] = token
        else:  # neither a byte nor made by a merge: a special token such as <|endoftext|>
            special_tokens[text] = i
    return vocab, merges, special_tokens


# ------------------------------------------------------------ tiktoken rank files


def read_tiktoken_file(path) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Parse `base64-token rank` lines and recover each token's merge from lower-ranked tokens."""
    path = Path(path)
    if not path.is_file():
        raise GptlabError(f"tiktoken file not found: {path}")
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line:
            continue
        try:
            token_b64, rank = line.split()
            ranks[base64.b64decode(token_b64, validate=True)] = int(rank)
        except ValueError:
            raise GptlabError(f"{path}, line {number}: expected '<base64 token> <rank>'") from None
    return {rank: token for token, rank in ranks.items()}, merges_from_ranks(ranks)


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Recover merges from tiktoken ranks, in rank order.

    tiktoken merges whichever adjacent pair concatenates to the lowest-ranked
    token. Running that on a token's own bytes, with only lower-ranked tokens
    allowed, leaves two parts: the merge that made it.
    """
    merges: list[tuple[bytes, bytes]] = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) == 1:
            continue
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best_rank, best = rank, -1
            for i in range(len(parts) - 1):
                pair_rank = ranks.get(parts[i] + parts[i + 1], rank)
                if pair_rank < best_rank:
                    best_rank, best = pair_rank, i
            if best < 0:
                break
            parts[best : best + 2] = [parts[best] + parts[best + 1]]
        if len(parts) != 2:
            raise GptlabError(f"tiktoken token {token!r} (rank {rank}) cannot be built from lower-ranked tokens")
        merges.append((parts[0], parts[1]))
    return merges


# ------------------------------------------------------------ export


def _check_rank_order(tokenizer) -> None:
    """tiktoken ranks merges by token id, so ids must grow with merge rank."""
    ids_of = {token: i for i, token in tokenizer.vocab.items()}
    previous = -1
    for rank, (left, right) in enumerate(tokenizer.merges):
        i = ids_of[left + right]
        if i <= previous or i <= max(ids_of[bytes([b])] for b in range(256)):
            raise GptlabError(f"cannot export to tiktoken: merge {rank} makes id {i}, but tiktoken needs ids increasing with merge rank")
        previous = i


def to_tiktoken(tokenizer, name: str):
    try:
        import tiktoken
    except ImportError:
        raise GptlabError("to_tiktoken needs the tiktoken package: pip install tiktoken") from None
    _check_rank_order(tokenizer)
    specials = set(tokenizer.special_tokens.values())
    ranks = {token: i for i, token in tokenizer.vocab.items() if i not in specials}
    # tiktoken needs a pattern; "no pre-split" is a pattern matching everything.
    pattern = tokenizer.pattern if tokenizer.pattern is not None else r"[\s\S]+"
    return tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=dict(tokenizer.special_tokens))
