"""The unit every curation stage passes on, and the counts each stage keeps of what it kept, changed and dropped.

    Document(id="crawl.warc.gz/17", text="...", metadata={"url": ..., "language": "en", ...})

A stage is a `Filter` (keeps or drops a document, naming why) or a `Transform` (returns a changed document); both
count documents and UTF-8 bytes in and out, drop reasons, and keep up to `examples` short examples per reason,
so the report can say what each stage did and show it. Not here: reading inputs (gptlab.curate.readers),
running stages over a corpus (gptlab.curate.pipeline).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

EXAMPLE_CHARS = 300  # characters of a document kept as an example in the report


@dataclass
class Document:
    id: str  # unique within a run: the source file and the record's position, or the record's own id
    text: str
    metadata: dict = field(default_factory=dict)  # url, warc date, language and its score, quality scores, ...


@dataclass
class StageStats:
    """What one stage saw: documents and bytes in and out, drops by reason, and a few examples of each reason."""

    name: str
    documents_in: int = 0
    documents_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    reasons: Counter = field(default_factory=Counter)  # drop reason -> documents
    changes: Counter = field(default_factory=Counter)  # what a transform changed -> count (e.g. emails masked)
    examples: dict = field(default_factory=dict)  # reason -> [{"id", "text"}], at most `limit` each
    limit: int = 3

    def example(self, reason: str, document: Document) -> None:
        kept = self.examples.setdefault(reason, [])
        if len(kept) < self.limit:
            kept.append({"id": document.id, "text": document.text[:EXAMPLE_CHARS]})

    def merge(self, other: StageStats) -> None:
        """Add another worker's counts of the same stage (examples up to the limit)."""
        self.documents_in += other.documents_in
        self.documents_out += other.documents_out
        self.bytes_in += other.bytes_in
        self.bytes_out += other.bytes_out
        self.reasons.update(other.reasons)
        self.changes.update(other.changes)
        for reason, examples in other.examples.items():
            kept = self.examples.setdefault(reason, [])
            kept.extend(examples[: max(0, self.limit - len(kept))])

    def as_dict(self) -> dict:
        return {"name": self.name, "documents_in": self.documents_in, "documents_out": self.documents_out,
                "bytes_in": self.bytes_in, "bytes_out": self.bytes_out, "reasons": dict(self.reasons),
                "changes": dict(self.changes), "examples": self.examples}

    @classmethod
    def from_dict(cls, record: dict) -> StageStats:
        return cls(name=record["name"], documents_in=record["documents_in"], documents_out=record["documents_out"],
                   bytes_in=record["bytes_in"], bytes_out=record["bytes_out"], reasons=Counter(record["reasons"]),
                   changes=Counter(record["changes"]), examples=record["examples"])


def size(text: str) -> int:
    return len(text.encode("utf-8", errors="replace"))


def document_size(document: Document) -> int:
    """Its text's UTF-8 bytes; a page not yet extracted counts its raw HTML."""
    html = document.metadata.get("html")
    return size(document.text) if document.text or not isinstance(html, bytes) else len(html)


class Stage:
    """A named step over documents. Subclasses set `name` and implement `process`; `run` counts around it."""

    name = "stage"

    def __init__(self) -> None:
        self.stats = StageStats(self.name)

    def process(self, document: Document) -> Document | None:
        raise NotImplementedError

    def run(self, documents: Iterable[Document]) -> Iterator[Document]:
        for document in documents:
            self.stats.documents_in += 1
            self.stats.bytes_in += document_size(document)
            result = self.process(document)
            if result is not None:
                self.stats.documents_out += 1
                self.stats.bytes_out += size(result.text)
                yield result


class Filter(Stage):
    """Keeps a document or drops it for a reason: implement `reject(document) -> reason or None`."""

    def reject(self, document: Document) -> str | None:
        raise NotImplementedError

    def process(self, document: Document) -> Document | None:
        reason = self.reject(document)
        if reason is None:
            return document
        self.stats.reasons[reason] += 1
        self.stats.example(reason, document)
        return None


class Transform(Stage):
    """Changes a document: implement `transform(document) -> document`, counting changes in self.stats.changes.
    A transform that leaves no text drops the document, with the reason "empty"."""

    def transform(self, document: Document) -> Document:
        raise NotImplementedError

    def process(self, document: Document) -> Document | None:
        result = self.transform(document)
        if not result.text.strip():
            self.stats.reasons["empty"] += 1
            self.stats.example("empty", document)
            return None
        return result
