"""Speculative decoding: a small draft model guesses K tokens, the target checks all of them in one forward pass.

    ids ... x                      the draft proposes d1..dK, one forward each, sampling from its q1..qK
    target([x, d1, ..., dK])       one forward (K+1 positions) gives p1..pK+1
    accept d1, d2, ... while they pass, then one token of the target's own:
        greedy    di passes if it is the argmax of pi; then the argmax of the first failing p (or of pK+1)
        sampled   di passes with probability min(1, pi(di) / qi(di)); the first failure draws from
                  norm(max(0, pi - qi)), and after K passes a bonus token comes from pK+1
    both KV caches move their `length` back over the rejected positions

Greedy output is exactly the target's greedy output (up to float rounding of a K+1-token forward, which can only
matter at a near tie); sampled output follows the target's distribution exactly (Leviathan et al. 2023, "Fast
Inference from Transformers via Speculative Decoding", Algorithm 1; Chen et al. 2023, "Accelerating Large Language
Model Decoding with Speculative Sampling"). p and q are the distributions after temperature, top-k, top-p and the
vocab_size cut, as gptlab.infer.generate.sample_next samples them. Each step yields between 1 and K+1 tokens for one
target forward, so it pays when the draft is much cheaper than the target and guesses well.

Not here: the batched server version (gptlab.infer.engine.Engine with `draft=`, which uses `propose` and `verify`
below), text (the draft must share the target's tokenizer: gptlab.load.decoding.load_draft checks its fingerprint).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from gptlab.infer.generate import SamplingConfig, check_prompts, last_logits, make_generator, model_device_dtype, sampling_probs
from gptlab.model import GPT, KVCache
from gptlab.runtime import GptlabError


@dataclass
class SpeculativeStats:
    proposed: int = 0  # draft tokens the target checked
    accepted: int = 0  # of those, the ones it kept
    steps: int = 0  # target forward passes (each yields accepted + 1 tokens, or fewer at a stop)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    def describe(self, draft_tokens: int) -> str:
        return (f"speculative decoding (K={draft_tokens}): {self.accepted} of {self.proposed} draft tokens accepted "
                f"({self.acceptance_rate:.1%}), {self.steps} target passes")


def check_draft(target: GPT, draft: GPT, draft_tokens: int) -> None:
    """One clear error, before any compute, for a draft that cannot stand in for the target's guesses."""
    if isinstance(draft_tokens, bool) or not isinstance(draft_tokens, int) or draft_tokens < 1:
        raise GptlabError(f"draft_tokens (--draft-tokens) must be a whole number of at least 1, got {draft_tokens!r}")
    if draft.config.vocab_size != target.config.vocab_size:
        raise GptlabError(f"the draft model has {draft.config.vocab_size:,} token ids but the target {target.config.vocab_size:,}: "
                          "a draft must share the target's tokenizer (train it on the same prepared data)")
    if draft.config.block_size < target.config.block_size:
        raise GptlabError(f"the draft model's context ({draft.config.block_size}) is shorter than the target's "
                          f"({target.config.block_size}); use a draft trained with block_size {target.config.block_size} or more")
    if model_device_dtype(draft)[0] != model_device_dtype(target)[0]:
        raise GptlabError(f"the draft model is on {model_device_dtype(draft)[0]} but the target on {model_device_dtype(target)[0]}; "
                          "load both on one device")


# ---------------------------------------------------------------- acceptance (one row)


