"""Finding a tiktoken rank file that no offline package ships (o200k_base): the user's folder, tiktoken's cache, a download.

Looked for in this order:
  1. $GPTLAB_TOKENIZER_FILES/<name>.tiktoken (the user's own copy, taken as it is);
  2. tiktoken's cache, so a file tiktoken already fetched is reused: $TIKTOKEN_CACHE_DIR, else $DATA_GYM_CACHE_DIR,
     else <tmp>/data-gym-cache, the file named by the sha1 of its URL (as tiktoken.load.read_file_cached names it);
  3. the URL itself (only when `download=True`), checked against the published sha256 and written atomically
     into that cache, as tiktoken does.

A cached or downloaded file whose sha256 differs is never used. Not here: parsing the file (gptlab.tokenizer.formats).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gptlab.runtime import GptlabError, atomic_path


@dataclass(frozen=True)
class TiktokenFile:
    name: str  # file name, e.g. "o200k_base.tiktoken": what $GPTLAB_TOKENIZER_FILES must hold
    url: str  # where tiktoken downloads it from; its sha1 names the cached copy
    sha256: str  # the published hash (tiktoken_ext.openai_public): a cached or downloaded copy must match it


O200K_BASE = TiktokenFile(
    name="o200k_base.tiktoken",
    url="https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
    sha256="446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
)


def cache_dir() -> Path | None:
    """tiktoken's cache folder; None when $TIKTOKEN_CACHE_DIR is set empty (tiktoken then caches nothing)."""
    for variable in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if variable in os.environ:
            return Path(os.environ[variable]) if os.environ[variable] else None
    return Path(tempfile.gettempdir()) / "data-gym-cache"


def cached_path(file: TiktokenFile) -> Path | None:
    """Where tiktoken caches `file`: <cache>/<sha1 of its URL>."""
    folder = cache_dir()
    return None if folder is None else folder / hashlib.sha1(file.url.encode()).hexdigest()


def _matches(path: Path, sha256: str) -> bool:
    return path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == sha256


def find_tiktoken_file(file: TiktokenFile, *, download: bool = True) -> Path | None:
    """The file's local path, downloading it into tiktoken's cache if allowed; None if absent and not downloaded."""
    override = os.environ.get("GPTLAB_TOKENIZER_FILES")
    if override and (Path(override) / file.name).is_file():
        return Path(override) / file.name
    cached = cached_path(file)
    if cached is not None and _matches(cached, file.sha256):
        return cached
    if not download:
        return None
    return _download(file, cached)


def _download(file: TiktokenFile, cached: Path | None) -> Path:
    how = f"put {file.name} in a folder named by $GPTLAB_TOKENIZER_FILES (download it from {file.url})"
    try:
        with urllib.request.urlopen(file.url, timeout=60) as response:
            data = response.read()
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", None) or error
        raise GptlabError(f"could not download {file.name} ({reason}); {how}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != file.sha256:
        raise GptlabError(f"the downloaded {file.name} has sha256 {digest}, expected {file.sha256}; not used. {how}")
    if cached is None:  # caching switched off: keep the file in a private temporary folder for this process
        cached = Path(tempfile.mkdtemp(prefix="gptlab-tiktoken-")) / file.name
    cached.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(cached) as temporary:
        Path(temporary).write_bytes(data)
    return cached
