"""Training byte-level BPE: count pieces, then learn merges. The whole algorithm is in this file.

1. Pre-tokenize. Each document (a file, or a string of `texts`) is cut at
   special tokens, then split by the pattern into pieces; we count how often
   each distinct piece occurs. Large inputs are counted in parallel worker
   processes, over ranges that begin and end at document or special-token
   boundaries, so the counts (and everything after) do not depend on the
   number of workers or on chunking. Files are streamed, never read whole.

       "the cat the" -> {"the": 1, " cat": 1, " the": 1}

2. Learn merges. Every distinct piece is a "word": a list of token ids,
   initially its bytes. We count adjacent pairs over all words, weighted by
   word count, e.g. words {b"aab": 2, b"ab": 1} give pairs {(a, a): 2, (a, b): 3}.
   Then, n_merges times: take the most frequent pair (ties go to the
   lexicographically greatest pair of byte strings), give it a new id, and
   rewrite the words that contain it. Only those words' pairs are re-counted
   (an index maps each pair to the words holding it), and a heap finds the
   best pair, so a merge costs time in proportion to what it changes.

This file is the readable reference. When the compiled core is built
(gptlab.tokenizer.native), counting runs in C on threads (PieceCounter in
fastbpe.c) and merging in C (_fasttrain.c), with identical results:
`count_words` and `fit_merges` pick the implementation.

Not here: encoding (gptlab.tokenizer.core), file formats (gptlab.tokenizer.formats).
"""

from __future__ import annotations

import codecs
import functools
import heapq
import os
import queue
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm.auto import tqdm

from gptlab.runtime import GptlabError, default_workers
from gptlab.runtime.processes import worker_pool
from gptlab.tokenizer import native
from gptlab.tokenizer.patterns import compile_pattern, split_stable
from gptlab.tokenizer.specials import SpecialMatcher
from gptlab.tokenizer.stream import stream_parts

READ_BLOCK = 1 << 20  # bytes per read while streaming a file
PARALLEL_MIN_BYTES = 4 << 20  # below this, worker start-up costs more than it saves
TEXTS_PER_TASK_CHARS = 4 << 20
THREAD_TASK_CHARS = 1 << 18  # texts per task on threads: small, for an even split (a task costs no merge, see _count_on_threads)
LONG_WORD = 256  # words at least this long update their pair counts per distinct pair


# ---------------------------------------------------------------- 1. counting


