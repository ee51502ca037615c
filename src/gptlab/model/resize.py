"""Growing a model's vocabulary: new token rows for tokens added after training (e.g. the chat tokens).

Existing rows keep their values, so the model computes the same logits for every old id.
A new row starts as the mean of the trained rows (embedding and output layer alike):
an "average token" the model already handles, rather than a random vector whose logit
could swamp the others (Hewitt, "Initializing new word embeddings", 2021).

Not here: adding the tokens to a tokenizer (gptlab.chat.add_chat_tokens).
"""

from __future__ import annotations

import dataclasses

import torch

from gptlab.model.gpt import GPT
from gptlab.runtime import GptlabError


@torch.no_grad()
def grow_vocab(model: GPT, vocab_size: int, *, new_from: int | None = None) -> GPT:
    """A copy of `model` with `vocab_size` ids; rows from `new_from` on are set to the mean of the rows before it.

    `new_from` defaults to the old vocab_size. Give the tokenizer's old size when the model had spare
    rows (GPT-2's 50257 ids in 50304 rows): the new tokens land in rows that were never trained.
    """
    old = model.config.vocab_size
    if vocab_size < old:
        raise GptlabError(f"cannot shrink the vocabulary from {old} to {vocab_size} ids")
    trained = old if new_from is None else new_from
    if not 0 < trained <= old:
        raise GptlabError(f"new_from must be in 1..{old} (the trained rows), got {new_from}")
    if vocab_size == old and trained == old:
        return model
    parameter = next(model.parameters())
    grown = GPT(dataclasses.replace(model.config, vocab_size=vocab_size)).to(device=parameter.device, dtype=parameter.dtype)
    state = model.state_dict()
    for name in ("transformer.wte.weight", "lm_head.weight"):
        if name not in state:
            continue
        rows = grown.state_dict()[name].clone()
        rows[:trained] = state[name][:trained]
        rows[trained:] = state[name][:trained].float().mean(dim=0).to(rows.dtype)  # padded rows too: never seen, never harmful
        state[name] = rows
    grown.load_state_dict(state)
    grown.train(model.training)
    return grown
