"""A small synthetic crawl to try `gptlab data curate` offline: a WARC file with what each stage exists for.

    python -m gptlab.curate.example runs/example.warc.gz     (then: gptlab data curate runs/example.warc.gz --out DIR)

Pages are passages of the built-in Shakespeare corpus inside a site's boilerplate (menu, cookie banner and footer
lines that repeat on every page: exact line dedup removes them), with, among them: mirrors of other pages with a
few words changed (MinHash), exact copies, pages in French, German and Spanish (language ID), keyword spam and
menu-only stubs (the Gopher and repetition rules), contact lines with e-mail addresses, phone numbers and IP
addresses (PII), pages in windows-1252 without a declared charset (encoding detection), and image and 404
responses (skipped by the reader). It is synthetic: it shows the stages at work, not web statistics.
"""

from __future__ import annotations

import gzip
import random
import sys
import uuid
from pathlib import Path

from gptlab.data.corpus import shakespeare_documents
from gptlab.runtime import atomic_write_bytes

BOILERPLATE_TOP = ["Home | Plays | Sonnets | About us | Contact", "We use cookies to improve your experience. Accept all cookies"]
BOILERPLATE_BOTTOM = ["Copyright 2026 The Globe Online. All rights reserved.", "Privacy policy | Terms of use | Sitemap"]
FOREIGN = {
    "fr": "Le vieux théâtre de la ville ouvre ses portes chaque soir d'été, et les comédiens répètent sous les arbres du "
          "jardin pendant que les enfants courent entre les bancs. On y joue des pièces anciennes et nouvelles, traduites "
          "avec soin, et le public revient chaque année pour écouter les mêmes vers avec un plaisir toujours renouvelé. ",
    "de": "Das alte Theater am Fluss wurde im letzten Jahrhundert mehrmals umgebaut, doch die Bühne ist noch immer aus "
          "demselben Holz wie am ersten Abend. Die Schauspieler proben an langen Nachmittagen, und wenn es regnet, sitzen "
          "die Zuschauer dicht gedrängt unter dem Dach und hören aufmerksam jedem Wort zu, das gesprochen wird. ",
    "es": "El pequeño teatro del puerto abre sus puertas cada noche de verano, y los actores ensayan en el patio mientras "
          "los vecinos se asoman a las ventanas. Allí se representan obras antiguas y modernas, y el público vuelve cada año "
          "para escuchar los mismos versos con una alegría que nunca parece agotarse del todo. ",
}
SPAM = "cheap tickets best price buy now discount theatre tickets free shipping"


def _passages(rng: random.Random, count: int) -> list[str]:
    """`count` passages of 150 to 600 words from the corpus's works, as paragraphs."""
    works = [document.split() for document in shakespeare_documents()]
    passages = []
    for _ in range(count):
        words = rng.choice(works)
        length = rng.randint(150, 600)
        start = rng.randrange(0, max(1, len(words) - length))
        chunk = words[start:start + length]
        passages.append("\n".join(" ".join(chunk[i:i + 60]) for i in range(0, len(chunk), 60)))
    return passages


def _contact(rng: random.Random, page: int) -> str:
    """A contact line that stays unique to its page once masked (else line dedup would remove every copy)."""
    number = f"({rng.randint(200, 989)}) {rng.randint(200, 999)}-{rng.randint(1000, 9999)}"
    return (f"Questions about passage {page}? Write to box.office{rng.randint(1, 99)}@globe-online.example or call "
            f"{number}; our server is at 192.168.{rng.randint(0, 255)}.{rng.randint(1, 254)}.")


def _mirror(text: str, rng: random.Random) -> str:
    """A copy with about 2% of its words replaced: a near duplicate well above a Jaccard of 0.8."""
    words = text.split(" ")
    for _ in range(max(1, len(words) // 50)):
        words[rng.randrange(len(words))] = rng.choice(["indeed", "verily", "forsooth", "marry"])
    return " ".join(words)


def _page(title: str, body: str) -> str:
    paragraphs = "".join(f"<p>{line}</p>\n" for line in body.split("\n"))
    top = "".join(f"<div class='nav'>{line}</div>\n" for line in BOILERPLATE_TOP)
    bottom = "".join(f"<div class='footer'>{line}</div>\n" for line in BOILERPLATE_BOTTOM)
    return f"<html><head><title>{title}</title></head><body>\n{top}<h1>{title}</h1>\n<article>\n{paragraphs}</article>\n{bottom}</body></html>\n"


def example_pages(pages: int = 200, seed: int = 0) -> list[tuple[str, str, bytes, str]]:
    """(url, content type, body, charset or "") for each response record, in crawl order."""
    rng = random.Random(seed)
    records, bodies = [], []
    for number, passage in enumerate(_passages(rng, pages)):
        kind = rng.random()
        if kind < 0.08 and bodies:
            body = _mirror(rng.choice(bodies), rng)  # near duplicate of an earlier page
        elif kind < 0.12 and bodies:
            body = rng.choice(bodies)  # exact copy
        elif kind < 0.18:
            language = rng.choice(sorted(FOREIGN))
            body = _page(f"Théâtre {number}", FOREIGN[language] * 2)
        elif kind < 0.22:
            body = _page(f"Tickets {number}", "\n".join([SPAM] * 12))
        elif kind < 0.25:
            body = _page(f"Menu {number}", "Read more")
        else:
            extra = "\n" + _contact(rng, number) if rng.random() < 0.3 else ""
            body = _page(f"Passage {number}", passage + extra)
        bodies.append(body)
        encoded, charset = body.encode("utf-8"), "utf-8"
        if rng.random() < 0.1:
            encoded, charset = body.encode("cp1252", errors="replace"), ""  # no charset declared
        records.append((f"https://globe-online.example/page/{number}", "text/html", encoded, charset))
        if rng.random() < 0.05:
            records.append((f"https://globe-online.example/img/{number}.png", "image/png", b"\x89PNG\r\n\x1a\n" + bytes(64), ""))
    return records


def _record(url: str, content_type: str, body: bytes, charset: str, status: str = "200 OK") -> bytes:
    header = f"; charset={charset}" if charset else ""
    http = f"HTTP/1.1 {status}\r\nContent-Type: {content_type}{header}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    warc = (f"WARC/1.0\r\nWARC-Type: response\r\nWARC-Record-ID: <urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, url)}>\r\n"
            f"WARC-Date: 2026-11-24T00:00:00Z\r\nWARC-Target-URI: {url}\r\nContent-Type: application/http; msgtype=response\r\n"
            f"Content-Length: {len(http)}\r\n\r\n").encode()
    return gzip.compress(warc + http + b"\r\n\r\n", mtime=0)  # one gzip member per record, as crawlers write them


def write_example_warc(path: str | Path, pages: int = 200, seed: int = 0) -> Path:
    """Write the example crawl as a .warc.gz (atomically); returns its path."""
    records = [_record(*record) for record in example_pages(pages, seed)]
    records.append(_record("https://globe-online.example/missing", "text/html", b"<html>Not found</html>", "", "404 Not Found"))
    atomic_write_bytes(path, b"".join(records))
    return Path(path)


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "example.warc.gz"
    print(f"wrote {write_example_warc(target)}")