def verify(target_logits: torch.Tensor, drafts: list[int], draft_probs: list[torch.Tensor], config: SamplingConfig,
           generator: torch.Generator | None) -> tuple[int, int]:
    """(how many of `drafts` the target keeps, the token that follows them) for one row.

    target_logits (k+1, vocab_size): the target's logits at the k+1 positions fed (last token, d1..dk);
    draft_probs: the k distributions (vocab_size cut) the drafts were drawn from (unused when greedy).
    """
    k = len(drafts)
    if config.temperature == 0:
        best = sampling_probs(target_logits, config).argmax(dim=-1).tolist()  # (k+1,): the target's greedy choices
        kept = next((i for i in range(k) if drafts[i] != best[i]), k)
        return kept, best[kept]
    p = sampling_probs(target_logits, config)  # (k+1, V)
    for i, token in enumerate(drafts):
        q = draft_probs[i]
        r = torch.rand((), generator=generator, device=p.device)
        if r * q[token] < p[i, token]:  # accept with probability min(1, p/q): r < p/q without dividing by q
            continue
        residual = (p[i] - q).clamp(min=0)  # the mass p has beyond q: drawing from it makes the mixture exactly p
        weights = residual if residual.sum() > 0 else p[i]  # all-zero only when p == q in floats: then p itself
        return i, int(torch.multinomial(weights, 1, generator=generator))
    return k, int(torch.multinomial(p[k], 1, generator=generator))


def draw(logits: torch.Tensor, config: SamplingConfig, generator: torch.Generator | None) -> tuple[int, torch.Tensor | None]:
    """The draft's token from its logits (vocab_size,) and the distribution it came from (None when greedy)."""
    if config.temperature == 0:
        return int(sampling_probs(logits, config).argmax()), None
    q = sampling_probs(logits, config)
    return int(torch.multinomial(q, 1, generator=generator)), q


# ---------------------------------------------------------------- one sequence


class SpeculativeDecoder:
    """Target + draft, one prompt at a time, with a KV cache each. `stats` counts every call's proposals."""

    def __init__(self, target: GPT, draft: GPT, draft_tokens: int = 4) -> None:
        check_draft(target, draft, draft_tokens)
        self.target, self.draft, self.draft_tokens = target, draft, draft_tokens
        self.stats = SpeculativeStats()

    def stream(self, prompt: list[int], config: SamplingConfig, *, truncate: bool = False) -> Iterator[int]:
        """The new tokens of one prompt as they are accepted; stop tokens end it (not yielded), as in `stream`."""
        (prompt,) = check_prompts(self.target, [prompt], config, truncate)  # errors at the call, not at the first `next`
        return self._decode(prompt, config)

    def generate(self, prompts: list[list[int]], config: SamplingConfig, *, truncate: bool = False) -> list[list[int]]:
        """The new tokens of each prompt, decoded one prompt after the other (as `generate`, without batching)."""
        checked = check_prompts(self.target, prompts, config, truncate)
        return [list(self._decode(prompt, config)) for prompt in checked]

    def _decode(self, prompt: list[int], config: SamplingConfig) -> Iterator[int]:
        device, dtype = model_device_dtype(self.target)
        total = len(prompt) + config.max_new_tokens
        target_cache = KVCache(self.target.config, 1, total, device=device, dtype=dtype)
        draft_cache = KVCache(self.draft.config, 1, total, device=device, dtype=model_device_dtype(self.draft)[1])
        generator = make_generator(config.seed, device)
        stops = set(config.stop_tokens)
        ids = list(prompt)
        modes = self.target.training, self.draft.training
        self.target.eval()
        self.draft.eval()
        try:
            while len(ids) < total:
                # no more guesses than tokens left: the last one always comes from the target
                k = min(self.draft_tokens, total - len(ids) - 1)
                new = self._step(ids, k, target_cache, draft_cache, config, generator)
                for token in new:
                    if token in stops:
                        return
                    ids.append(token)
                    yield token
        finally:
            self.target.train(modes[0])
            self.draft.train(modes[1])

    def _step(self, ids: list[int], k: int, target_cache: KVCache, draft_cache: KVCache, config: SamplingConfig,
              generator: torch.Generator) -> list[int]:
        """One round: k guesses, one target pass over the uncached ids and the guesses, rollback. Returns the new tokens."""
        device = target_cache.keys.device
        drafts, draft_probs = [], []
        feed = ids[draft_cache.length :]  # the draft may lag: it never saw the previous round's last guess or bonus
        for _ in range(k):
            token, q = draw(last_logits(self.draft, torch.tensor([feed], device=device), cache=draft_cache)[0], config, generator)
            drafts.append(token)
            draft_probs.append(q)
            feed = [token]
        fed = ids[target_cache.length :] + drafts
        with torch.inference_mode():
            logits, _ = self.target(torch.tensor([fed], device=device), cache=target_cache)
        kept, following = verify(logits[0, -(k + 1) :], drafts, draft_probs, config, generator)
        # keys stay for ids and the kept guesses; the rejected positions are overwritten next round
        target_cache.length = len(ids) + kept
        draft_cache.length = min(draft_cache.length, len(ids) + kept)
        self.stats.proposed += k
        self.stats.accepted += kept
        self.stats.steps += 1
        return drafts[:kept] + [following]


