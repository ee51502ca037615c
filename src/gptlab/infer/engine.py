"""Continuous batching: one thread owns the model and decodes every running request together, step by step.

    submit(prompt ids, SamplingConfig) -> Request      from any thread (or an asyncio loop)
    engine thread:  admit waiting requests into free slots: prefill each alone, sample its first token
                    one decode step for all running rows at once (each at its own position)
                    sample each row with its own settings and torch.Generator; stream the tokens out
                    a row that stops, runs out or is cancelled frees its slot at once

The KV cache has a fixed number of slots (rows), each `block_size` long with its
own length, so a request can join the batch between any two decode steps. A
decode step feeds each running row its last token at position `length[row]`,
with a mask (B, 1, 1, S) that lets it see its own `length + 1` keys only.

A request's events are token ids, then one `Finished(reason)`: "stop" (a stop
token, not sent), "length" (max_new_tokens reached), "cancelled", or "error".
Greedy rows give the tokens of `generate(model, [prompt], config)` alone, and a
seeded request draws from its own generator exactly as `generate` does alone,
so its tokens do not depend on what else is in the batch (up to float rounding
of the batched matmuls, which can only matter at a near tie).

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

from gptlab.infer.generate import SamplingConfig, check_prompts, make_generator, model_device_dtype, sample_next
from gptlab.model import GPT
from gptlab.runtime import GptlabError

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    slots: int = 8  # requests decoded together; more wait in a queue (first come, first served)

    def __post_init__(self) -> None:
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or self.slots < 1:
            raise GptlabError(f"slots must be a whole number of at least 1, got {self.slots!r}")


@dataclass(frozen=True)
class Finished:
    """The last event of a request."""

    reason: str  # "stop", "length", "cancelled" or "error"


class Request:
    """One prompt being generated. Iterate it (or `async for` it, if submitted with a loop) for its tokens."""

    def __init__(self, prompt: list[int], config: SamplingConfig, loop: asyncio.AbstractEventLoop | None) -> None:
        self.prompt = prompt
        self.config = config
        self.tokens: list[int] = []  # generated so far (stop token excluded)
        self.finish_reason: str | None = None
        self.stop_token: int | None = None  # the stop token that ended it (reason "stop"), which is not in tokens
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


@dataclass
class EngineStats:
    finished: dict[str, int] = field(default_factory=dict)  # requests by finish reason
    peak_running: int = 0  # most requests decoded in one step
    steps: int = 0  # decode steps so far


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

    def advance(self, n: int) -> None:
        pass  # each slot's length is the engine's to keep


class Engine:
    """Continuous batching over `model` on a background thread. `close()` (or `with`) stops it.

    `on_step(engine)` is called on the engine thread after every decode step (tests use it to
    submit requests at chosen steps).
    """

    def __init__(self, model: GPT, config: EngineConfig = EngineConfig(), *, on_step: Callable[[Engine], None] | None = None) -> None:
        self.model = model.eval()
        self.config = config
        self.device, _ = model_device_dtype(model)
        self.cache = SlotCache(model, config.slots)
        self.stats = EngineStats()
        self.on_step = on_step
        self._slots: list[_Slot | None] = [None] * config.slots
        self._waiting: deque[Request] = deque()
        self._condition = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="gptlab-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ any thread

    def submit(self, prompt: list[int], config: SamplingConfig, *, loop: asyncio.AbstractEventLoop | None = None) -> Request:
        """Queue a prompt; raises GptlabError at once if it does not fit the context with max_new_tokens.

        With `loop`, events are delivered into that asyncio loop (iterate with `async for`).
        """
        (prompt,) = check_prompts(self.model, [prompt], config, truncate=False)
        request = Request(prompt, config, loop)
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
                    self._step()
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
            self.cache.select([index], [0], idx.shape[1])
            self.cache.length = 0  # a causal prefill from position 0: the model's own mask and positions
            with torch.inference_mode():
                logits, _ = self.model(idx, cache=self.cache, last_only=True)
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
        with torch.inference_mode():
            logits, _ = self.model(idx, cache=self.cache, positions=lengths[:, None], mask=mask, last_only=True)
        logits = logits[:, -1]  # (B, vocab_size)
        self.stats.steps += 1
        self.stats.peak_running = max(self.stats.peak_running, len(running))
        tokens: dict[int, int] = {}
        greedy: dict[int | None, list[int]] = {}  # greedy rows, by the vocab_size they may draw from: one argmax each
        for i, (_, slot) in enumerate(running):
            if slot.request.config.temperature == 0:
                greedy.setdefault(slot.request.config.vocab_size, []).append(i)
        for members in greedy.values():
            chosen = sample_next(logits[members], running[members[0]][1].request.config, None)
            tokens.update(zip(members, chosen.tolist()))
        for i, (_, slot) in enumerate(running):
            slot.length += 1
            if i not in tokens:
                tokens[i] = sample_next(logits[i : i + 1], slot.request.config, slot.generator)[0].item()
        for i, (index, _) in enumerate(running):
            self._accept(index, tokens[i])

    def _accept(self, index: int, token: int) -> None:
        """A sampled token for slot `index`: send it, or finish the request."""
        slot = self._slots[index]
        request = slot.request
        if token in request.config.stop_tokens:
            request.stop_token = token
            self._finish(index, "stop")
            return
        request.tokens.append(token)
        request._send(token)
        slot.last = token
        if len(request.tokens) >= request.config.max_new_tokens:
            self._finish(index, "length")

    def _finish(self, index: int, reason: str) -> None:
        request = self._slots[index].request
        with self._condition:
            self._slots[index] = None
            self._finish_waiting(request, reason)

    def _finish_waiting(self, request: Request, reason: str) -> None:
        request.finish_reason = reason
        request._send(Finished(reason))
        self.stats.finished[reason] = self.stats.finished.get(reason, 0) + 1
        self._condition.notify_all()
