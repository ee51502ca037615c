"""Continuous batching: one thread owns the model and decodes every running request together, step by step.

    submit(prompt ids, SamplingConfig) -> Request      from any thread (or an asyncio loop)
    engine thread:  admit waiting requests into free slots: copy a cached prefix in (gptlab.infer.prefix_cache),
                    prefill the rest of each alone, sample its first token
                    one decode step for all running rows at once (each at its own position)
                    sample each row with its own settings and torch.Generator; stream the tokens out
                    a row that stops, runs out or is cancelled frees its slot at once

The KV cache has a fixed number of slots (rows), each `block_size` long with its
own length, so a request can join the batch between any two decode steps. A
decode step feeds each running row its last token at position `length[row]`,
with a mask (B, 1, 1, S) that lets it see its own `length + 1` keys only.

With `prefix_cache_mb` > 0 (the default) a prompt's leading 16-token blocks seen before (a shared system prompt,
a chat's earlier turns) are copied into its slot rather than recomputed; each request's prompt and reply blocks
are kept for later ones, under that budget.

A request's events are token ids, then one `Finished(reason)`: "stop" (a stop
token, not sent), "length" (max_new_tokens reached), "cancelled", "error", or a
reason its tool turn gave (e.g. "tool_calls"). A request submitted with `tools=`
(a ToolTurn, gptlab.infer.tool_loop) may have ids fed in place of sampled ones:
a tool's result goes in one token per decode step, sent like the rest, and the
row samples on after it.
Greedy rows give the tokens of `generate(model, [prompt], config)` alone, and a
seeded request draws from its own generator exactly as `generate` does alone,
so its tokens do not depend on what else is in the batch (up to float rounding
of the batched matmuls, which can only matter at a near tie).

With `draft=` (a small model sharing the tokenizer) each step is speculative instead: the draft guesses
`draft_tokens` tokens per running row in its own SlotCache, the target checks every row's guesses in one forward
(each row's K+1 tokens at its own positions), and each row keeps what passes (gptlab.infer.speculative): greedy rows
still give `generate`'s tokens, sampled rows the target's distribution; `stats` counts proposed and accepted guesses.

Not here: text (the engine sees only ids; gptlab.serve encodes and decodes),
sampling itself (gptlab.infer.generate.sample_next), the model (gptlab.model).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import torch

from gptlab.infer.gemv import single_row_matmuls
from gptlab.infer.generate import SamplingConfig, check_prompts, make_generator, model_device_dtype, sample_next
from gptlab.infer.prefix_cache import PrefixCache
from gptlab.infer.speculative import check_draft, forward_slots, propose, verify
from gptlab.infer.tool_loop import ToolTurn
from gptlab.model import GPT
from gptlab.runtime import GptlabError

log = logging.getLogger(__name__)
# On by default, as in vLLM V1 and SGLang; 256 MB holds ~3,600 tokens of GPT-2 (124M) in float32, ~65,000 of gpt2-mini.
DEFAULT_PREFIX_CACHE_MB = 256


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    slots: int = 8  # requests decoded together; more wait in a queue (first come, first served)
    draft_tokens: int = 4  # with a draft model: tokens it guesses per step for the target to check (gptlab.infer.speculative)
    prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB  # K/V of prompt prefixes kept for later requests (0: off; gptlab.infer.prefix_cache)

    def __post_init__(self) -> None:
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or self.slots < 1:
            raise GptlabError(f"slots must be a whole number of at least 1, got {self.slots!r}")
        budget = self.prefix_cache_mb
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 <= budget < float("inf"):
            raise GptlabError(f"prefix_cache_mb (--prefix-cache-mb) must be 0 (off) or a positive number of MB, got {budget!r}")


@dataclass(frozen=True)
class Finished:
    """The last event of a request."""

    reason: str  # "stop", "length", "cancelled", "error", or a tool turn's reason


class Request:
    """One prompt being generated. Iterate it (or `async for` it, if submitted with a loop) for its tokens."""

    def __init__(self, prompt: list[int], config: SamplingConfig, loop: asyncio.AbstractEventLoop | None,
                 tools: ToolTurn | None = None) -> None:
        self.prompt = prompt
        self.config = config
        self.tools = tools  # the request's tool loop (gptlab.infer.tool_loop), or None
        self.tokens: list[int] = []  # generated so far (stop token excluded)
        self.finish_reason: str | None = None
        self.stop_token: int | None = None  # the stop token that ended it (reason "stop"), which is not in tokens
        self.cached_tokens = 0  # prompt tokens whose keys/values came from the prefix cache (no prefill)
        self.cancel_requested = False
        self._loop = loop
        self._events: queue.Queue | asyncio.Queue = asyncio.Queue() if loop is not None else queue.Queue()

    def _send(self, event: int | Finished) -> None:
        """Called on the engine thread."""
        if self._loop is None:
            self._events.put(event)
        else:
            try:
                self._loop.call_soon_threadsafe(self._events.put_nowait, event)
            except RuntimeError:  # the loop has closed: nobody is listening any more
                pass

    def __iter__(self) -> Iterator[int]:
        if self._loop is not None:
            raise GptlabError("this request was submitted with an event loop: use `async for`")
        while not isinstance(event := self._events.get(), Finished):
            yield event

    async def __aiter__(self) -> AsyncIterator[int]:
        if self._loop is None:
            raise GptlabError("this request was submitted without an event loop: use a plain `for`")
        while not isinstance(event := await self._events.get(), Finished):
            yield event


@dataclass
class _Slot:
    request: Request
    generator: torch.Generator
    length: int  # keys cached for this row
    last: int  # the token to feed next
    feed: deque[int] = field(default_factory=deque)  # a tool turn's ids, fed one per step in place of sampling


@dataclass
class EngineStats:
    finished: dict[str, int] = field(default_factory=dict)  # requests by finish reason
    peak_running: int = 0  # most requests decoded in one step
    steps: int = 0  # decode steps so far
    proposed: int = 0  # with a draft: its guesses the target checked
    accepted: int = 0  # ... and kept (acceptance rate = accepted / proposed)


class SlotCache:
    """Keys/values for `slots` rows, each with its own length. GPT.forward calls `append` per layer, then `advance`.

    Before a forward pass `select(rows, starts, T)` says which slots it runs on and where each row's new
    T keys go; `append` writes them there and returns (B, n_kv_head, S, head_dim) keys with
    S = max(starts) + T, the caller's mask hiding each row's columns past its own length.
    """

    def __init__(self, model: GPT, slots: int) -> None:
        config = model.config
        device, dtype = model_device_dtype(model)
        shape = (config.n_layer, slots, config.kv_heads, config.block_size, config.head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.ids = torch.full((slots, config.block_size), -1, dtype=torch.long, device=device)  # for a bigram table
        self.length = 0  # what GPT.forward reads as the start; the engine always passes positions and masks
        self.rows = torch.zeros(0, dtype=torch.long, device=device)
        self.starts = torch.zeros(0, dtype=torch.long, device=device)
        self.span = 0

    def select(self, rows: list[int], starts: list[int], T: int) -> None:
        device = self.keys.device
        self.rows = torch.tensor(rows, dtype=torch.long, device=device)
        self.starts = torch.tensor(starts, dtype=torch.long, device=device)
        self.span = max(starts) + T
        self.length = max(starts)
        self._contiguous = rows == list(range(len(rows)))  # a slice, not a gather, when rows are 0..B-1

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys[layer], self.values[layer]  # (slots, n_kv_head, block_size, head_dim)
        T = k.shape[2]
        if T == 1:
            keys[self.rows, :, self.starts] = k[:, :, 0]
            values[self.rows, :, self.starts] = v[:, :, 0]
        else:  # a prefill: one row at a time
            for i, (row, start) in enumerate(zip(self.rows.tolist(), self.starts.tolist())):
                keys[row, :, start : start + T] = k[i]
                values[row, :, start : start + T] = v[i]
        if self._contiguous:
            n = len(self.rows)
            return keys[:n, :, : self.span], values[:n, :, : self.span]
        return keys[self.rows, :, : self.span], values[self.rows, :, : self.span]

    def previous_ids(self, idx: torch.Tensor) -> torch.Tensor:
        """Record the selected rows' new (B, T) ids at their starts; return each one's predecessor (-1 at position 0)."""
        where = self.starts[:, None] + torch.arange(idx.shape[1], device=idx.device)  # (B, T) positions
        rows = self.rows[:, None].expand_as(where)
        self.ids[rows, where] = idx
        before = self.ids[rows, (where - 1).clamp(min=0)]
        return before.masked_fill(where == 0, -1)

    def write_ids(self, row: int, ids: list[int]) -> None:
        """Slot `row` holds these tokens from position 0 (keys and values restored from the prefix cache)."""
        if ids:
            self.ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long, device=self.ids.device)

    def advance(self, n: int) -> None:
        pass  # each slot's length is the engine's to keep


class Engine:
    """Continuous batching over `model` on a background thread. `close()` (or `with`) stops it.

    `on_step(engine)` is called on the engine thread after every decode step (tests use it to
    submit requests at chosen steps).
    """

    def __init__(self, model: GPT, config: EngineConfig = EngineConfig(), *, on_step: Callable[[Engine], None] | None = None,
                 draft: GPT | None = None) -> None:
        if draft is not None:  # refused before the thread starts: one line, no compute
            check_draft(model, draft, config.draft_tokens)
        self.draft = draft.eval() if draft is not None else None
        self.draft_cache = SlotCache(draft, config.slots) if draft is not None else None
        self.model = model.eval()
        self.config = config
        self.device, _ = model_device_dtype(model)
        self.cache = SlotCache(model, config.slots)
        self.prefix_cache = PrefixCache(int(config.prefix_cache_mb * 2**20)) if config.prefix_cache_mb else None
        self.stats = EngineStats()
        self.on_step = on_step
        self._slots: list[_Slot | None] = [None] * config.slots
        self._waiting: deque[Request] = deque()
        self._condition = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="gptlab-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ any thread

    def submit(self, prompt: list[int], config: SamplingConfig, *, loop: asyncio.AbstractEventLoop | None = None,
               tools: ToolTurn | None = None) -> Request:
        """Queue a prompt; raises GptlabError at once if it does not fit the context with max_new_tokens.

        With `loop`, events are delivered into that asyncio loop (iterate with `async for`). With `tools`, the
        request's tool turn runs on the engine thread after each token it chooses (gptlab.infer.tool_loop).
        """
        (prompt,) = check_prompts(self.model, [prompt], config, truncate=False)
        if tools is not None and self.draft is not None:
            raise GptlabError("tools do not run with a draft model (speculative decoding): leave out the draft to use tools")
        request = Request(prompt, config, loop, tools)
        with self._condition:
            if self._closed:
                raise GptlabError("the engine is closed")
            self._waiting.append(request)
            self._condition.notify_all()
        return request

    def cancel(self, request: Request) -> None:
        """Stop a request (waiting or running); its slot is freed before the next decode step."""
        with self._condition:
            request.cancel_requested = True
            self._condition.notify_all()

    def running(self) -> int:
        with self._condition:
            return sum(slot is not None for slot in self._slots)

    def waiting(self) -> int:
        with self._condition:
            return len(self._waiting)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no request runs or waits; False on timeout."""
        with self._condition:
            return self._condition.wait_for(lambda: not self._waiting and not any(self._slots), timeout)

    def close(self) -> None:
        """Cancel everything and stop the thread."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ engine thread

    def _run(self) -> None:
        try:
            while self._next_batch():
                try:
                    self._admit()
                    if self.draft is None:
                        self._step()
                    else:
                        self._speculative_step()
                except Exception:  # a bug: fail the requests in flight rather than leave clients hanging
                    log.exception("engine step failed")
                    with self._condition:
                        for index, slot in enumerate(self._slots):
                            if slot is not None:
                                self._finish(index, "error")
                if self.on_step is not None:
                    self.on_step(self)
        finally:
            with self._condition:
                for index, slot in enumerate(self._slots):
                    if slot is not None:
                        self._finish(index, "cancelled")
                while self._waiting:
                    self._finish_waiting(self._waiting.popleft(), "cancelled")

    def _next_batch(self) -> bool:
        """Wait for work; drop cancelled requests. False when closed."""
        with self._condition:
            while True:
                if self._closed:
                    return False
                for index, slot in enumerate(self._slots):
                    if slot is not None and slot.request.cancel_requested:
                        self._finish(index, "cancelled")
                for request in [r for r in self._waiting if r.cancel_requested]:
                    self._waiting.remove(request)
                    self._finish_waiting(request, "cancelled")
                if self._waiting or any(self._slots):
                    return True
                self._condition.wait()

    def _admit(self) -> None:
        """Prefill waiting requests, one at a time, into free slots; each samples its first token."""
        while True:
            with self._condition:
                free = [index for index, slot in enumerate(self._slots) if slot is None]
                if not free or not self._waiting:
                    return
                request = self._waiting.popleft()
                index = free[0]
                slot = _Slot(request, make_generator(request.config.seed, self.device), len(request.prompt), -1)
                self._slots[index] = slot
            idx = torch.tensor([request.prompt], dtype=torch.long, device=self.device)
            cached = request.cached_tokens = self._restore_prefix(index, request.prompt)
            self.cache.select([index], [cached], idx.shape[1] - cached)  # length = cached: the model's causal mask and positions
            with torch.inference_mode():
                logits, _ = self.model(idx[:, cached:], cache=self.cache, last_only=True)
            self._store_prefix(index, request.prompt)
            if self.draft is not None:  # the draft reads the whole prompt too: its guesses start after it
                forward_slots(self.draft, self.draft_cache, [index], [0], idx, last_only=True)
            self._accept(index, sample_next(logits[:, -1], request.config, slot.generator)[0].item())

    def _step(self) -> None:
        """One token for every running row, each at its own position."""
        running = [(index, slot) for index, slot in enumerate(self._slots) if slot is not None]
        if not running:
            return
        rows = [index for index, _ in running]
        lengths = torch.tensor([slot.length for _, slot in running], device=self.device)
        self.cache.select(rows, lengths.tolist(), 1)
        span = self.cache.span
        mask = (torch.arange(span, device=self.device)[None, :] <= lengths[:, None])[:, None, None]  # (B, 1, 1, S)
        idx = torch.tensor([[slot.last] for _, slot in running], dtype=torch.long, device=self.device)
        with torch.inference_mode(), single_row_matmuls(*model_device_dtype(self.model), len(rows)):  # gptlab.infer.gemv
            logits, _ = self.model(idx, cache=self.cache, positions=lengths[:, None], mask=mask, last_only=True)
        logits = logits[:, -1]  # (B, vocab_size)
        self.stats.steps += 1
        self.stats.peak_running = max(self.stats.peak_running, len(running))
        tokens: dict[int, int] = {i: slot.feed.popleft() for i, (_, slot) in enumerate(running) if slot.feed}  # no draw
        fed = set(tokens)
        greedy: dict[tuple, list[int]] = {}  # greedy rows, by the ids they may draw from: one argmax each
        for i, (_, slot) in enumerate(running):
            config = slot.request.config
            if config.temperature == 0 and i not in fed:
                greedy.setdefault((config.vocab_size, config.suppress_tokens), []).append(i)
        for members in greedy.values():
            chosen = sample_next(logits[members], running[members[0]][1].request.config, None)
            tokens.update(zip(members, chosen.tolist()))
        for i, (_, slot) in enumerate(running):
            slot.length += 1
            if i not in tokens:
                tokens[i] = sample_next(logits[i : i + 1], slot.request.config, slot.generator)[0].item()
        for i, (index, _) in enumerate(running):
            self._accept(index, tokens[i], fed=i in fed)

    def _speculative_step(self) -> None:
        """Up to K+1 tokens for every running row: the draft guesses K per row, the target checks all rows' guesses
        in one forward (each row's K+1 tokens at its own positions), each row keeps what passes (gptlab.infer.speculative)."""
        running = [(index, slot) for index, slot in enumerate(self._slots) if slot is not None]
        if not running:
            return
        left = [slot.request.config.max_new_tokens - len(slot.request.tokens) for _, slot in running]
        room = min(self.model.config.block_size - 1 - slot.length for _, slot in running)  # K+1 tokens must fit each row
        k = min(self.config.draft_tokens, room, max(left) - 1)
        if k < 1:  # every row is at its last token or its context end: a plain step
            return self._step()
        rows, lengths = [index for index, _ in running], [slot.length for _, slot in running]
        configs = [slot.request.config for _, slot in running]
        generators = [slot.generator for _, slot in running]
        tails = [((slot.request.prompt + slot.request.tokens)[-2], slot.last) for _, slot in running]
        drafts, probs = propose(self.draft, self.draft_cache, rows, lengths, tails, k, configs, generators)
        idx = torch.tensor([[slot.last, *guesses] for (_, slot), guesses in zip(running, drafts)], dtype=torch.long, device=self.device)
        logits = forward_slots(self.model, self.cache, rows, lengths, idx)  # (B, k+1, vocab_size)
        self.stats.steps += 1
        self.stats.peak_running = max(self.stats.peak_running, len(running))
        for i, (index, slot) in enumerate(running):
            mine = min(k, left[i] - 1)  # a row near max_new_tokens checks fewer guesses; its others are ignored
            kept, following = verify(logits[i, : mine + 1], drafts[i][:mine], probs[i][:mine], configs[i], generators[i])
            self.stats.proposed += mine
            self.stats.accepted += kept
            slot.length += kept + 1  # keys now cached: its last token and the kept guesses
            for token in [*drafts[i][:kept], following]:
                self._accept(index, token)
                if self._slots[index] is not slot:  # it stopped or ran out: the rest is dropped
                    break

    def _accept(self, index: int, token: int, *, fed: bool = False) -> None:
        """A sampled (or tool-fed) token for slot `index`: send it, or finish the request."""
        slot = self._slots[index]
        request = slot.request
        step = request.tools.after(token) if request.tools is not None and not fed else None
        finish = step.finish if step is not None else ("stop" if not fed and token in request.config.stop_tokens else None)
        if finish is not None:
            request.stop_token = token
            self._finish(index, finish)
            return
        if step is not None:
            slot.feed.extend(step.feed)
        request.tokens.append(token)
        request._send(token)
        slot.last = token
        if len(request.tokens) >= request.config.max_new_tokens:
            self._finish(index, "length")

    def _restore_prefix(self, index: int, prompt: list[int]) -> int:
        """Copy the longest cached prefix of `prompt` into slot `index`: how many tokens need no prefill (gptlab.infer.prefix_cache)."""
        if self.prefix_cache is None:
            return 0
        cached = self.prefix_cache.restore(self.cache.keys, self.cache.values, index, prompt)
        self.cache.write_ids(index, prompt[:cached])  # what a bigram table reads as the first new token's predecessor
        return cached

    def _store_prefix(self, index: int, tokens: list[int]) -> None:
        """Keep the full blocks of `tokens`, whose keys/values slot `index` holds from position 0."""
        if self.prefix_cache is not None:
            self.prefix_cache.store(self.cache.keys, self.cache.values, index, tokens)

    def _finish(self, index: int, reason: str) -> None:
        slot = self._slots[index]
        request = slot.request
        if reason != "error":  # after an error the slot's keys may be half written
            self._store_prefix(index, (request.prompt + request.tokens)[: slot.length])  # keys cached: prompt and fed tokens
        with self._condition:
            self._slots[index] = None
            self._finish_waiting(request, reason)

    def _finish_waiting(self, request: Request, reason: str) -> None:
        request.finish_reason = reason
        request._send(Finished(reason))
        self.stats.finished[reason] = self.stats.finished.get(reason, 0) + 1
        self._condition.notify_all()