def read_text_chunks(path: Path, start: int = 0, end: int | None = None) -> Iterator[str]:
    """Decode bytes [start, end) of a UTF-8 file block by block (a character may span two blocks)."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    position = start
    with open(path, "rb") as handle:
        handle.seek(start)
        while end is None or position < end:
            block = handle.read(READ_BLOCK if end is None else min(READ_BLOCK, end - position))
            final = not block
            try:
                text = decoder.decode(block, final=final)
            except UnicodeDecodeError as error:
                raise GptlabError(
                    f"{path} is not valid UTF-8 (bad byte near offset {position + error.start})"
                ) from None
            if text:
                yield text
            if final:
                return
            position += len(block)
    tail = decoder.decode(b"", final=True) if end is not None else ""
    if tail:
        yield tail


def count_text(chunks: Iterable[str], pattern: str | None, special_tokens: Sequence[str], counts: Counter | None = None):
    """Count the pieces of one document given as a stream of chunks; special tokens are boundaries.

    Adds to `counts`: a Counter, or the compiled core's PieceCounter (same counts, in C).
    """
    counts = Counter() if counts is None else counts
    if isinstance(counts, Counter):
        compiled = compile_pattern(pattern)

        def take(text: str, final: bool) -> tuple[None, int]:
            pieces, used = split_stable(text, compiled, final)
            counts.update(pieces)
            return None, used

    else:

        def take(text: str, final: bool) -> tuple[None, int]:
            return None, counts.add(text, final)

    for _ in stream_parts(chunks, SpecialMatcher(special_tokens), take):
        pass
    return counts


def _new_counts(scanner: int | None):
    """A Counter, or a PieceCounter when the compiled core can split this pattern (`scanner`)."""
    return Counter() if scanner is None else native.fastbpe().PieceCounter(scanner)


def _count_task(task: tuple, pattern: str | None, special_tokens: tuple[str, ...], scanner: int | None, counts=None) -> tuple:
    """Worker entry: ("file", path, start, end) or ("texts", [str, ...]); returns counts (added to `counts`, if given) and bytes read."""
    counts = _new_counts(scanner) if counts is None else counts
    if task[0] == "file":
        _, path, start, end = task
        return count_text(read_text_chunks(Path(path), start, end), pattern, special_tokens, counts), end - start
    for text in task[1]:
        count_text([text], pattern, special_tokens, counts)
    return counts, sum(len(text.encode("utf-8")) for text in task[1])


def _next_boundary(handle, offset: int, size: int, needles: list[bytes]) -> int:
    """The first offset >= `offset` where a special token starts, or the file size."""
    overlap = max(map(len, needles)) - 1
    position = offset
    while position < size:
        handle.seek(position)
        block = handle.read(READ_BLOCK + overlap)
        hits = [i for i in (block.find(needle) for needle in needles) if i >= 0]
        if hits:
            return position + min(hits)
        position += READ_BLOCK
    return size


def file_ranges(path: Path, special_tokens: Sequence[str], target_bytes: int) -> list[tuple[int, int]]:
    """Cut a file into ranges of about `target_bytes`, each starting at a special token (or 0)."""
    size = path.stat().st_size
    if not special_tokens or size <= target_bytes:
        return [(0, size)]
    needles = [token.encode("utf-8") for token in special_tokens]
    starts = [0]
    with open(path, "rb") as handle:
        while starts[-1] + target_bytes < size:
            boundary = _next_boundary(handle, starts[-1] + target_bytes, size, needles)
            if boundary >= size:
                break
            starts.append(boundary)
    return list(zip(starts, [*starts[1:], size]))


def _tasks(
    texts: Iterable[str] | None, files: Sequence[Path], special_tokens: Sequence[str], target: int, text_chars: int
) -> Iterator[tuple]:
    for path in files:
        yield from (("file", str(path), start, end) for start, end in file_ranges(path, special_tokens, target))
    batch: list[str] = []
    size = 0
    for text in texts or ():
        batch.append(text)
        size += len(text)
        if size >= text_chars:
            yield ("texts", batch)
            batch, size = [], 0
    if batch:
        yield ("texts", batch)


class _NoBar:
    """What `_progress` gives when no bar is shown: tqdm's first bar costs ~5 ms (a multiprocessing lock), even disabled."""

    def update(self, n: int) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc_info) -> None:
        pass


def _progress(progress: bool, **options):
    """A tqdm bar with `options`, or a stand-in that ignores updates."""
    return tqdm(**options) if progress else _NoBar()


def _count_on_threads(tasks: Iterable[tuple], count, workers: int, scanner: int, bar) -> list:
    """Run `count` over the tasks on threads (the compiled counter frees the GIL); returns the threads' counters.

    Each running task borrows a counter and adds into it, so counters are merged once per thread, not per task.
    """
    spare: queue.SimpleQueue = queue.SimpleQueue()
    counters = [_new_counts(scanner) for _ in range(workers)]
    for counter in counters:
        spare.put(counter)

    def run(task: tuple) -> int:
        counts = spare.get()  # never waits: at most `workers` tasks run at once
        try:
            return count(task, counts=counts)[1]
        finally:
            spare.put(counts)

    with ThreadPoolExecutor(workers) as pool:
        pending: deque = deque()  # bounded: texts may be an endless stream
        for task in tasks:
            pending.append(pool.submit(run, task))
            while len(pending) >= 2 * workers:
                bar.update(pending.popleft().result())
        while pending:
            bar.update(pending.popleft().result())
    return counters


