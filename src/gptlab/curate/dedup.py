"""Corpus-wide deduplication: exact repeated lines, exact duplicate documents, and MinHash near-duplicates.

A document's fate here depends on every other document, so these are not per-document stages
(gptlab.curate.document.Stage): each one first reads the whole corpus to decide, then replays it with the decisions
applied. The corpus is a callable giving a fresh pass, in the same order every time (e.g. over JSONL shards on disk):

    documents = lambda: read_shards(paths)        # -> Iterator[Document]
    for dedup in (DocumentDeduplicator(), LineDeduplicator(), MinHashDeduplicator()):
        documents = dedup.apply(documents)        # reads the corpus to decide; returns the replay, a callable
    for document in documents(): write(document)  # a replay reruns the stages before it, lazily, from the source
    [dedup.stats for dedup in ...]                # StageStats of each stage's last complete replay

    DocumentDeduplicator  pass 1 hashes each text (128-bit mmh3, optionally normalised) and keeps the first of
                          each hash. Memory: one hash per distinct document, then one entry per duplicate.
    LineDeduplicator      pass 1 counts every non-blank line's 128-bit mmh3 hash (of its UTF-8 bytes); the replay
                          removes lines seen more than once in the corpus (all copies, or all but the first).
                          Memory: one hash per distinct line in pass 1, then only the repeated ones. After exact
                          document dedup: removing all copies of repeated lines would empty every copy of a
                          duplicated document, the first included.
    MinHashDeduplicator   pass 1: signatures and LSH band keys (8 bytes x bands per document); buckets give
                          candidate pairs. Pass 2: the true Jaccard of each candidate pair on its shingle sets
                          (held only for candidates, only until their last partner), clusters by union-find.

Drops are counted in `stats.reasons` ("empty after line dedup", "exact duplicate", "near duplicate"); examples of
duplicates carry "duplicate_of", the id of the document kept. Document positions tie the passes together, so a
corpus that changes between passes is an error. Not here: MinHash arithmetic (gptlab.curate.minhash), reading and
writing shards (gptlab.curate.pipeline).
"""

from __future__ import annotations

import functools
import itertools
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import mmh3
import numpy as np

from gptlab.curate.document import EXAMPLE_CHARS, Document, StageStats, size
from gptlab.curate.minhash import (
    MinHashConfig,
    band_keys,
    jaccard,
    normalise_text,
    permutation_parameters,
    shingle_hashes,
    signature,
    utf8,
    workspace,
)
from gptlab.runtime import GptlabError

Corpus = Callable[[], Iterable[Document]]  # a fresh pass over the same documents, in the same order, per call
Judge = Callable[[int, Document, StageStats], "Document | None"]  # (position, document, stats) -> kept or None


class CorpusStage:
    """A stage that reads the whole corpus before it can decide. Subclasses implement `_decide` (the reading passes,
    returning the number of documents) and `_judge` (a fresh per-replay function that keeps, changes or drops)."""

    name = "corpus stage"

    def __init__(self) -> None:
        self.stats = StageStats(self.name)
        self.counts: Counter = Counter()  # what the deciding passes found, copied into stats.changes
        self._total: int | None = None

    def apply(self, documents: Corpus | Sequence[Document]) -> Callable[[], Iterator[Document]]:
        """Read the corpus to decide, then return the replay: a callable giving the kept and changed documents, in
        input order, each time it is called. Each complete replay sets `stats` (all replays are the same)."""
        corpus = _as_corpus(documents, self.name)
        self.counts = Counter()
        self._total = self._decide(corpus)
        self.stats = StageStats(self.name, changes=Counter(self.counts))
        return functools.partial(self._replay, corpus)

    def _decide(self, documents: Corpus) -> int:
        raise NotImplementedError

    def _judge(self) -> Judge:
        raise NotImplementedError

    def _replay(self, documents: Corpus) -> Iterator[Document]:
        stats = StageStats(self.name, changes=Counter(self.counts))
        judge = self._judge()
        for position, document in enumerate(documents()):
            stats.documents_in += 1
            stats.bytes_in += size(document.text)
            result = judge(position, document, stats)
            if result is not None:
                stats.documents_out += 1
                stats.bytes_out += size(result.text)
                yield result
        _check_same_corpus(self.name, self._total, stats.documents_in)
        self.stats = stats


def _as_corpus(documents: Corpus | Sequence[Document], name: str) -> Corpus:
    if callable(documents):
        return documents
    if isinstance(documents, Sequence):
        return lambda: iter(documents)
    raise GptlabError(f"{name} reads the corpus more than once, so it needs a callable giving a fresh iterator, not "
                      f"a {type(documents).__name__}: pass e.g. `lambda: read_documents(path)`")


def _check_same_corpus(name: str, expected: int | None, seen: int) -> None:
    if expected != seen:
        raise GptlabError(f"{name}: the corpus gave {expected} documents on the first pass and {seen} now; dedup reads "
                          "it several times, so `documents()` must give the same documents in the same order each call")


