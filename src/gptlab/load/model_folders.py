"""The model a user names, found and loaded with its tokenizer: what sample, chat, serve, eval and export start from.

A model is named by any folder gptlab makes or reads:

    runs/shakespeare                        a `gptlab run` folder: its newest checkpoint
    runs/shakespeare/best                   ... or the best by val loss (also RUN/latest)
    runs/train-20261123-201500              a `gptlab train` folder, the same way
    runs/.../checkpoints/step_000600        one checkpoint
    out/hf                                  a Hugging Face folder (gpt2, llama, qwen3), e.g. from `gptlab export hf`
    gpt2                                    a hub name already in the local Hugging Face cache

    model, folder = load_model("runs/shakespeare")
    tokenizer, name = load_model_tokenizer("runs/shakespeare", folder, model, None)

Its tokenizer is the one named explicitly (--tokenizer) when given, else the one saved with the model
(`CHECKPOINT/tokenizer/`, or the tokenizer files of a Hugging Face folder), else GPT-2's for a Hugging Face GPT-2.
A --tokenizer other than the one saved with the model (by fingerprint) is refused: it would give the model other ids.

Why here, in its own stage: a run folder is read through the checkpoint layout (gptlab.load.checkpoints), a Hugging
Face folder through gptlab.model.hf, and the tokenizer beside either through gptlab.data.match. model may not import
tokenizers, so the loader sits one stage above model and below every stage that starts from a model (eval, train,
align, export, serve and their commands), none of which then depends on another to load one.
"""

from __future__ import annotations

import json
from pathlib import Path

from gptlab.data.match import find_model_tokenizer, load_tokenizer
from gptlab.load.checkpoints import find_checkpoint
from gptlab.model import GPT
from gptlab.model.hf import load_pretrained_directory, pretrained_path
from gptlab.runtime import GptlabError

GPT2_VOCAB_SIZE = 50257


def find_model(spec: str) -> Path:
    """The folder holding the model `spec` names (a checkpoint, a gptlab model, a Hugging Face folder)."""
    return find_checkpoint(spec) or pretrained_path(spec)


def load_model(spec: str, device="cpu") -> tuple[GPT, Path]:
    """(model, folder) for any model `spec` names; one clear error when it names none."""
    path = find_model(spec)
    return load_pretrained_directory(path, device=device), path


def load_model_tokenizer(spec: str, path: Path, model: GPT, explicit: str | None, *, required: bool = True):
    """(tokenizer, what to call it): `explicit` (--tokenizer), else the model's own, else GPT-2's for a Hugging Face
    GPT-2; checked against the model's vocabulary. (None, "") when there is none and none is required."""
    if explicit:
        tokenizer, name = load_tokenizer(explicit), explicit
        check_same_tokenizer(find_model_tokenizer(path), tokenizer, f"--tokenizer {explicit} is not the tokenizer saved with {spec}",
                             "leave out --tokenizer to use the model's own")
    else:
        tokenizer, name = find_model_tokenizer(path), f"the tokenizer saved with {spec}"
        if tokenizer is None and _is_hf_gpt2(path, model):
            tokenizer, name = load_tokenizer("gpt2"), f"gpt2 (the tokenizer of the Hugging Face GPT-2 {spec})"
    if tokenizer is None:
        if required:
            raise GptlabError(f"no tokenizer saved with {spec} ({path}); pass --tokenizer DIR (or gpt2)")
        return None, ""
    if tokenizer.vocab_size > model.config.vocab_size:
        raise GptlabError(f"{name} has {tokenizer.vocab_size:,} ids but the model only {model.config.vocab_size:,}: "
                          "is it the model's tokenizer? pass the right one with --tokenizer")
    return tokenizer, name


def check_same_tokenizer(own, tokenizer, what: str, fix: str) -> None:
    """Refuse `tokenizer` where a model has its own (`own`, None: nothing to compare) with other ids: the fingerprint
    (gptlab.tokenizer.Tokenizer.fingerprint) says, not the vocabulary's size, which two different tokenizers can share."""
    if own is not None and own.fingerprint() != tokenizer.fingerprint():
        raise GptlabError(f"{what} (fingerprint {tokenizer.fingerprint()}, {tokenizer.vocab_size:,} ids; the model's: "
                          f"{own.fingerprint()}, {own.vocab_size:,} ids): {fix}")


def _is_hf_gpt2(path: Path, model: GPT) -> bool:
    """A Hugging Face GPT-2 with GPT-2's vocabulary (its config.json says model_type gpt2)."""
    if model.config.arch != "gpt2" or model.config.vocab_size != GPT2_VOCAB_SIZE:
        return False
    try:
        return json.loads((path / "config.json").read_text()).get("model_type") == "gpt2"
    except (OSError, json.JSONDecodeError):
        return False
