"""Extraction: pages written here, checked against Resiliparse run directly on the correctly decoded string."""

import gzip
import io

import pytest
from fastwarc.warc import WarcRecord, WarcRecordType
from resiliparse.extract.html2text import extract_plain_text

from gptlab.curate.document import Document
from gptlab.curate.extract import Extract, ExtractConfig, decode_html, html_to_text
from gptlab.curate.readers import read_documents
from gptlab.runtime import GptlabError

ACCENTED = "<html><head><title>Menu</title></head><body><h1>Café Müller</h1><p>Crème brûlée, über naïve — 5 €.</p></body></html>"
WRONG_META = ACCENTED.replace("<head>", '<head><meta charset="utf-8">')
BOILERPLATE = """<html><body>
<nav><ul><li><a href="/">Home</a></li><li><a href="/about">About us</a></li><li><a href="/shop">Shop</a></li></ul></nav>
<header><div class="menu">Sign in | Register | Cart (0)</div></header>
<main><article><h1>How to store fresh bread</h1>
<p>Fresh bread keeps best at room temperature in a paper bag or a cloth, away from direct sunlight and heat.</p>
<p>The refrigerator dries bread out quickly, because starch crystallises faster at cold temperatures than warm ones.</p>
<p>For longer storage, slice the loaf and freeze it; toast the slices straight from the freezer when you need them.</p>
</article></main>
<footer><p>Copyright 2024 Bakery Example. All rights reserved. Privacy policy. Terms of use.</p></footer>
</body></html>"""


def test_html_to_text_equals_resiliparse_on_a_declared_utf8_page():
    assert html_to_text(ACCENTED.encode("utf-8"), charset="utf-8") == extract_plain_text(ACCENTED)


def test_html_to_text_detects_windows_1252_without_a_charset():
    text = html_to_text(ACCENTED.encode("cp1252"))
    assert text == extract_plain_text(ACCENTED)
    assert "Café Müller" in text and "über naïve — 5 €" in text


def test_html_to_text_ignores_a_wrong_meta_charset():
    page, how = decode_html(WRONG_META.encode("cp1252"))
    assert (page, how) == (WRONG_META, "detected")
    assert html_to_text(WRONG_META.encode("cp1252")) == extract_plain_text(WRONG_META)


def test_decode_html_uses_a_declared_charset_only_when_the_bytes_decode_under_it():
    assert decode_html(ACCENTED.encode("cp1252"), "iso-8859-1") == (ACCENTED, "declared")  # WHATWG: latin-1 is cp1252
    assert decode_html(ACCENTED.encode("cp1252"), "utf-8") == (ACCENTED, "detected")  # invalid UTF-8: detected instead
    assert decode_html(ACCENTED.encode("utf-8"), "no-such-charset") == (ACCENTED, "detected")
    assert decode_html("\ufeff<p>x</p>".encode("utf-8"), "utf-8") == ("<p>x</p>", "declared")  # byte order mark dropped
    assert decode_html(ACCENTED) == (ACCENTED, "text")


def test_html_to_text_main_content_drops_navigation_and_footer():
    everything = html_to_text(BOILERPLATE)
    main = html_to_text(BOILERPLATE, main_content=True)
    assert main == extract_plain_text(BOILERPLATE, main_content=True)
    assert "About us" in everything and "All rights reserved" in everything
    assert "About us" not in main and "All rights reserved" not in main and "Sign in" not in main
    assert "starch crystallises faster" in main


def test_extract_fills_text_removes_html_and_counts():
    stage = Extract()
    documents = [Document(id="a", text="", metadata={"html": ACCENTED.encode("cp1252"), "url": "http://a"}),
                 Document(id="b", text="", metadata={"html": ACCENTED.encode("utf-8"), "charset": "utf-8"}),
                 Document(id="c", text="already plain text", metadata={"url": "http://c"}),
                 Document(id="d", text="", metadata={"html": b"<html><body><script>x()</script></body></html>"})]
    out = list(stage.run(documents))
    assert [document.id for document in out] == ["a", "b", "c"]
    assert out[0].text == out[1].text == extract_plain_text(ACCENTED)
    assert out[0].metadata == {"url": "http://a"} and out[1].metadata == {"charset": "utf-8"}
    assert out[2] is documents[2]
    assert stage.stats.changes == {"extracted": 3, "encoding detected": 2, "encoding declared": 1}
    assert stage.stats.reasons == {"empty": 1}


def test_extract_config_main_content_and_bad_values():
    (document,) = Extract(ExtractConfig(main_content=True)).run([Document(id="x", text="", metadata={"html": BOILERPLATE})])
    assert document.text == extract_plain_text(BOILERPLATE, main_content=True)
    with pytest.raises(GptlabError, match="extract.main_content must be true or false, got 'yes'"):
        ExtractConfig(main_content="yes")


def warc_response(uri: str, content_type: str, body: bytes) -> bytes:
    record = WarcRecord()
    record.init_headers(WarcRecordType.response)
    record.headers["WARC-Target-URI"] = uri
    record.headers["Content-Type"] = "application/http; msgtype=response"
    record.set_bytes_content(f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n\r\n".encode() + body)
    buffer = io.BytesIO()
    record.write(buffer)
    return gzip.compress(buffer.getvalue())


def test_extract_warc_records_to_the_expected_text(tmp_path):
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(warc_response("http://example.com/menu", "text/html; charset=windows-1252", ACCENTED.encode("cp1252"))
                     + warc_response("http://example.com/wrong", "text/html; charset=utf-8", WRONG_META.encode("cp1252"))
                     + warc_response("http://example.com/bread", "text/html", BOILERPLATE.encode("utf-8")))
    stage = Extract(ExtractConfig(main_content=True))
    documents = list(stage.run(read_documents(path)))
    assert [document.metadata["url"] for document in documents] == ["http://example.com/menu", "http://example.com/wrong",
                                                                   "http://example.com/bread"]
    assert [document.text for document in documents] == [extract_plain_text(page, main_content=True)
                                                         for page in (ACCENTED, WRONG_META, BOILERPLATE)]
    assert "Crème brûlée" in documents[0].text and "Crème brûlée" in documents[1].text
    assert all("html" not in document.metadata for document in documents)
    assert stage.stats.changes == {"extracted": 3, "encoding declared": 1, "encoding detected": 2}
