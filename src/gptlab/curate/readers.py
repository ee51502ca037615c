"""Input files to raw Documents, streamed one record at a time, before any extraction or filtering.

    crawl.warc.gz      HTTP 200 responses with an HTML type: text "", metadata html (bytes), url, date, content_type,
                       charset, warc_record_id; id "crawl.warc.gz/17" (the 18th response record, counted from 0)
    crawl.warc.wet.gz  conversion records (.wet, .wet.gz): text as extracted by the crawler, url, date, warc_record_id
    page.html          (.htm) text "", metadata html (bytes); id the path
    data.jsonl         (.jsonl.gz, .json.gz) one object a line: text from `text_field`, id from `id_field` or
                       "data.jsonl/12" (line 12, counted from 1 as editors do); the other fields go to metadata
    data.parquet       read in batches of rows, the same field rules; id "data.parquet/12" (row 12, counted from 0)
    notes.txt          the whole file, one document; id the path
    a directory        every supported file under it (hidden ones left out), in sorted order

`read_documents` returns a `DocumentReader`: iterate it for Documents, then read `reader.stats` (a `ReadStats`) for
what was read and what was skipped (non-HTML and non-200 WARC responses, binary and empty files), which the curation
report sums over files. A file that gives no document is an error with those counts ("x.html: no documents (1 binary,
not text)"), and so is a WARC that is not one, or that ends inside a record: a half-downloaded crawl (every record is
checked against its Content-Length, whatever its type) stops with the file named and how much of it was read.
Not here: HTML to text (gptlab.curate.extract), filtering (the stages), running the stages (gptlab.curate.pipeline).
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import glob
import gzip
import json
import os
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gptlab.curate.document import Document
from gptlab.runtime import GptlabError

HTML_TYPES = ("text/html", "application/xhtml+xml")
PARQUET_BATCH_ROWS = 1024  # rows decoded at a time: a row group can be far larger than memory should hold


@dataclass
class ReadStats:
    """What reading one input found. Every field is a count, so the report can sum them over files."""

    documents: int = 0  # documents handed on
    skipped_not_html: int = 0  # WARC responses that are not HTTP or whose Content-Type is not HTML (images, PDFs, ...)
    skipped_status: int = 0  # WARC HTTP responses whose status is not 200 (redirects, errors)
    skipped_binary: int = 0  # .html / .txt files holding NUL bytes: images, archives, ... under a text name
    skipped_empty: int = 0  # files with nothing in them (or only blank lines)

    def add(self, other: ReadStats) -> None:
        for name, value in dataclasses.asdict(other).items():
            setattr(self, name, getattr(self, name) + value)

    def skips(self) -> str:
        """The skip counts in words, for an input that gave no document: "3 not HTML, 1 HTTP status not 200"."""
        words = {"skipped_not_html": "not HTML", "skipped_status": "HTTP status not 200", "skipped_binary": "binary, not text",
                 "skipped_empty": "empty"}
        counts = {word: getattr(self, name) for name, word in words.items() if getattr(self, name)}
        if list(counts) == ["empty"]:
            return "it is empty"
        return ", ".join(f"{count:,} {word}" for word, count in counts.items()) or "nothing in it"


class DocumentReader(Iterator[Document]):
    """The documents of one input (a file or a directory), counting into `stats` as they are read.

    The input's type is checked when the reader is made; the file is opened on the first `next`.
    """

    def __init__(self, path: str | os.PathLike, *, text_field: str = "text", id_field: str = "id") -> None:
        self.path = Path(path)
        self.stats = ReadStats()
        readers = [(file, _reader_for(file)) for file in expand_inputs([self.path])]
        self._documents = (document for file, read in readers for document in self._read_one(file, read, text_field, id_field))

    def __next__(self) -> Document:
        return next(self._documents)

    def close(self) -> None:
        """Stop early (the file is closed now, not when the reader is collected); the counts so far stay in stats."""
        self._documents.close()

    def _read_one(self, file: Path, read: Read, text_field: str, id_field: str) -> Iterator[Document]:
        """One file's documents, counted; a file that gives none is an error naming what it held instead."""
        stats = ReadStats()
        try:
            for document in read(file, stats, text_field, id_field):
                stats.documents += 1
                yield document
        finally:  # a reader left early still counts what it read
            self.stats.add(stats)
        if not stats.documents:
            raise GptlabError(f"{file}: no documents ({stats.skips()}); leave it out of the inputs, or fetch it again")


