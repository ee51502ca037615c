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
what was read and what was skipped (non-HTML and non-200 WARC responses), which the curation report sums over files.
Not here: HTML to text (gptlab.curate.extract), filtering (the stages), running the stages (gptlab.curate.pipeline).
"""

from __future__ import annotations

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


class DocumentReader(Iterator[Document]):
    """The documents of one input (a file or a directory), counting into `stats` as they are read.

    The input's type is checked when the reader is made; the file is opened on the first `next`.
    """

    def __init__(self, path: str | os.PathLike, *, text_field: str = "text", id_field: str = "id") -> None:
        self.path = Path(path)
        self.stats = ReadStats()
        readers = [(file, _reader_for(file)) for file in expand_inputs([self.path])]
        self._documents = (document for file, read in readers for document in read(file, self.stats, text_field, id_field))

    def __next__(self) -> Document:
        document = next(self._documents)
        self.stats.documents += 1
        return document


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


def _read_warc(path: Path, stats: ReadStats, text_field: str, id_field: str) -> Iterator[Document]:
    """HTML bodies of the HTTP 200 responses; the rest counted as skipped. FastWARC detects gzip itself."""
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    with open(path, "rb") as stream:
        # auto_decode "none": Common Crawl stores bodies already decoded, so decoding is ours to try (_decode_body)
        records = ArchiveIterator(stream, record_types=WarcRecordType.response, parse_http=True, auto_decode="none")
        for number, record in enumerate(records):
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
            body = _decode_body(record.reader.read(), record.http_headers.get("Content-Encoding"))
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
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    with open(path, "rb") as stream:
        for number, record in enumerate(ArchiveIterator(stream, record_types=WarcRecordType.conversion, parse_http=False)):
            text = record.reader.read().decode("utf-8", errors="replace")
            metadata = {"url": record.headers.get("WARC-Target-URI"), "date": record.headers.get("WARC-Date"),
                        "warc_record_id": record.record_id}
            yield Document(id=f"{path.name}/{number}", text=text, metadata=metadata)


def _read_html(path: Path, stats: ReadStats, text_field: str, id_field: str) -> Iterator[Document]:
    yield Document(id=str(path), text="", metadata={"html": path.read_bytes()})


def _read_text(path: Path, stats: ReadStats, text_field: str, id_field: str) -> Iterator[Document]:
    yield Document(id=str(path), text=path.read_bytes().decode("utf-8", errors="replace"))


def _read_jsonl(path: Path, stats: ReadStats, text_field: str, id_field: str) -> Iterator[Document]:
    """One JSON object a line; blank lines are passed over. Lines are read as bytes so bad UTF-8 names its line."""
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as error:
                raise GptlabError(f"{path} line {number} is not JSON ({error}); a JSONL file holds one JSON object a line") from None
            if not isinstance(record, dict):
                raise GptlabError(f"{path} line {number} is a JSON {type(record).__name__}, not an object with a {text_field!r} field")
            yield _document_from_record(record, path, f"line {number}", f"{path.name}/{number}", text_field, id_field)


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
