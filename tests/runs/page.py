"""The report page read back with html.parser: the reference for what a browser would show."""

from html.parser import HTMLParser


class Page(HTMLParser):
    """Tables by the heading above them, <pre> texts, every tag's attributes, all text."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.tables: dict[str, list[list[str]]] = {}
        self.pres: list[str] = []
        self.text: list[str] = []
        self._heading = self._open = None
        self._buffer: list[str] = []
        self._row: list[str] | None = None
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag in ("h1", "h2", "h3", "td", "th", "pre"):
            self._open, self._buffer = tag, []
        elif tag == "table":
            self.tables[self._heading] = []
        elif tag == "tr":
            self._row = []

    def handle_data(self, data):
        self.text.append(data)
        if self._open:
            self._buffer.append(data)

    def handle_endtag(self, tag):
        if tag != self._open:
            if tag == "tr":
                self.tables[self._heading].append(self._row)
            return
        text = "".join(self._buffer)
        if tag in ("h1", "h2", "h3"):
            self._heading = text
        elif tag == "pre":
            self.pres.append(text)
        else:
            self._row.append(text)
        self._open = None
