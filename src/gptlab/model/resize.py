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
def grow_vocab(model: GPT, vocab_size: int) -> GPT:
    """A copy of `model` with `vocab_size` ids; rows past the old vocab_size are the mean of the old rows."""
    old = model.config.vocab_size
    if vocab_size < old:
        raise GptlabError(f"cannot shrink the vocabulary from {old} to {vocab_size} ids")
    if vocab_size == old:
        return model
    parameter = next(model.parameters())
    grown = GPT(dataclasses.replace(model.config, vocab_size=vocab_size)).to(device=parameter.device, dtype=parameter.dtype)
    state = model.state_dict()
    for name in ("transformer.wte.weight", "lm_head.weight"):
        if name not in state:
            continue
        rows = grown.state_dict()[name].clone()
        rows[:old] = state[name][:old]
        rows[old:] = state[name][:old].float().mean(dim=0).to(rows.dtype)  # padded rows too: never seen, never harmful
        state[name] = rows
    grown.load_state_dict(state)
    grown.train(model.training)
    return grown