def _drop(stats: StageStats, reason: str, document: Document, kept_id: str | None = None) -> None:
    """Count a drop and keep it as an example, naming the kept document when it is a duplicate."""
    stats.reasons[reason] += 1
    examples = stats.examples.setdefault(reason, [])
    if len(examples) < stats.limit:
        example = {"id": document.id, "text": document.text[:EXAMPLE_CHARS]}
        if kept_id is not None:
            example["duplicate_of"] = kept_id
        examples.append(example)


def line_hash(line: str) -> int:
    """128-bit mmh3 of the line's UTF-8 bytes: at 2^-128 per pair, distinct lines never share a hash in practice."""
    return mmh3.hash128(utf8(line), signed=False)


@dataclass(frozen=True, kw_only=True)
class LineDeduplicationConfig:
    keep_first: bool = False  # False: every copy of a repeated line goes (repeated boilerplate, as CS336 states it)


class LineDeduplicator(CorpusStage):
    """Exact line deduplication. Lines are the text split on "\\n"; blank lines are neither counted nor removed, so
    paragraph breaks survive. A document left without a non-blank line is dropped ("empty after line dedup").
    Run exact document dedup before this: with keep_first=False, every copy of a duplicated document (original
    included) would lose all of its lines.

        ["menu\\nstory one\\nfooter", "menu\\nstory two\\nfooter"] -> ["story one", "story two"]
        with keep_first=True                                     -> ["menu\\nstory one\\nfooter", "story two"]
    """

    name = "line dedup"

    def __init__(self, config: LineDeduplicationConfig | None = None) -> None:
        super().__init__()
        self.config = config or LineDeduplicationConfig()
        self._repeated: set[int] = set()

    def _decide(self, documents: Corpus) -> int:
        counts: Counter = Counter()
        total = 0
        for document in documents():
            total += 1
            counts.update(line_hash(line) for line in document.text.split("\n") if line.strip())
        self._repeated = {key for key, count in counts.items() if count > 1}
        self.counts.update({"lines removed": 0, "documents changed": 0})
        return total

    def _judge(self) -> Judge:
        emitted: set[int] = set()  # with keep_first: repeated lines whose first copy has been kept

        def removes(line: str) -> bool:
            if not line.strip():
                return False
            key = line_hash(line)
            if key not in self._repeated:
                return False
            if self.config.keep_first and key not in emitted:
                emitted.add(key)
                return False
            return True

        def judge(position: int, document: Document, stats: StageStats) -> Document | None:
            kept, removed = [], []
            for line in document.text.split("\n"):
                (removed if removes(line) else kept).append(line)
            if removed:
                stats.changes["lines removed"] += len(removed)
            if not any(line.strip() for line in kept):
                _drop(stats, "empty after line dedup", document)
                return None
            if not removed:
                return document
            stats.changes["documents changed"] += 1
            stats.example("lines removed", Document(id=document.id, text="\n".join(removed)))
            return Document(id=document.id, text="\n".join(kept), metadata=document.metadata)

        return judge


class DuplicateRemover(CorpusStage):
    """Drops the documents whose position `_decide` maps to an earlier kept one, naming that one in the examples."""

    reason = "duplicate"

    def __init__(self) -> None:
        super().__init__()
        self._duplicate_of: dict[int, int] = {}  # dropped position -> kept position (earlier in input order)

    def _judge(self) -> Judge:
        targets = set(self._duplicate_of.values())
        kept_ids: dict[int, str] = {}  # filled as the replay passes each kept document, before its duplicates

        def judge(position: int, document: Document, stats: StageStats) -> Document | None:
            if position in targets:
                kept_ids[position] = document.id
            original = self._duplicate_of.get(position)
            if original is None:
                return document
            _drop(stats, self.reason, document, kept_ids.get(original))
            return None

        return judge


@dataclass(frozen=True, kw_only=True)
class DocumentDeduplicationConfig:
    normalise: bool = False  # True: compare after normalise_text (case, accents, punctuation, whitespace)


class DocumentDeduplicator(DuplicateRemover):
    """Exact document deduplication: the first document of each text hash (128-bit mmh3) is kept, later ones are
    dropped as "exact duplicate"."""

    name = "document dedup"
    reason = "exact duplicate"

    def __init__(self, config: DocumentDeduplicationConfig | None = None) -> None:
        super().__init__()
        self.config = config or DocumentDeduplicationConfig()

    def _decide(self, documents: Corpus) -> int:
        first: dict[int, int] = {}  # text hash -> position of its first document
        self._duplicate_of = {}
        position = -1
        for position, document in enumerate(documents()):
            text = normalise_text(document.text) if self.config.normalise else document.text
            kept = first.setdefault(mmh3.hash128(utf8(text), signed=False), position)
            if kept != position:
                self._duplicate_of[position] = kept
        return position + 1


