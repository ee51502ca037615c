"""Batched generation: ids in, ids out. Sampling settings, the decode loop with a KV cache, and its reference.

    prompts [[5, 9, 2], [7]]  --left-pad-->  idx (B=2, T=3)   [[5, 9, 2],
                                                               [0, 0, 7]]   (row 1: 2 pads)
    positions: [[0, 1, 2], [0, 0, 0]]   each row counts from its first real token
    prefill once on (B, T) -> cache holds T keys per row; then one token per step,
    each query attending to the real keys of its own row (pads are masked out).

Rows that produce a stop token end there (the stop token is not returned); the
others go on until `max_new_tokens`. A finished row stays in the batch and its
tokens are dropped: the cache keeps its shape, and every step draws from the
generator for the whole batch, so seeded samples match the reference's. `use_cache=False` is the reference, as in
nanoGPT's `generate`: every step reruns the whole sequence (cropped to
block_size), each row on its own and unpadded. Tests prove the two give the
same tokens.

Not here: text (the engine sees only ids; tokenizing is gptlab.tokenizer's job,
wired up by gptlab.cli.sample), the KV cache itself and the model
(gptlab.model).
"""

from __future__ import annotations

import math
import operator
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass

import torch

from gptlab.infer.gemv import single_row_matmuls
from gptlab.infer.tool_loop import ToolTurn
from gptlab.model import GPT, KVCache
from gptlab.runtime import GptlabError

