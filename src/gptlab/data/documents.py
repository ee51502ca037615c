"""A corpus as `gptlab run` uses it: documents split into training and held-out ones, from any source.

    shakespeare             the built-in works (files in the cache; every val_every-th work held out)
    notes/  book.txt        a folder or file of text (gptlab.data.sources.scan_inputs: any text file, .jsonl,
                            .parquet; binary files skipped), each text file or record a document
    hf:NAME[:CONFIG]        a Hugging Face dataset, hub or local (hf:/path/to/dataset), each record a document

Every val_every-th document is held out: unseen by the tokenizer, and the val split. A corpus with fewer
documents than val_every holds out its last one; a single document is cut at line breaks into val_every
parts first, and the last part is held out. `adapted` says in words what differs from the built-in corpus.
The documents of a user's corpus are read into memory (the run is sized for a laptop); a DocumentsSource
hands either part to `prepare_shards`, described by the SHA-256 of its texts, so a rerun on changed files
is told from a rerun on the same ones.

Not here: reading files and datasets (gptlab.data.sources), shards (gptlab.data.prepare).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gptlab.data.sources import Source, open_source
from gptlab.runtime import GptlabError

BUILTIN = "shakespeare"


@dataclass
class DocumentsSource(Source):
    """Documents already in memory, as a source for prepare_shards."""

    texts: list[str] = field(default_factory=list)
    part: str = "train"  # train | held-out
    origin: dict = field(default_factory=dict)  # the corpus's description

    def describe(self) -> dict:
        digest = hashlib.sha256()
        for text in self.texts:
            digest.update(hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).digest())
        return {"kind": "documents", "of": self.origin, "part": self.part, "documents": len(self.texts), "sha256": digest.hexdigest()}

    def total_bytes(self) -> int:
        return sum(len(text.encode("utf-8", errors="surrogatepass")) for text in self.texts)

    def __iter__(self) -> Iterator[str]:
        yield from self.texts


@dataclass
class RunCorpus:
    name: str  # for the default folder: runs/<name>
    train: list[str]  # the training documents' texts
    held_out: list[str]  # the held-out documents' texts
    train_files: list[Path] = field(default_factory=list)  # the built-in corpus: its files (the tokenizer reads them)
    held_out_files: list[Path] = field(default_factory=list)
    where: str = ""  # where the documents came from, for the log
    skipped: str = ""  # "skipped 2 binary files: ..." ("" when none)
    adapted: list[str] = field(default_factory=list)  # what differs from the built-in corpus, in words
    origin: dict = field(default_factory=dict)

    @property
    def builtin(self) -> bool:
        return bool(self.train_files)

    @property
    def kind(self) -> str:
        """What the log calls its documents: the built-in corpus's are works (plays and poems)."""
        return "works" if self.builtin else "documents"

    def sources(self) -> tuple:
        """(train, val) for prepare_shards: the built-in corpus's files, or the documents in memory."""
        if self.builtin:
            return [str(path) for path in self.train_files], [str(path) for path in self.held_out_files]
        return (DocumentsSource("train", texts=self.train, part="train", origin=self.origin),
                DocumentsSource("held-out", texts=self.held_out, part="held-out", origin=self.origin))

    def digest(self) -> str:
        """SHA-256 of every document, train then held out: the corpus this run was made from."""
        if self.builtin:
            return ""
        train, val = self.sources()
        return hashlib.sha256((train.describe()["sha256"] + val.describe()["sha256"]).encode()).hexdigest()


def corpus_name(spec: str) -> str:
    """"shakespeare", "notes" for notes/ or notes.txt, "TinyStories" for hf:roneneldan/TinyStories."""
    if spec.startswith("hf:"):
        from gptlab.data.sources import HuggingFaceSource

        raw = Path(HuggingFaceSource(spec).name.rstrip("/")).name
    elif any(char in spec for char in "*?["):
        raw = Path(spec.split("*")[0].split("?")[0].split("[")[0] or ".").resolve().name
    else:
        path = Path(spec)
        raw = path.resolve().name if path.is_dir() else path.stem
    return re.sub(r"[^A-Za-z0-9._-]+", "-", raw).strip("-.") or "corpus"


def load_run_corpus(spec: str, val_every: int) -> RunCorpus:
    """The corpus `spec` names, split into training and held-out documents (see the module docstring)."""
    if spec == BUILTIN:
        from gptlab.data.corpus import shakespeare_files

        files = shakespeare_files()
        held = files[val_every - 1 :: val_every]
        train = [path for path in files if path not in held]
        return RunCorpus(BUILTIN, _read(train), _read(held), train, held, where=str(files[0].parent))
    if not spec:
        raise GptlabError("--corpus is empty; name shakespeare, a folder or file of text, or hf:DATASET")
    source = open_source(spec)
    source.check()
    texts = [text for text in source if text.strip()]
    where = str(Path(spec).resolve()) if not spec.startswith("hf:") else spec
    if not texts:
        raise GptlabError(f"--corpus {spec} holds no text (its documents are empty); give a folder or file of text")
    train, held, adapted = split_documents(texts, val_every)
    return RunCorpus(corpus_name(spec), train, held, where=where, skipped=getattr(source, "skipped", ""), adapted=adapted,
                     origin=source.describe())


def _read(paths: list[Path]) -> list[str]:
    return [path.read_text(encoding="utf-8") for path in paths]


def split_documents(texts: list[str], val_every: int) -> tuple[list[str], list[str], list[str]]:
    """(train, held out, what was adapted): every val_every-th document held out; fewer documents than that,
    the last; a single document is cut into val_every parts at line breaks first."""
    adapted = []
    if len(texts) == 1:
        parts = cut_at_lines(texts[0], val_every)
        if len(parts) < 2:
            raise GptlabError("the corpus is one document of a single line: nothing to hold out; give more text, or more files")
        adapted.append(f"its one document cut into {len(parts)} parts at line breaks")
        texts = parts
    if len(texts) < val_every:
        adapted.append(f"the last of its {len(texts)} documents held out (fewer than --val-every {val_every})")
        return texts[:-1], texts[-1:], adapted
    held = texts[val_every - 1 :: val_every]
    train = [text for number, text in enumerate(texts, start=1) if number % val_every]
    return train, held, adapted


def cut_at_lines(text: str, parts: int) -> list[str]:
    """A text cut at line breaks into at most `parts` pieces of about equal size; joined, they are the text."""
    lines = text.splitlines(keepends=True)
    size = len(text) / parts
    pieces, current, length = [], [], 0
    for line in lines:
        current.append(line)
        length += len(line)
        if length >= size * (len(pieces) + 1) and len(pieces) < parts - 1:
            pieces.append("".join(current))
            current = []
    if current:
        pieces.append("".join(current))
    return [piece for piece in pieces if piece]


def prompt_from(texts: list[str], words: int = 6) -> str:
    """A sample prompt from the text itself: the first words of the first held-out document's first line."""
    for text in texts:
        for line in text.splitlines():
            if line.strip():
                parts = line.strip().split()
                return " ".join(parts[:words]) + ("\n" if len(parts) <= words else " ")
    return "\n"