class MinHashDeduplicator(DuplicateRemover):
    """Near-duplicate removal: MinHash signatures, LSH banding for candidates, the true Jaccard of every candidate
    pair (so nothing below the threshold is ever dropped), and clusters as connected components of the verified
    pairs; the first document of each cluster is kept, the others dropped as "near duplicate". Reports in
    stats.changes: candidate pairs (distinct pairs sharing a bucket), pairs compared (candidates not already joined
    through other pairs: comparing those could not change the clusters), verified pairs, clusters.

    A pair at Jaccard s is missed when it shares no bucket, with probability (1 - s^r)^b (gptlab.curate.minhash).
    A bucket of m documents gives m(m-1)/2 candidate pairs, held in memory: run exact dedup first, which removes
    the largest buckets (copies)."""

    name = "minhash dedup"
    reason = "near duplicate"

    def __init__(self, config: MinHashConfig | None = None) -> None:
        super().__init__()
        self.config = config or MinHashConfig()

    def _decide(self, documents: Corpus) -> int:
        keys, has_shingles = self._band_keys(documents)
        pairs = candidate_pairs(keys, has_shingles)
        self.counts.update({"candidate pairs": len(pairs), "pairs compared": 0, "verified pairs": 0, "clusters": 0})
        clusters = self._verify(documents, pairs, len(keys))
        candidates = {position for pair in pairs for position in pair}
        self._duplicate_of = {position: clusters.find(position) for position in candidates
                              if clusters.find(position) != position}
        self.counts["clusters"] = len(set(self._duplicate_of.values()))
        return len(keys)

    def _band_keys(self, documents: Corpus) -> tuple[np.ndarray, np.ndarray]:
        """Pass 1: each document's band keys (documents, bands) and whether it has any shingle."""
        a, b = permutation_parameters(self.config)
        scratch = workspace(self.config.num_hashes)
        keys, has_shingles = array("Q"), bytearray()
        for document in documents():
            hashes = shingle_hashes(document.text, self.config)
            keys.frombytes(band_keys(signature(hashes, a, b, scratch), self.config.bands).tobytes())
            has_shingles.append(hashes.size > 0)
        return (np.frombuffer(keys, dtype=np.uint64).reshape(-1, self.config.bands),
                np.frombuffer(has_shingles, dtype=np.uint8).astype(bool))

    def _verify(self, documents: Corpus, pairs: list[tuple[int, int]], total: int) -> UnionFind:
        """Pass 2: the true Jaccard of each candidate pair, joining the pairs at or above the threshold. A document's
        shingle set is held from its position until its last partner's, so memory follows the candidates."""
        partners: dict[int, list[int]] = {}  # position -> earlier candidates it pairs with
        last_partner: dict[int, int] = {}  # position -> the last position it pairs with
        for first, second in pairs:
            partners.setdefault(second, []).append(first)
            last_partner[first] = max(last_partner.get(first, first), second)
        clusters, held = UnionFind(), {}
        seen = 0
        for position, document in enumerate(documents()):
            seen += 1
            if position not in partners and position not in last_partner:
                continue
            hashes = shingle_hashes(document.text, self.config)
            for earlier in partners.get(position, ()):
                if clusters.find(earlier) != clusters.find(position):
                    self.counts["pairs compared"] += 1
                    if jaccard(held[earlier], hashes) >= self.config.threshold:
                        self.counts["verified pairs"] += 1
                        clusters.union(earlier, position)
                if last_partner[earlier] == position:
                    del held[earlier]
            if last_partner.get(position, position) > position:
                held[position] = hashes
        _check_same_corpus(self.name, total, seen)
        return clusters


def candidate_pairs(keys: np.ndarray, eligible: np.ndarray) -> list[tuple[int, int]]:
    """The sorted distinct pairs (i < j) of eligible documents whose keys agree in at least one band. Per band, the
    keys are sorted and each run of equal keys is a bucket, all of whose pairs are candidates:
    keys [[1, 7], [1, 8], [2, 8]] -> band 0 gives (0, 1), band 1 gives (1, 2) -> [(0, 1), (1, 2)]."""
    positions = np.flatnonzero(eligible)
    pairs: set[tuple[int, int]] = set()
    for band in range(keys.shape[1]):
        column = keys[positions, band]
        order = np.argsort(column, kind="stable")  # stable: positions within a bucket stay ascending
        ordered = column[order]
        starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
        ends = np.append(starts[1:], len(ordered))
        shared = ends - starts > 1
        for start, end in zip(starts[shared].tolist(), ends[shared].tolist()):
            pairs.update(itertools.combinations(positions[order[start:end]].tolist(), 2))
    return sorted(pairs)


class UnionFind:
    """Disjoint sets of document positions (path halving). A set's root is its smallest position, the first
    document in input order, which is the one a cluster keeps."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, item: int) -> int:
        while (parent := self.parent.get(item, item)) != item:
            grandparent = self.parent.get(parent, parent)
            self.parent[item] = grandparent
            item = grandparent
        return item

    def union(self, first: int, second: int) -> None:
        first, second = self.find(first), self.find(second)
        if first != second:
            self.parent[max(first, second)] = min(first, second)
