"""Where every alignment run starts: a model (--init), its tokenizer with the chat tokens, and the grown vocabulary.

    start = resolve_start(config)             the init checkpoint, tokenizer, ChatFormat, and the model config
    model = start.model(device)               the init weights with rows for any chat tokens it lacks

SFT starts from a base model that has never seen the chat tokens; DPO and GRPO
usually start from an SFT model that has them, in which case nothing grows.
A model's new rows start as the mean of its trained rows (gptlab.model.resize).

Not here: the data and the loop (gptlab.align.finetune.sft, gptlab.align.preference.dpo).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from gptlab.chat import ChatFormat, add_chat_tokens
from gptlab.data.match import find_model_tokenizer, load_tokenizer
from gptlab.load.checkpoints import find_checkpoint
from gptlab.model import GPT, ModelConfig
from gptlab.model.hf import load_pretrained_directory, pretrained_path, read_pretrained_config
from gptlab.model.resize import grow_vocab
from gptlab.runtime import GptlabError


@dataclass
class Start:
    """The init model's folder and settings, and the chat tokenizer an aligned model is trained and saved with."""

    init_path: Path
    model_config: ModelConfig  # the init model's, with the vocabulary grown for the chat tokens
    base_vocab: int  # ids of the tokenizer before the chat tokens: rows past it are (re)initialised
    tokenizer: object  # gptlab.tokenizer.Tokenizer holding the chat tokens
    chat: ChatFormat

    def model(self, device: torch.device | str = "cpu") -> GPT:
        """The init weights, grown to model_config.vocab_size (each new row the mean of the trained rows)."""
        base = load_pretrained_directory(self.init_path, device=device)
        return grow_vocab(base, self.model_config.vocab_size, new_from=self.base_vocab).to(device)


def refuse_fsdp(parallel, command: str, why: str) -> None:
    """--parallel.fsdp where a loop cannot shard: refused before any compute, on one process as under torchrun,
    so the mistake costs nothing and leaves no run folder."""
    if parallel.fsdp:
        raise GptlabError(f"gptlab {command} does not support --parallel.fsdp ({why}); drop it, or pass "
                          "--parallel.shard-optimizer zero1 to shard the optimizer state")


def find_init(init_from: str) -> Path:
    """The folder of the model --init names (a run, checkpoint or model folder). A prepared data folder, an easy slip
    beside the model that was trained on it, is named as what it is rather than asked for a config.json."""
    checkpoint = find_checkpoint(init_from)
    if checkpoint is not None:
        return checkpoint
    path = Path(init_from).expanduser()
    if path.is_dir() and (path / "manifest.json").is_file() and not (path / "config.json").is_file():
        raise GptlabError(f"--init {init_from} is a prepared data folder (manifest.json), not a model; pass a model folder "
                          "or run folder to --init (e.g. runs/NAME, one of its checkpoints, or an exported model)")
    return pretrained_path(init_from)


def resolve_start(init_from: str, tokenizer: str = "", *, dropout: float = 0.0) -> Start:
    """The Start for --init (a run, checkpoint or model folder) and an optional --tokenizer; one-line errors."""
    if not init_from:
        raise GptlabError("fine-tuning starts from a model: pass --init CHECKPOINT (a run, checkpoint or model folder)")
    init_path = find_init(init_from)
    saved = find_model_tokenizer(init_path)
    base = load_tokenizer(tokenizer) if tokenizer else saved
    if saved is not None and base.fingerprint() not in (saved.fingerprint(), add_chat_tokens(saved).fingerprint()):
        raise GptlabError(f"--tokenizer {tokenizer} is not the tokenizer saved with {init_from}; "
                          "leave --tokenizer out to use the model's own")
    if base is None:
        raise GptlabError(f"no tokenizer saved with {init_from}; pass --tokenizer DIR (the one it was trained with)")
    init = read_pretrained_config(init_path)
    if base.vocab_size > init.vocab_size:
        raise GptlabError(f"the tokenizer has {base.vocab_size:,} ids but {init_from} only {init.vocab_size:,}: "
                          "is it the model's tokenizer? pass the right one with --tokenizer")
    chat_tokenizer = add_chat_tokens(base)
    model_config = dataclasses.replace(init, vocab_size=max(init.vocab_size, chat_tokenizer.vocab_size), dropout=dropout)
    return Start(init_path, model_config, base.vocab_size, chat_tokenizer, ChatFormat(chat_tokenizer))
