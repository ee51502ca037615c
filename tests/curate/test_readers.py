"""Readers: every input type made here with its own writer (FastWARC, json, pyarrow), read back as Documents."""

import datetime
import gzip
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastwarc.warc import WarcRecord, WarcRecordType

from gptlab.curate.readers import ReadStats, expand_inputs, read_documents
from gptlab.runtime import GptlabError

DATE = "2024-05-01T12:00:00Z"
PAGE_A = b"<html><body><p>First page.</p></body></html>"
PAGE_B = b"<html><body><p>Second page.</p></body></html>"


def record_bytes(kind: WarcRecordType, uri: str, content: bytes, content_type: str) -> bytes:
    """One WARC record written by FastWARC's own writer."""
    record = WarcRecord()
    record.init_headers(kind)
    record.headers["WARC-Target-URI"] = uri
    record.headers["WARC-Date"] = DATE
    record.headers["Content-Type"] = content_type
    record.set_bytes_content(content)
    buffer = io.BytesIO()
    record.write(buffer)
    return buffer.getvalue()


def http_response(uri: str, headers: str, body: bytes) -> bytes:
    return record_bytes(WarcRecordType.response, uri, f"{headers}\r\n\r\n".encode() + body, "application/http; msgtype=response")


def write_records(path, records: list[bytes], compress: bool):
    """Records to a file; compressed as Common Crawl does, one gzip member per record."""
    path.write_bytes(b"".join(gzip.compress(record) for record in records) if compress else b"".join(records))
    return path


def crawl_records() -> list[bytes]:
    """Five responses (two HTML pages, an image, a redirect, a DNS lookup that is not HTTP) and a request."""
    return [
        http_response("http://example.com/a", "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=UTF-8", PAGE_A),
        record_bytes(WarcRecordType.request, "http://example.com/b", b"GET /b HTTP/1.1\r\nHost: example.com\r\n\r\n",
                     "application/http; msgtype=request"),
        http_response("http://example.com/b", "HTTP/1.1 200 OK\r\nContent-Type: application/xhtml+xml", PAGE_B),
        http_response("http://example.com/logo.png", "HTTP/1.1 200 OK\r\nContent-Type: image/png", b"\x89PNG\r\n\x1a\n"),
        http_response("http://example.com/old", "HTTP/1.1 301 Moved Permanently\r\nLocation: /a\r\nContent-Type: text/html", b""),
        record_bytes(WarcRecordType.response, "dns:example.com", b"example.com. 60 IN A 192.0.2.1\r\n", "text/dns"),
    ]


def write_jsonl(path, lines: list[str]):
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


@pytest.mark.parametrize("name,compress", [("crawl.warc", False), ("crawl.warc.gz", True)])
def test_read_documents_warc_keeps_html_responses_and_counts_the_rest(tmp_path, name, compress):
    path = write_records(tmp_path / name, crawl_records(), compress)
    reader = read_documents(path)
    documents = list(reader)
    assert [document.id for document in documents] == [f"{name}/0", f"{name}/1"]  # response records, counted from 0
    assert [document.text for document in documents] == ["", ""]
    first, second = (document.metadata for document in documents)
    assert first["html"] == PAGE_A and second["html"] == PAGE_B
    assert (first["url"], first["date"], first["content_type"], first["charset"]) == ("http://example.com/a", DATE, "text/html", "utf-8")
    assert (second["url"], second["content_type"], second["charset"]) == ("http://example.com/b", "application/xhtml+xml", None)
    assert first["warc_record_id"].startswith("<urn:uuid:")
    assert reader.stats == ReadStats(documents=2, skipped_not_html=2, skipped_status=1)


def test_read_documents_warc_decompresses_a_gzip_body_and_keeps_one_stored_decoded(tmp_path):
    headers = "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: gzip"
    records = [http_response("http://example.com/z", headers, gzip.compress(PAGE_A)),
               http_response("http://example.com/y", headers, PAGE_B)]  # Common Crawl keeps the header, decodes the body
    documents = list(read_documents(write_records(tmp_path / "encoded.warc.gz", records, compress=True)))
    assert [document.metadata["html"] for document in documents] == [PAGE_A, PAGE_B]


