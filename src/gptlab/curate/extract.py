"""HTML to plain text with Resiliparse: decoding the bytes, then extracting the visible text (optionally the main
content only, dropping navigation, headers, footers and other boilerplate).

    html_to_text(b"<p>Caf\\xe9</p>", charset="iso-8859-1")  ->  "Café"

Bytes are decoded with the charset the HTTP header declared when it is a known encoding under which they decode
cleanly; otherwise the encoding is detected from the bytes (a page's own <meta charset> is often wrong, so it is not
trusted). `Extract` is the curation stage: documents the readers left with raw HTML (metadata["html"]) get its text.
Not here: reading WARC and HTML files (gptlab.curate.readers), judging the text (the filters).
"""

from __future__ import annotations

from dataclasses import dataclass

from gptlab.curate.document import Document, Transform
from gptlab.runtime import GptlabError


@dataclass(frozen=True, kw_only=True)
class ExtractConfig:
    main_content: bool = False  # keep only the main content: drop navigation, sidebars, footers (Resiliparse's heuristics)
    alt_texts: bool = True  # keep images' alt texts
    links: bool = False  # keep link targets after the link text

    def __post_init__(self) -> None:
        for name in ("main_content", "alt_texts", "links"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise GptlabError(f"extract.{name} must be true or false, got {value!r}")


def decode_html(html: bytes | str, charset: str | None = None) -> tuple[str, str]:
    """The page as a string, and how it was decoded: "declared" (the charset given), "detected" or "text" (already
    a string). A declared charset is used only when it names a known encoding and the bytes decode under it strictly:
    a page served as UTF-8 whose bytes are windows-1252 is detected instead of losing its accents.
    """
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding, map_encoding_to_html5

    if isinstance(html, str):
        return html, "text"
    if charset:
        # the WHATWG mapping browsers use: "iso-8859-1" and "ascii" mean windows-1252, "gb2312" means gbk
        encoding = map_encoding_to_html5(charset.strip().strip("\"'"), fallback_utf8=False)
        if encoding:
            try:
                return html.decode(encoding).removeprefix("\ufeff"), "declared"
            except (UnicodeDecodeError, LookupError):
                pass
    return bytes_to_str(html, detect_encoding(html) or "utf-8"), "detected"


def html_to_text(html: bytes | str, *, charset: str | None = None, main_content: bool = False,
                 alt_texts: bool = True, links: bool = False) -> str:
    """The visible text of a page, paragraphs on their own lines (see `decode_html` for how bytes are decoded)."""
    from resiliparse.extract.html2text import extract_plain_text

    text, _ = decode_html(html, charset)
    return extract_plain_text(text, main_content=main_content, alt_texts=alt_texts, links=links)


class Extract(Transform):
    """Documents with raw HTML (metadata["html"]) and no text yet get the page's text; the HTML is then removed from
    the metadata so it is not carried through the later stages. Documents that already have text pass unchanged.

    Counts in stats.changes: "extracted", "encoding declared", "encoding detected". A page with no text left is
    dropped as "empty" (Transform).
    """

    name = "extract"

    def __init__(self, config: ExtractConfig | None = None) -> None:
        super().__init__()
        self.config = config or ExtractConfig()

    def transform(self, document: Document) -> Document:
        html = document.metadata.get("html")
        if html is None or document.text:
            return document
        from resiliparse.extract.html2text import extract_plain_text

        page, how = decode_html(html, document.metadata.get("charset"))
        text = extract_plain_text(page, main_content=self.config.main_content, alt_texts=self.config.alt_texts,
                                  links=self.config.links)
        self.stats.changes["extracted"] += 1
        if how != "text":
            self.stats.changes[f"encoding {how}"] += 1
        metadata = {key: value for key, value in document.metadata.items() if key != "html"}
        return Document(id=document.id, text=text, metadata=metadata)