TokenCallback = Callable[[int, int], None]  # (row, token)


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    max_new_tokens: int = 256
    temperature: float = 1.0  # 0: greedy (argmax); otherwise logits are divided by it before sampling
    top_k: int | None = None  # keep only the k most likely tokens (None: all)
    top_p: float | None = None  # nucleus: keep the fewest most likely tokens whose probability reaches p (None: all)
    stop_tokens: tuple[int, ...] = ()  # ids that end a row (e.g. the tokenizer's eot id)
    seed: int | None = None  # seeds the sampling generator; None: a fresh random seed each call
    vocab_size: int | None = None  # draw only ids below this, e.g. the tokenizer's (None: any id of the model)
    suppress_tokens: tuple[int, ...] = ()  # ids never drawn (e.g. the tool-call token when a request forbids calls)

    def __post_init__(self) -> None:
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise GptlabError(f"max_new_tokens must be a whole number of at least 1, got {self.max_new_tokens!r}")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            raise GptlabError(f"temperature must be a number, got {self.temperature!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise GptlabError(f"temperature must be 0 (greedy) or positive, got {self.temperature}")
        if self.top_k is not None and (not _is_int(self.top_k) or self.top_k < 1):
            raise GptlabError(f"top_k must be a whole number of at least 1 (or None for all tokens), got {self.top_k!r}")
        if self.top_p is not None and (
            isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1
        ):
            raise GptlabError(f"top_p must be in (0, 1] (or None for all tokens), got {self.top_p!r}")
        if isinstance(self.stop_tokens, (int, str)) or not isinstance(self.stop_tokens, Sequence):
            raise GptlabError(f"stop_tokens must be a sequence of token ids, e.g. (50256,), got {self.stop_tokens!r}")
        if not all(_is_int(token) and token >= 0 for token in self.stop_tokens):
            raise GptlabError(f"stop_tokens must be non-negative token ids, got {list(self.stop_tokens)}")
        object.__setattr__(self, "stop_tokens", tuple(int(token) for token in self.stop_tokens))  # a list given is kept hashable
        if isinstance(self.suppress_tokens, (int, str)) or not isinstance(self.suppress_tokens, Sequence) or not all(
            _is_int(token) and token >= 0 for token in self.suppress_tokens
        ):
            raise GptlabError(f"suppress_tokens must be a sequence of non-negative token ids, got {self.suppress_tokens!r}")
        object.__setattr__(self, "suppress_tokens", tuple(int(token) for token in self.suppress_tokens))
        if self.seed is not None and not _is_int(self.seed):
            raise GptlabError(f"seed must be a whole number or None, got {self.seed!r}")
        if self.vocab_size is not None and (not _is_int(self.vocab_size) or self.vocab_size < 1):
            raise GptlabError(f"vocab_size must be a whole number of at least 1 (or None), got {self.vocab_size!r}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ---------------------------------------------------------------- sampling


def sample_next(logits: torch.Tensor, config: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from logits (B, vocab_size): greedy, or temperature -> top-k -> top-p -> multinomial.

    Works on float32 so that low-precision logits do not tie or overflow in softmax. Ids at or above
    `config.vocab_size` are never drawn (a model may have more rows than its tokenizer has ids), nor are
    `config.suppress_tokens`.
    Returns (B,) ids.
    """
    if config.temperature == 0:
        return _cut(logits, config).argmax(dim=-1)
    probs = sampling_probs(logits, config)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


def sampling_probs(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """The distribution `sample_next` draws from, (..., vocab_size cut): temperature -> top-k -> top-p -> softmax.

    Speculative sampling (gptlab.infer.speculative) compares the target's and the draft's distributions
    exactly as they are sampled. Greedy (temperature 0) is all mass on the argmax.
    """
    logits = _cut(logits, config)
    if config.temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.size(-1)).float()
    logits = logits / config.temperature
    if config.top_k is not None and config.top_k < logits.size(-1):
        kth = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]  # (..., 1): the k-th largest logit
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if config.top_p is not None and config.top_p < 1:
        logits = _nucleus(logits, config.top_p)
    return torch.softmax(logits, dim=-1)


def _cut(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """float32 logits without the ids at or above config.vocab_size (ids below the cut keep their numbers), the
    suppressed ids at -inf (never drawn, never the argmax unless every id is suppressed)."""
    logits = logits.float()
    if config.vocab_size is not None and config.vocab_size < logits.size(-1):
        logits = logits[..., : config.vocab_size]
    suppressed = [token for token in config.suppress_tokens if token < logits.size(-1)]
    if suppressed:
        logits = logits.index_fill(-1, torch.tensor(suppressed, device=logits.device), float("-inf"))
    return logits


def _nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose total probability reaches top_p (Holtzman et al., 2019)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass of the strictly more likely tokens; 0 for the top one, so it always stays
    sorted_logits = sorted_logits.masked_fill(before >= top_p, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    """A private generator: sampling is reproducible from `seed` and leaves torch's global RNG alone."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


# ---------------------------------------------------------------- input checks


def check_prompts(model: GPT, prompts: list[list[int]], config: SamplingConfig, truncate: bool) -> list[list[int]]:
    """Prompts as lists of ints that fit the context with `max_new_tokens` after them, or a clear error.

    With truncate=True a long prompt keeps its last (block_size - max_new_tokens) tokens.
    """
    if not isinstance(prompts, Sequence) or isinstance(prompts, (str, bytes)) or not prompts:
        raise GptlabError(f"prompts must be a non-empty list of prompts (lists of ids), got {prompts!r:.80}")
    block, new = model.config.block_size, config.max_new_tokens
    if new >= block:
        raise GptlabError(f"max_new_tokens={new} leaves no room for a prompt in the context ({block}); use at most {block - 1}")
    checked = []
    for row, prompt in enumerate(prompts):
        if _is_int(prompt):
            raise GptlabError("prompts is a list of prompts, each a list of ids: for one prompt pass [ids]")
        try:
            ids = [operator.index(token) for token in prompt]
        except TypeError:
            raise GptlabError(f"prompt {row} must be a list of integer token ids, got {prompt!r:.80}") from None
        if not ids:
            raise GptlabError(f"prompt {row} is empty: give at least one token to start from (e.g. the tokenizer's eot id)")
        try:
            model.check_ids(torch.tensor(ids))
        except GptlabError as error:
            raise GptlabError(f"prompt {row}: {error}") from None
        if len(ids) + new > block:
            if not truncate:
                raise GptlabError(
                    f"prompt {row} has {len(ids)} tokens + max_new_tokens {new} = {len(ids) + new}, longer than the "
                    f"context ({block}); shorten the prompt, lower max_new_tokens, or pass truncate=True to keep "
                    f"the last {block - new} prompt tokens"
                )
            ids = ids[len(ids) + new - block :]
        checked.append(ids)
    if config.stop_tokens:
        try:
            model.check_ids(torch.tensor(config.stop_tokens))
        except GptlabError as error:
            raise GptlabError(f"stop token: {error}") from None
    return checked


# ---------------------------------------------------------------- decode loops


def model_device_dtype(model: GPT) -> tuple[torch.device, torch.dtype]:
    parameter = next(model.parameters())
    return parameter.device, parameter.dtype


def left_pad(prompts: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """idx (B, T) with each prompt at the right end (pad id 0: never attended to), and pads (B,) per row."""
    T = max(len(prompt) for prompt in prompts)
    idx = torch.zeros(len(prompts), T, dtype=torch.long, device=device)
    for row, prompt in enumerate(prompts):
        idx[row, T - len(prompt) :] = torch.tensor(prompt, dtype=torch.long, device=device)
    pads = torch.tensor([T - len(prompt) for prompt in prompts], device=device)
    return idx, pads


def prefill_mask(pads: torch.Tensor, T: int) -> torch.Tensor:
    """(B, 1, T, T) bool: causal, real keys only; a pad query sees itself, since an all-False row gives NaN in SDPA."""
    columns = torch.arange(T, device=pads.device)
    real_key = columns[None, :] >= pads[:, None]  # (B, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=pads.device).tril()
    diagonal = torch.eye(T, dtype=torch.bool, device=pads.device)
    return ((causal[None] & real_key[:, None, :]) | diagonal[None])[:, None]


@torch.inference_mode()
def last_logits(model: GPT, idx: torch.Tensor, **kwargs) -> torch.Tensor:
    """Logits (B, vocab_size) after the last position of idx (B, T).

    Inference mode is entered per forward pass, never across a `yield`: a
    suspended generator must not leave the caller's code in inference mode.
    """
    with single_row_matmuls(*model_device_dtype(model), idx.numel()):  # one bf16 row on a CPU: gptlab.infer.gemv
        logits, _ = model(idx, last_only=True, **kwargs)
    return logits[:, -1]


def cached_steps(model: GPT, prompts: list[list[int]], config: SamplingConfig, generator: torch.Generator) -> Generator[torch.Tensor, torch.Tensor | None, None]:
    """Prefill the left-padded batch once, then feed one token per step through the KV cache. Yields (B,) ids."""
    device, dtype = model_device_dtype(model)
    idx, pads = left_pad(prompts, device)
    B, T = idx.shape
    new = config.max_new_tokens
    cache = KVCache(model.config, B, T + new, device=device, dtype=dtype)
    padded = bool(pads.any())
    # Without pads the model's own defaults (positions from cache.length, causal mask) are exactly right.
    positions = (torch.arange(T, device=device)[None, :] - pads[:, None]).clamp(min=0) if padded else None
    mask = prefill_mask(pads, T) if padded else None
    logits = last_logits(model, idx, cache=cache, positions=positions, mask=mask)
    real_key = torch.arange(T + new, device=device)[None, :] >= pads[:, None]  # (B, T + new)
    lengths = T - pads  # (B,) real tokens per row: the position of the next token
    for step in range(new):
        token = sample_next(logits, config, generator)
        fed = yield token  # a (B,) tensor from the caller when some rows feed tools' results instead (gptlab.infer.tool_loop)
        token = token if fed is None else fed
        if step == new - 1:
            break
        if padded:
            positions = (lengths + step)[:, None]  # (B, 1)
            mask = real_key[:, None, None, : T + step + 1]  # (B, 1, 1, S): one query sees every real key so far
        logits = last_logits(model, token[:, None], cache=cache, positions=positions, mask=mask)


def recomputed_steps(model: GPT, prompts: list[list[int]], config: SamplingConfig, generator: torch.Generator) -> Generator[torch.Tensor, torch.Tensor | None, None]:
    """The reference: each step reruns every row's whole sequence (cropped to block_size), alone and unpadded."""
    device, _ = model_device_dtype(model)
    block = model.config.block_size
    sequences = [torch.tensor(prompt, dtype=torch.long, device=device) for prompt in prompts]
    for _ in range(config.max_new_tokens):
        logits = torch.cat([last_logits(model, sequence[None, -block:]) for sequence in sequences])  # (B, vocab_size)
        token = sample_next(logits, config, generator)
        fed = yield token
        token = token if fed is None else fed
        sequences = [torch.cat([sequence, token[row : row + 1]]) for row, sequence in enumerate(sequences)]


def _decode(model: GPT, steps: Generator[torch.Tensor, torch.Tensor | None, None], rows: int, stop_tokens: tuple[int, ...],
            turns: Sequence[ToolTurn | None]) -> Iterator[tuple[int, int]]:
    """(row, token) for every new token until each row stops or runs out; eval mode meanwhile, restored after.

    A row with a turn (gptlab.infer.tool_loop) may feed ids in place of sampled ones: they are sent back into `steps`.
    """
    was_training = model.training
    model.eval()
    stops = set(stop_tokens)
    finished = [False] * rows
    feeds: list[deque[int]] = [deque() for _ in range(rows)]
    try:
        tokens = next(steps)
        while True:
            chosen = tokens.tolist()
            for row, token in enumerate(chosen):
                if finished[row]:
                    continue  # a finished row is still decoded with the batch; its tokens are dropped
                if feeds[row]:
                    chosen[row] = feeds[row].popleft()
                    yield row, chosen[row]
                    continue
                step = turns[row].after(token) if turns[row] is not None else None
                if step is not None and step.finish is not None or step is None and token in stops:
                    finished[row] = True
                    continue
                feeds[row].extend(step.feed if step is not None else ())
                yield row, token
            if all(finished):
                break
            tokens = steps.send(torch.tensor(chosen, device=tokens.device) if chosen != tokens.tolist() else None)
    except StopIteration:
        pass
    finally:
        steps.close()
        if was_training:
            model.train()


# ---------------------------------------------------------------- public API


def stream(
    model: GPT,
    prompts: list[list[int]],
    config: SamplingConfig = SamplingConfig(),
    *,
    use_cache: bool = True,
    truncate: bool = False,
    tools: Sequence[ToolTurn | None] | None = None,
) -> Iterator[tuple[int, int]]:
    """(row, token) pairs as tokens are produced, step by step (rows in order within a step).

    Same tokens as `generate`: stop tokens are not yielded. Input errors raise
    here, at the call, not at the first `next`. Stopping the iteration early
    stops the decoding. `tools` holds a ToolTurn (or None) per prompt (gptlab.infer.tool_loop).
    """
    prompts = check_prompts(model, prompts, config, truncate)
    turns = [None] * len(prompts) if tools is None else list(tools)
    if len(turns) != len(prompts):
        raise GptlabError(f"tools holds {len(turns)} turns for {len(prompts)} prompts; give one (or None) per prompt")
    device, _ = model_device_dtype(model)
    steps = (cached_steps if use_cache else recomputed_steps)(model, prompts, config, make_generator(config.seed, device))
    return _decode(model, steps, len(prompts), config.stop_tokens, turns)


def generate(
    model: GPT,
    prompts: list[list[int]],
    config: SamplingConfig = SamplingConfig(),
    *,
    use_cache: bool = True,
    on_token: TokenCallback | None = None,
    truncate: bool = False,
    tools: Sequence[ToolTurn | None] | None = None,
) -> list[list[int]]:
    """The new tokens of each prompt (prompt not included), up to `max_new_tokens` each.

    A row ends at its first stop token, which is not included: a row shorter
    than max_new_tokens stopped. `on_token(row, token)` is called for each
    token as it is produced. With the same prompts (batched alike) and seed,
    the result is the same with or without the cache. A prompt that does not
    fit the context with max_new_tokens raises, unless truncate=True, which
    keeps its last (block_size - max_new_tokens) tokens. With `tools` (a ToolTurn or None per prompt), a row's
    tokens include the tools' results fed to it (gptlab.infer.tool_loop).
    """
    tokens = stream(model, prompts, config, use_cache=use_cache, truncate=truncate, tools=tools)  # checks the prompts first
    results: list[list[int]] = [[] for _ in prompts]
    for row, token in tokens:
        results[row].append(token)
        if on_token is not None:
            on_token(row, token)
    return results