def read_documents(path: str | os.PathLike, *, text_field: str = "text", id_field: str = "id") -> DocumentReader:
    """The documents of `path`, streamed; `reader.stats` holds the counts once iterated.

        reader = read_documents("crawl.warc.gz")
        for document in reader: ...
        reader.stats  # ReadStats(documents=812, skipped_not_html=140, skipped_status=48)
    """
    return DocumentReader(path, text_field=text_field, id_field=id_field)


def expand_inputs(paths: Iterable[str | os.PathLike] | str | os.PathLike) -> list[Path]:
    """Files, directories and globs (`crawl/*.warc.gz`, `data/**/*.jsonl`) to the supported files, sorted, each once.

    A file named outright must be of a supported type; a directory or a glob keeps its supported files and leaves the
    rest (a README beside the data), but must hold at least one.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    found: dict[Path, Path] = {}
    for given in paths:
        for file in _expand_one(str(given)):
            found.setdefault(file.resolve(), file)
    if not found:
        raise GptlabError("no inputs given: name files, directories or globs to read")
    return sorted(found.values())


def _expand_one(given: str) -> list[Path]:
    if glob.has_magic(given) and not Path(given).exists():
        matches = sorted(Path(match) for match in glob.glob(given, recursive=True))
        if not matches:
            raise GptlabError(f"no files match {given}")
        files = [file for match in matches for file in (_supported_under(match) if match.is_dir() else [match])]
        return _supported_or_error([file for file in files if _is_supported(file)], given)
    path = Path(given)
    if path.is_dir():
        return _supported_or_error(_supported_under(path), given)
    if not path.is_file():
        raise GptlabError(f"input {given} does not exist")
    _reader_for(path)
    return [path]


def _supported_under(directory: Path) -> list[Path]:
    """The supported files under `directory`, leaving out hidden files and folders (.git, .cache)."""
    def hidden(path: Path) -> bool:
        return any(part.startswith(".") for part in path.relative_to(directory).parts)

    return sorted(path for path in directory.rglob("*") if path.is_file() and _is_supported(path) and not hidden(path))


def _supported_or_error(files: list[Path], given: str) -> list[Path]:
    if not files:
        raise GptlabError(f"no supported files in {given}; the types read are {', '.join(_all_suffixes())}")
    return files


Read = Callable[[Path, ReadStats, str, str], Iterator[Document]]


def _reader_for(path: Path) -> Read:
    name = path.name.lower()
    for suffixes, read in _READERS:
        if name.endswith(suffixes):
            return read
    raise GptlabError(f"cannot read {path}: the supported types are {', '.join(_all_suffixes())}")


def _is_supported(path: Path) -> bool:
    return path.name.lower().endswith(_all_suffixes())


def _all_suffixes() -> tuple[str, ...]:
    return tuple(suffix for suffixes, _ in _READERS for suffix in suffixes)


def _warc_records(path: Path, kind, stats: ReadStats, *, parse_http: bool) -> Iterator[tuple[object, bytes]]:
    """(record, body) for each record of type `kind`. Every record, of any type, is read whole and checked against its
    Content-Length: FastWARC ends quietly where a file does, so a half-downloaded crawl would otherwise pass as a
    shorter one. FastWARC detects gzip itself."""
    from fastwarc.warc import ArchiveIterator

    records = last_start = 0
    with open(path, "rb") as stream:
        # auto_decode "none": Common Crawl stores bodies already decoded, so decoding is ours to try (_decode_body)
        iterator = iter(ArchiveIterator(stream, parse_http=parse_http, auto_decode="none"))
        while True:
            try:
                record = next(iterator, None)
                body = None if record is None else record.reader.read()
            except OSError as error:  # FastWARC's "Invalid WARC header", a corrupt gzip stream
                where = "is not a WARC file" if not records else f"is unreadable after {records:,} records"
                raise GptlabError(f"{path} {where} ({error}); check that it is a whole WARC file, or leave it out") from None
            if record is None:
                break
            if len(body) < record.content_length:
                raise GptlabError(_truncated(path, records, stats, f"record {records:,} ends after {len(body):,} of its "
                                             f"{record.content_length:,} bytes"))
            records, last_start = records + 1, record.stream_pos
            if record.record_type == kind:
                yield record, body
    if path.stat().st_size and not _ends_whole(path, last_start):
        raise GptlabError(_truncated(path, records, stats, "it ends inside a record's header"))
    if not records:
        stats.skipped_empty += 1


def _truncated(path: Path, records: int, stats: ReadStats, where: str) -> str:
    return (f"{path} is truncated: {where} ({records:,} whole records, {stats.documents:,} documents, before it); "
            "download the file again")


def _ends_whole(path: Path, last_start: int) -> bool:
    """Whether the file ends where a record does. FastWARC stops quietly at a header cut short, so this looks at the
    bytes from the last record's start (its gzip member's, for a file gzipped per record as crawls are): each gzip
    member complete, and the WARC text ending in the blank line that closes every record (ISO 28500)."""
    with open(path, "rb") as handle:
        gzipped = handle.read(2) == b"\x1f\x8b"
        handle.seek(last_start)
        tail = handle.read()
        if gzipped and not tail.startswith(b"\x1f\x8b"):  # one gzip member for the whole file: from its start
            handle.seek(0)
            tail = handle.read()
    if not gzipped:
        return tail.endswith(b"\r\n\r\n")
    text = b""
    while tail:
        inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
        try:
            text = inflater.decompress(tail)
        except zlib.error:
            return False
        if not inflater.eof:
            return False
        tail = inflater.unused_data
    return text.endswith(b"\r\n\r\n")


def _read_warc(path: Path, stats: ReadStats, text_field: str, id_field: str) -> Iterator[Document]:
    """HTML bodies of the HTTP 200 responses; the rest counted as skipped."""
    from fastwarc.warc import WarcRecordType

    for number, (record, body) in enumerate(_warc_records(path, WarcRecordType.response, stats, parse_http=True)):
        if not record.is_http:
            stats.skipped_not_html += 1
            continue
        if record.http_headers.status_code != 200:
            stats.skipped_status += 1
            continue
        content_type = (record.http_content_type or "").lower()
        if content_type not in HTML_TYPES:
            stats.skipped_not_html += 1
            continue
        body = _decode_body(body, record.http_headers.get("Content-Encoding"))
        metadata = {"html": body, "url": record.headers.get("WARC-Target-URI"), "date": record.headers.get("WARC-Date"),
                    "content_type": content_type, "charset": record.http_charset, "warc_record_id": record.record_id}
        yield Document(id=f"{path.name}/{number}", text="", metadata=metadata)


def _decode_body(body: bytes, content_encoding: str | None) -> bytes:
    """A gzip or deflate body decompressed. Crawlers that store bodies already decoded (Common Crawl) may keep the
    original header, so a body that does not decompress is taken as it is."""
    if (content_encoding or "").strip().lower() not in ("gzip", "x-gzip", "deflate"):
        return body
    try:
        return zlib.decompress(body, zlib.MAX_WBITS | 32)  # +32: gzip or zlib header, detected
    except zlib.error:
        try:
            return zlib.decompress(body, -zlib.MAX_WBITS)  # raw deflate, which some servers send for "deflate"
        except zlib.error:
            return body


def _read_wet(path: Path, stats: ReadStats, text_field: str, id_field: str) -> Iterator[Document]:
    """The text of each conversion record, decoded as UTF-8 (what Common Crawl writes)."""
    from fastwarc.warc import WarcRecordType

    for number, (record, body) in enumerate(_warc_records(path, WarcRecordType.conversion, stats, parse_http=False)):
        text = body.decode("utf-8", errors="replace")
        metadata = {"url": record.headers.get("WARC-Target-URI"), "date": record.headers.get("WARC-Date"),
                    "warc_record_id": record.record_id}
        yield Document(id=f"{path.name}/{number}", text=text, metadata=metadata)


def _read_html(path: Path, stats: ReadStats, text_field: str, id_field: str) -> Iterator[Document]:
    data = _text_bytes(path, stats)
    if data is not None:
        yield Document(id=str(path), text="", metadata={"html": data})


def _read_text(path: Path, stats: ReadStats, text_field: str, id_field: str) -> Iterator[Document]:
    data = _text_bytes(path, stats)
    if data is not None:
        yield Document(id=str(path), text=data.decode("utf-8", errors="replace"))


def _text_bytes(path: Path, stats: ReadStats) -> bytes | None:
    """The file's bytes, or None (counted) where it is empty or binary: a NUL byte in the first 8 KiB, the test git
    and grep use, since no text encoding curate reads (UTF-8, windows-1252, ...) writes one."""
    data = path.read_bytes()
    if not data.strip():
        stats.skipped_empty += 1
        return None
    if b"\0" in data[:8192]:
        stats.skipped_binary += 1
        return None
    return data


def _read_jsonl(path: Path, stats: ReadStats, text_field: str, id_field: str) -> Iterator[Document]:
    """One JSON object a line; blank lines are passed over. Lines are read as bytes so bad UTF-8 names its line."""
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    blank = True
    with opener(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            blank = False
            try:
                record = json.loads(line)
            except ValueError as error:
                raise GptlabError(f"{path} line {number} is not JSON ({error}); a JSONL file holds one JSON object a line") from None
            if not isinstance(record, dict):
                raise GptlabError(f"{path} line {number} is a JSON {type(record).__name__}, not an object with a {text_field!r} field")
            yield _document_from_record(record, path, f"line {number}", f"{path.name}/{number}", text_field, id_field)
    stats.skipped_empty += blank


def _read_parquet(path: Path, stats: ReadStats, text_field: str, id_field: str) -> Iterator[Document]:
    import pyarrow
    import pyarrow.parquet as parquet

    try:
        table = parquet.ParquetFile(path)
    except pyarrow.ArrowException as error:
        raise GptlabError(f"{path} is not a readable Parquet file: {error}") from None
    columns = table.schema_arrow.names
    if text_field not in columns:
        raise GptlabError(f"{path} has no column {text_field!r} (columns: {', '.join(columns)}); "
                          f"pass the column that holds the text with --text-field NAME")
    number = 0
    for batch in table.iter_batches(batch_size=PARQUET_BATCH_ROWS):
        for row in batch.to_pylist():
            yield _document_from_record(row, path, f"row {number}", f"{path.name}/{number}", text_field, id_field)
            number += 1
    stats.skipped_empty += not number


def _document_from_record(record: dict, path: Path, where: str, default_id: str, text_field: str, id_field: str) -> Document:
    """A JSONL object or Parquet row as a Document: the text field, the id field or the position, the rest metadata."""
    if text_field not in record:
        strings = [key for key, value in record.items() if isinstance(value, str)]
        hint = f"--text-field {max(strings, key=lambda key: len(record[key]))}" if strings else "--text-field NAME"
        raise GptlabError(f"{path} {where} has no field {text_field!r} (fields: {', '.join(map(str, record))}); "
                          f"pass the field that holds the text, e.g. {hint}")
    text = record[text_field]
    if not isinstance(text, str):
        raise GptlabError(f"{path} {where}: field {text_field!r} is {type(text).__name__} {str(text)[:40]!r}, not a string; "
                          f"pass the field that holds the text with --text-field NAME")
    identifier = record.get(id_field)
    metadata = {key: _plain(value) for key, value in record.items() if key not in (text_field, id_field)}
    return Document(id=default_id if identifier is None else str(identifier), text=text, metadata=metadata)


def _plain(value):
    """Parquet values JSON cannot hold (timestamps, dates, decimals) as strings, so every stage can write metadata."""
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    return value


# order does not matter: no type's suffix ends with another type's (.warc.wet.gz ends in .wet.gz, not in .warc.gz)
_READERS: tuple[tuple[tuple[str, ...], Read], ...] = (
    ((".warc", ".warc.gz"), _read_warc),
    ((".warc.wet.gz", ".wet", ".wet.gz"), _read_wet),
    ((".html", ".htm"), _read_html),
    ((".jsonl", ".jsonl.gz", ".json.gz"), _read_jsonl),
    ((".parquet",), _read_parquet),
    ((".txt",), _read_text),
)