def speculative_generate(target: GPT, draft: GPT, prompts: list[list[int]], config: SamplingConfig, *,
                         draft_tokens: int = 4, truncate: bool = False) -> tuple[list[list[int]], SpeculativeStats]:
    """`generate` with a draft: the same tokens when greedy, the same distribution when sampled; and the counts."""
    decoder = SpeculativeDecoder(target, draft, draft_tokens)
    return decoder.generate(prompts, config, truncate=truncate), decoder.stats


# ---------------------------------------------------------------- batched (the engine's rows)


def slot_mask(starts: torch.Tensor, T: int, span: int) -> torch.Tensor:
    """(B, 1, T, span) bool: row b's query j sits at position starts[b] + j and sees its own keys up to there."""
    query_positions = starts[:, None] + torch.arange(T, device=starts.device)[None, :]  # (B, T)
    return (torch.arange(span, device=starts.device)[None, None, :] <= query_positions[:, :, None])[:, None]


def forward_slots(model: GPT, cache, rows: list[int], starts: list[int], idx: torch.Tensor, *, last_only: bool = False) -> torch.Tensor:
    """Logits (B, T, vocab_size) of idx (B, T) written into `cache` (a gptlab.infer.engine.SlotCache) at each row's start."""
    T = idx.shape[1]
    cache.select(rows, starts, T)
    start = torch.tensor(starts, device=idx.device)
    positions = start[:, None] + torch.arange(T, device=idx.device)[None, :]
    with torch.inference_mode():
        logits, _ = model(idx, cache=cache, positions=positions, mask=slot_mask(start, T, cache.span), last_only=last_only)
    return logits


def propose(draft: GPT, cache, rows: list[int], lengths: list[int], tails: list[tuple[int, int]], k: int,
            configs: list[SamplingConfig], generators: list[torch.Generator]) -> tuple[list[list[int]], list[list]]:
    """k guesses per row from the draft, batched: (tokens, the distributions they came from) per row.

    Each row has `lengths[r]` keys in the target's cache and its last two ids in `tails[r]`. The first pass feeds
    both at positions length-1 and length, so a draft that missed the previous round's last guess catches up; one
    it already holds is written again, the same key (the prompt is at least one token, so length >= 1).
    """
    device = model_device_dtype(draft)[0]
    idx = torch.tensor(tails, dtype=torch.long, device=device)  # (B, 2)
    starts = [length - 1 for length in lengths]
    tokens: list[list[int]] = [[] for _ in rows]
    probs: list[list] = [[] for _ in rows]
    for _ in range(k):
        logits = forward_slots(draft, cache, rows, starts, idx)[:, -1]  # (B, vocab_size)
        for r, config in enumerate(configs):
            token, q = draw(logits[r], config, generators[r])
            tokens[r].append(token)
            probs[r].append(q)
        starts = [start + idx.shape[1] for start in starts]
        idx = torch.tensor([[row[-1]] for row in tokens], dtype=torch.long, device=device)
    return tokens, probs