def test_read_documents_wet_gives_the_conversion_text_with_its_url(tmp_path):
    records = [record_bytes(WarcRecordType.warcinfo, "", b"software: test\r\n", "application/warc-fields"),
               record_bytes(WarcRecordType.conversion, "http://example.com/a", "Première page.\nLine two.".encode(), "text/plain"),
               record_bytes(WarcRecordType.conversion, "http://example.com/b", b"Second page.", "text/plain")]
    path = write_records(tmp_path / "crawl.warc.wet.gz", records, compress=True)
    documents = list(read_documents(path))
    assert [(document.id, document.text, document.metadata["url"]) for document in documents] == [
        ("crawl.warc.wet.gz/0", "Première page.\nLine two.", "http://example.com/a"),
        ("crawl.warc.wet.gz/1", "Second page.", "http://example.com/b")]
    assert documents[0].metadata["date"] == DATE


@pytest.mark.parametrize("name", ["data.jsonl", "data.jsonl.gz", "data.json.gz"])
def test_read_documents_jsonl_takes_ids_when_given_and_positions_otherwise(tmp_path, name):
    lines = [json.dumps({"id": "doc-a", "text": "alpha", "url": "http://a"}), "",
             json.dumps({"text": "beta", "score": 0.5}), json.dumps({"id": 7, "text": "gamma"})]
    documents = list(read_documents(write_jsonl(tmp_path / name, lines)))
    assert [(document.id, document.text, document.metadata) for document in documents] == [
        ("doc-a", "alpha", {"url": "http://a"}), (f"{name}/3", "beta", {"score": 0.5}), ("7", "gamma", {})]