def _count_all(
    texts: Iterable[str] | None,
    files: Sequence[str | os.PathLike],
    pattern: str | None,
    special_tokens: Sequence[str],
    workers: int | None,
    progress: bool,
):
    """Counts of distinct pieces over all documents: a Counter, or a PieceCounter from the compiled core.

    The compiled counter frees the GIL, so it runs on threads; the pure-Python one on processes.
    """
    paths = [Path(path) for path in files]
    for path in paths:
        if not path.is_file():
            raise GptlabError(f"input file not found: {path}")
    workers = workers or default_workers()
    scanner = native.scanner_id(pattern) if native.fastbpe() is not None else None
    file_bytes = sum(path.stat().st_size for path in paths)
    text_chars = sum(map(len, texts)) if isinstance(texts, (list, tuple)) else 0
    min_bytes = PARALLEL_MIN_BYTES if scanner is None else 2 * READ_BLOCK  # threads start for free
    parallel = workers > 1 and (file_bytes + text_chars >= min_bytes or (texts is not None and not text_chars))
    target = max(READ_BLOCK, file_bytes // (4 * workers) + 1) if parallel else max(file_bytes, 1)
    per_task = TEXTS_PER_TASK_CHARS if scanner is None else THREAD_TASK_CHARS
    tasks = _tasks(texts, paths, special_tokens, target, per_task)
    count = functools.partial(_count_task, pattern=pattern, special_tokens=tuple(special_tokens), scanner=scanner)
    with _progress(progress, total=(file_bytes + text_chars) or None, unit="B", unit_scale=True, desc="pre-tokenize") as bar:
        if parallel and scanner is not None:
            total, *others = _count_on_threads(tasks, count, workers, scanner, bar)
            for counts in others:
                total.update(counts)
        elif parallel:
            total = Counter()
            with worker_pool(workers) as pool:  # workers leave Ctrl-C to this process, which ends them
                for counts, n_bytes in pool.imap_unordered(count, tasks):
                    total.update(counts)
                    bar.update(n_bytes)
        else:
            total = _new_counts(scanner)
            for task in tasks:
                bar.update(count(task, counts=total)[1])
    return total


def count_words(
    *,
    texts: Iterable[str] | None = None,
    files: Sequence[str | os.PathLike] = (),
    pattern: str | None,
    special_tokens: Sequence[str] = (),
    workers: int | None = None,
    progress: bool = False,
) -> dict[bytes, int]:
    """Count distinct pieces over all documents (files and texts), in parallel for large inputs.

    Pieces come back as UTF-8 bytes, the words `learn_merges` takes: "the cat the" -> {b"the": 1, b" cat": 1, b" the": 1}.
    """
    counts = _count_all(texts, files, pattern, special_tokens, workers, progress)
    if not isinstance(counts, Counter):
        return counts.counts(as_bytes=True)
    return {piece.encode("utf-8"): count for piece, count in counts.items()}


# ---------------------------------------------------------------- 2. merging


def _heap_key(token: bytes) -> tuple[int, ...]:
    """A key whose ascending order is the descending order of `token` (Python's heap pops the smallest).

    Bytes are negated; the trailing 1 sorts a prefix after its extensions, since
    b"ab" > b"a" must pop first.
    """
    return (*(-byte for byte in token), 1)


def merge_pair(word: list[int], left: int, right: int, new: int) -> list[int]:
    """[1, 2, 3, 1, 2] with (1, 2) -> 9 gives [9, 3, 9]."""
    merged, i, n = [], 0, len(word)
    while i < n:
        if i + 1 < n and word[i] == left and word[i + 1] == right:
            merged.append(new)
            i += 2
        else:
            merged.append(word[i])
            i += 1
    return merged


def learn_merges(
    word_counts: dict[bytes, int], n_merges: int, progress: bool = False
) -> list[tuple[bytes, bytes]]:
    """Learn up to `n_merges` merges from distinct words (pieces as bytes) and their counts.

    Token ids 0..255 are the bytes; merge i creates id 256 + i. Stops early
    when no pair occurs any more.
    """
    token_bytes = [bytes([i]) for i in range(256)]
    token_keys = [_heap_key(token) for token in token_bytes]
    words = [list(word) for word in sorted(word_counts) if len(word) > 1]
    counts = [word_counts[bytes(word)] for word in words]

    pair_counts: dict[tuple[int, int], int] = defaultdict(int)
    pair_words: dict[tuple[int, int], set[int]] = defaultdict(set)
    for index, (word, count) in enumerate(zip(words, counts)):
        for pair in zip(word, word[1:]):
            pair_counts[pair] += count
            pair_words[pair].add(index)

    heap = [(-count, token_keys[a], token_keys[b], a, b) for (a, b), count in pair_counts.items()]
    heapq.heapify(heap)

    merges: list[tuple[bytes, bytes]] = []
    with tqdm(total=n_merges, desc="merges", unit="merge", disable=not progress) as bar:
        while len(merges) < n_merges and heap:
            negative_count, _, _, left, right = heapq.heappop(heap)
            pair = (left, right)
            current = pair_counts.get(pair, 0)
            if current != -negative_count:  # stale entry: its count has dropped since it was pushed
                if current > 0:
                    heapq.heappush(heap, (-current, token_keys[left], token_keys[right], left, right))
                continue

            new = len(token_bytes)
            token_bytes.append(token_bytes[left] + token_bytes[right])
            token_keys.append(_heap_key(token_bytes[new]))
            merges.append((token_bytes[left], token_bytes[right]))

            delta = _rewrite_words(words, counts, pair_words, pair, new)
            _apply_delta(delta, pair_counts, heap, token_keys)
            pair_counts.pop(pair, None)
            bar.update(1)
    return merges


def _rewrite_words(words, counts, pair_words, pair: tuple[int, int], new: int) -> dict[tuple[int, int], int]:
    """Merge `pair` into `new` in the words holding it (only those); return the net change in pair counts."""
    left, right = pair
    delta: dict[tuple[int, int], int] = defaultdict(int)
    for index in pair_words.pop(pair):
        word = words[index]
        merged = merge_pair(word, left, right, new)
        if len(merged) == len(word):  # the index is lazy: this word lost the pair earlier
            continue
        count = counts[index]
        if len(word) < LONG_WORD:
            for old_pair in zip(word, word[1:]):
                delta[old_pair] -= count
            for new_pair in zip(merged, merged[1:]):
                delta[new_pair] += count
                pair_words[new_pair].add(index)
        else:  # e.g. a whole document when there is no pre-split: count distinct pairs (in C)
            before, after = Counter(zip(word, word[1:])), Counter(zip(merged, merged[1:]))
            for changed in before.keys() | after.keys():
                difference = after[changed] - before[changed]
                if difference:
                    delta[changed] += difference * count
                    if difference > 0:
                        pair_words[changed].add(index)
        words[index] = merged
    return delta


def _apply_delta(delta: dict[tuple[int, int], int], pair_counts: dict, heap: list, token_keys: list) -> None:
    """Update the pair counts; push pairs whose count rose (only pairs with the new token can rise)."""
    for changed, change in delta.items():
        if change == 0:
            continue
        total = pair_counts[changed] + change
        if total > 0:
            pair_counts[changed] = total
        else:
            del pair_counts[changed]
        if change > 0:
            a, b = changed
            heapq.heappush(heap, (-total, token_keys[a], token_keys[b], a, b))


def fit_merges(word_counts: dict[bytes, int], n_merges: int, progress: bool = False) -> list[tuple[bytes, bytes]]:
    """`learn_merges`, run by the compiled learner when it is built (same merges, see native.py)."""
    fast = native.fasttrain()
    if fast is None:
        return learn_merges(word_counts, n_merges, progress=progress)
    with _progress(progress, total=n_merges, desc="merges", unit="merge") as bar:
        merges = fast.learn_merges(word_counts, n_merges)  # in C, without the GIL: the bar fills at the end
        bar.update(len(merges))
    return merges
