"""HellaSwag (Zellers et al., 2019): pick the right ending of a short scene, out of four.

The data is the official validation file, `hellaswag_val.jsonl` (10,042
examples), a JSON object per line; the fields used here:

    {"ctx": "A man is sitting on a roof. he", "endings": ["is using wrap ...", "...", "...", "..."], "label": 3, ...}

(also present: ind, activity_label, ctx_a, ctx_b, source_id, split, split_type).
As in build-nanogpt, the context is `ctx` as it stands and each ending is
scored as " " + ending. lm-eval also cleans the text up (drops "[title]"-style
markers, capitalises ctx_b), so its numbers differ slightly.

The file comes from `path` if given, else the gptlab cache
(`gptlab.runtime.cache_dir("hellaswag")`), where it is downloaded from the
original repository on first use (checked to parse, then written atomically).
Offline, with no copy, the error says where to put one.

Not here: scoring and accuracy (gptlab.eval.tasks.base, gptlab.eval.scoring).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from gptlab.eval.tasks.base import Example, MultipleChoiceTask
from gptlab.runtime import GptlabError, atomic_write_bytes, cache_dir

URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
FILE_NAME = "hellaswag_val.jsonl"
DOWNLOAD_TIMEOUT = 60  # seconds without data before giving up


class HellaSwag(MultipleChoiceTask):
    """The HellaSwag validation set, from `path` or the gptlab cache (downloaded if missing)."""

    name = "hellaswag"

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path is not None else None

    def size(self) -> int | None:
        """The examples in the file: its non-empty lines (None until the file is there)."""
        path = self.path if self.path is not None else hellaswag_file()
        if not path.is_file():
            return None
        with open(path, "rb") as lines:
            return sum(1 for line in lines if line.strip())

    def examples(self) -> Iterator[Example]:
        return read_hellaswag(self.path if self.path is not None else hellaswag_file())


def hellaswag_file(directory: str | os.PathLike | None = None) -> Path:
    """The cached validation file, downloaded on first use."""
    path = Path(directory or cache_dir("hellaswag")) / FILE_NAME
    if not path.is_file():
        download_hellaswag(path)
    return path


def download_hellaswag(path: str | os.PathLike, url: str = URL) -> Path:
    """Fetch the validation file into `path`; only a file whose every line parses is written."""
    path = Path(path)
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT) as response:
            data = response.read()
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise GptlabError(
            f"could not download HellaSwag from {url} ({reason}); offline, put {FILE_NAME} from that address "
            f"at {path}, or pass its path (--hellaswag-path FILE)"
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise GptlabError(f"the download from {url} is not UTF-8 text; nothing was written") from None
    for _ in parse_hellaswag(text.splitlines(), source=url):
        pass
    atomic_write_bytes(path, data)
    return path


def read_hellaswag(path: str | os.PathLike) -> Iterator[Example]:
    """The examples of a HellaSwag jsonl file, in file order."""
    path = Path(path)
    if not path.is_file():
        raise GptlabError(f"no HellaSwag file at {path}: download {URL} there, or omit the path to use the cache")
    with path.open(encoding="utf-8") as lines:
        yield from parse_hellaswag(lines, source=str(path))


def parse_hellaswag(lines, source: str) -> Iterator[Example]:
    """An Example per non-blank line; a malformed line raises with `source:line number`."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise GptlabError(f"{source}:{number}: not valid JSON ({error.msg} at column {error.colno})") from None
        yield _example(record, f"{source}:{number}")


def _example(record, where: str) -> Example:
    if not isinstance(record, dict):
        raise GptlabError(f"{where}: expected a JSON object with ctx, endings and label")
    missing = [field for field in ("ctx", "endings", "label") if field not in record]
    if missing:
        raise GptlabError(f"{where}: missing field(s) {', '.join(missing)}")
    context, endings, label = record["ctx"], record["endings"], record["label"]
    if not isinstance(context, str) or not context:
        raise GptlabError(f"{where}: ctx must be a non-empty string")
    if not isinstance(endings, list) or not endings or not all(isinstance(ending, str) for ending in endings):
        raise GptlabError(f"{where}: endings must be a non-empty list of strings")
    if isinstance(label, str) and label.isdigit():  # some copies store the label as text
        label = int(label)
    if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(endings):
        raise GptlabError(f"{where}: label {record['label']!r} is not an index into the {len(endings)} endings")
    return Example(context, [" " + ending for ending in endings], label)