def test_read_documents_jsonl_custom_fields(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", [json.dumps({"key": "k1", "content": "alpha", "text": "not this"})])
    (document,) = read_documents(path, text_field="content", id_field="key")
    assert (document.id, document.text, document.metadata) == ("k1", "alpha", {"text": "not this"})


def test_read_documents_jsonl_bad_line_names_the_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", [json.dumps({"text": "fine"}), "{not json"])
    with pytest.raises(GptlabError, match=r"data\.jsonl line 2 is not JSON"):
        list(read_documents(path))


def test_read_documents_jsonl_missing_field_suggests_the_flag(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", [json.dumps({"id": "a", "content": "the long text here"})])
    with pytest.raises(GptlabError, match=r"data\.jsonl line 1 has no field 'text' \(fields: id, content\).*--text-field content"):
        list(read_documents(path))


def test_read_documents_jsonl_text_that_is_not_a_string_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", [json.dumps({"text": None})])
    with pytest.raises(GptlabError, match=r"line 1: field 'text' is NoneType"):
        list(read_documents(path))


def write_parquet(path, columns: dict, row_group_size: int = 2):
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def test_read_documents_parquet_custom_text_field_across_row_groups(tmp_path):
    when = datetime.datetime(2024, 5, 1, 12, 0)
    path = write_parquet(tmp_path / "data.parquet", {"body": ["one", "two", "three"], "lang": ["en", "fr", "de"],
                                                     "crawled": [when, when, when]})
    documents = list(read_documents(path, text_field="body"))
    assert [(document.id, document.text) for document in documents] == [
        ("data.parquet/0", "one"), ("data.parquet/1", "two"), ("data.parquet/2", "three")]
    assert documents[1].metadata == {"lang": "fr", "crawled": "2024-05-01T12:00:00"}  # JSON-ready, for the stages' output


def test_read_documents_parquet_takes_the_id_column(tmp_path):
    path = write_parquet(tmp_path / "data.parquet", {"id": ["x", "y"], "text": ["one", "two"]})
    assert [document.id for document in read_documents(path)] == ["x", "y"]


def test_read_documents_parquet_missing_column_lists_the_columns(tmp_path):
    path = write_parquet(tmp_path / "data.parquet", {"body": ["one"], "lang": ["en"]})
    with pytest.raises(GptlabError, match=r"no column 'text' \(columns: body, lang\).*--text-field"):
        read_documents(path).__next__()


def test_read_documents_parquet_null_text_names_the_row(tmp_path):
    path = write_parquet(tmp_path / "data.parquet", {"body": ["one", None]})
    with pytest.raises(GptlabError, match=r"data\.parquet row 1: field 'body' is NoneType"):
        list(read_documents(path, text_field="body"))


def test_read_documents_html_and_text_files_are_one_document_each(tmp_path):
    (tmp_path / "page.html").write_bytes(PAGE_A)
    (tmp_path / "notes.txt").write_text("line one\nline two\n", encoding="utf-8")
    (html,) = read_documents(tmp_path / "page.html")
    (text,) = read_documents(tmp_path / "notes.txt")
    assert (html.id, html.text, html.metadata) == (str(tmp_path / "page.html"), "", {"html": PAGE_A})
    assert (text.id, text.text, text.metadata) == (str(tmp_path / "notes.txt"), "line one\nline two\n", {})


def make_mixed_folder(root):
    """A folder of every kind, plus files a reader must pass over (a README, a hidden folder)."""
    (root / "b").mkdir(parents=True)
    write_records(root / "b" / "crawl.warc.gz", crawl_records(), compress=True)
    write_jsonl(root / "a.jsonl", [json.dumps({"text": "alpha"}), json.dumps({"text": "beta"})])
    write_parquet(root / "c.parquet", {"text": ["gamma"]})
    (root / "d.txt").write_text("delta", encoding="utf-8")
    (root / "README.md").write_text("about this data", encoding="utf-8")
    (root / ".cache").mkdir()
    (root / ".cache" / "old.jsonl").write_text(json.dumps({"text": "hidden"}) + "\n", encoding="utf-8")
    return root


def test_read_documents_directory_reads_every_supported_file_in_sorted_order(tmp_path):
    folder = make_mixed_folder(tmp_path / "mixed")
    reader = read_documents(folder)
    documents = list(reader)
    assert [document.id for document in documents] == ["a.jsonl/1", "a.jsonl/2", "crawl.warc.gz/0", "crawl.warc.gz/1",
                                                       "c.parquet/0", str(folder / "d.txt")]
    assert reader.stats == ReadStats(documents=6, skipped_not_html=2, skipped_status=1)


def test_expand_inputs_sorts_and_deduplicates_files_folders_and_globs(tmp_path):
    folder = make_mixed_folder(tmp_path / "mixed")
    files = expand_inputs([str(folder / "*.txt"), folder / "a.jsonl", folder, str(folder / "**" / "*.warc.gz")])
    assert files == sorted([folder / "a.jsonl", folder / "b" / "crawl.warc.gz", folder / "c.parquet", folder / "d.txt"])
    assert expand_inputs(str(folder / "d.txt")) == [folder / "d.txt"]  # one path, not its characters


def test_expand_inputs_reports_missing_and_unsupported_inputs(tmp_path):
    (tmp_path / "table.csv").write_text("a,b\n", encoding="utf-8")
    with pytest.raises(GptlabError, match="input .*nothing.jsonl does not exist"):
        expand_inputs([tmp_path / "nothing.jsonl"])
    with pytest.raises(GptlabError, match=r"cannot read .*table\.csv: the supported types are \.warc, \.warc\.gz, .*\.parquet, \.txt"):
        expand_inputs([tmp_path / "table.csv"])
    with pytest.raises(GptlabError, match=r"no files match .*\*\.warc"):
        expand_inputs([str(tmp_path / "*.warc")])
    with pytest.raises(GptlabError, match="no supported files in"):
        expand_inputs([tmp_path])
    with pytest.raises(GptlabError, match="no inputs given"):
        expand_inputs([])


def test_read_documents_refuses_an_unsupported_file_when_called(tmp_path):
    (tmp_path / "table.csv").write_text("a,b\n", encoding="utf-8")
    with pytest.raises(GptlabError, match="supported types"):
        read_documents(tmp_path / "table.csv")  # before any iteration, so the pipeline fails before work


# Inputs that are not what their names say, and crawls cut short.

def test_read_documents_refuses_a_file_that_is_not_a_warc_naming_it(tmp_path):
    (tmp_path / "junk.warc.gz").write_bytes(b"hello, this is not a crawl\n" * 10)
    with pytest.raises(GptlabError, match=r"junk.warc.gz is not a WARC file \(Invalid WARC header\)"):
        list(read_documents(tmp_path / "junk.warc.gz"))


@pytest.mark.parametrize("compress", [False, True])
def test_read_documents_refuses_a_crawl_cut_short_at_any_byte_naming_what_was_read(tmp_path, compress):
    """Every cut that loses data is refused: inside a record's body, its header, its gzip member. A cut at a record's
    end cannot be told from a shorter crawl, nor (uncompressed) one in the blank line that closes a record."""
    records = crawl_records()
    whole = write_records(tmp_path / "whole.warc", records, compress).read_bytes()
    ends = set()
    for count in range(1, len(records) + 1):
        end = len(b"".join(gzip.compress(record, mtime=0) if compress else record for record in records[:count]))
        ends.update([end] if compress else range(end - 4, end + 1))
    assert len(list(read_documents(tmp_path / "whole.warc"))) == 2
    near_ends = {end + step for end in ends for step in range(-8, 9)}  # the delicate places, byte by byte
    for cut in sorted(set(range(1, len(whole), 5)) | near_ends):
        if cut in ends or not 0 < cut < len(whole):
            continue
        (tmp_path / "cut.warc").write_bytes(whole[:cut])
        with pytest.raises(GptlabError, match=r"cut.warc (is truncated|is unreadable after|is not a WARC file)"):
            list(read_documents(tmp_path / "cut.warc"))


def test_read_documents_truncation_message_counts_the_records_and_documents_before_it(tmp_path):
    whole = write_records(tmp_path / "crawl.warc.gz", crawl_records(), compress=True).read_bytes()
    (tmp_path / "crawl.warc.gz").write_bytes(whole[:-20])
    with pytest.raises(GptlabError) as error:
        list(read_documents(tmp_path / "crawl.warc.gz"))
    assert str(error.value).startswith(f"{tmp_path / 'crawl.warc.gz'} is truncated: ")
    assert "(5 whole records, 2 documents, before it); download the file again" in str(error.value)


@pytest.mark.parametrize(("name", "content", "reason"), [
    ("page.html", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "1 binary, not text"),
    ("notes.txt", b"PK\x03\x04\x00\x00", "1 binary, not text"),
    ("page.html", b"", "it is empty"),
    ("empty.warc.gz", b"", "it is empty"),
    ("rows.jsonl", b"\n\n", "it is empty"),
])
def test_read_documents_refuses_an_input_with_no_document_giving_the_reasons(tmp_path, name, content, reason):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(GptlabError, match=f"^{tmp_path / name}: no documents \\({reason}\\); "):
        list(read_documents(tmp_path / name))


def test_read_documents_refuses_a_crawl_without_an_html_page_counting_what_it_held(tmp_path):
    records = [record for record in crawl_records() if b"<html>" not in record]
    write_records(tmp_path / "crawl.warc.gz", records, compress=True)
    with pytest.raises(GptlabError, match=r"crawl.warc.gz: no documents \(2 not HTML, 1 HTTP status not 200\)"):
        list(read_documents(tmp_path / "crawl.warc.gz"))


def test_read_documents_directory_counts_a_binary_file_it_skips(tmp_path):
    (tmp_path / "a.html").write_bytes(PAGE_A)
    (tmp_path / "b.html").write_bytes(b"\x00\x01\x02")
    with pytest.raises(GptlabError, match=r"b.html: no documents \(1 binary, not text\)"):
        list(read_documents(tmp_path))
