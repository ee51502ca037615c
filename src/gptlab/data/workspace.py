"""The --out folder of `gptlab data prepare`: which files are prepare's, which job they hold, whether
a finished folder is intact, and undoing a run rejected for bad input.

A prepared folder holds only these (formats: gptlab.data.shards, gptlab.data.prepare):

    manifest.json            written last: the folder is finished when it exists; its "job" says how it was made
    token_bytes.npy          UTF-8 bytes per id, for bits per byte
    tokenizer.json           the tokenizer that made the shards (gptlab's format; tokenizer.model for a SentencePiece
                             tokenizer), so the folder is self-contained
    train_NNNNNN.bin         token shards
    val_NNNNNN.bin
    .prepare/                an unfinished run's work: job.json (its job), token blocks
    .<one of those>.*.tmp    an atomic write cut short by a crash

A job is the source's description, the tokenizer's fingerprint and the
arguments that decide the output; a folder holding another job is refused
unless forced. A finished folder is "already prepared" only once every shard's
header, token count and CRC-32 check out; otherwise prepare rebuilds what is
missing or damaged.

A run rejected for bad input (a GptlabError) deletes what it created: entries
of the folder and of .prepare/ that were not there when it started, and the
folder itself (and parents it made) when left empty. Anything else (Ctrl-C,
kill -9, a full disk) leaves its work for the same command to resume.

Not here: tokenizing and sharding (gptlab.data.prepare).
"""

from __future__ import annotations

import contextlib
import fnmatch
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gptlab.data.shards import MANIFEST_NAME, shard_problem
from gptlab.runtime import GptlabError, read_json

WORK_DIR = ".prepare"
JOB_FILE = "job.json"
TOKEN_BYTES_NAME = "token_bytes.npy"
TOKENIZER_NAME = "tokenizer.json"
TOKENIZER_NAMES = (TOKENIZER_NAME, "tokenizer.model")  # gptlab's byte-level BPE, SentencePiece
_FILES = (MANIFEST_NAME, TOKEN_BYTES_NAME, *TOKENIZER_NAMES, "train_*.bin", "val_*.bin")
# what check_out_dir accepts in --out: prepare's files, its work folder, and leftovers of its atomic writes
OUTPUT_PATTERNS = (*_FILES, WORK_DIR, *(f".{pattern}.*.tmp" for pattern in _FILES))


@dataclass(frozen=True)
class JobState:
    """What the folder holds for this job, and what a forced run must clear first."""

    status: str  # "new", "resume" (this job's unfinished work is there) or "finished"
    remove_work: bool = False  # forced: .prepare/ holds another job's unfinished work
    replaces: bool = False  # forced: the folder holds another job's finished data, removed once this job's input is read
    manifest: dict | None = None  # the finished folder's manifest


def job_state(out: Path, job: dict, force: bool) -> JobState:
    """Compare the folder's job(s) with `job`; refuse another job unless forced. Deletes nothing."""
    work_job = _read_json(out / WORK_DIR / JOB_FILE, out, force)
    manifest = _read_json(out / MANIFEST_NAME, out, force)
    manifest_job = manifest.get("job") if isinstance(manifest, dict) else None
    remove_work = work_job is not None and work_job != job
    if remove_work and not force:
        raise GptlabError(
            f"{out} holds an unfinished prepare made with other arguments; rerun it with its own arguments to "
            "finish it, use another --out, or pass --force to replace it"
        )
    if remove_work:
        work_job = None
    replaces = manifest is not None and manifest_job != job and work_job != job
    if replaces and not force:
        raise GptlabError(
            f"{out} holds prepared data made with other arguments; rerun with the same arguments, "
            "use another --out, or pass --force to replace it"
        )
    if manifest is not None and manifest_job == job:
        return JobState("finished", remove_work, manifest=manifest)
    return JobState("resume" if work_job == job else "new", remove_work, replaces)


def _read_json(path: Path, out: Path, force: bool):
    """The JSON at `path` (None if absent); a damaged file counts as another job's."""
    if not path.is_file():
        return None
    try:
        return read_json(path)
    except GptlabError:
        if force:
            return {"damaged": str(path)}
        raise GptlabError(
            f"{path} is damaged, so what {out} holds cannot be told; pass --force to prepare it again"
        ) from None


def damaged_shards(out: Path, manifest: dict) -> list[str]:
    """What is wrong with a finished folder's shards: missing, damaged (header, size, CRC-32), unlike the manifest."""
    problems = []
    fingerprint = manifest["tokenizer"]["fingerprint"]
    for split in manifest["splits"].values():
        for entry in split["shards"]:
            path = out / entry["file"]
            problem = shard_problem(path, n_tokens=entry["tokens"], n_documents=entry["documents"], fingerprint=fingerprint)
            if problem:
                problems.append(f"{entry['file']} {problem}")
    return problems


def remove_outputs(out: Path, *, keep_work: bool = False) -> None:
    """Delete what prepare writes (shards, manifest, token bytes, the work folder unless kept), nothing else."""
    for path in out.iterdir() if out.is_dir() else ():
        if path.name == WORK_DIR:
            if not keep_work:
                shutil.rmtree(path, ignore_errors=True)
        elif _ours(path.name):
            path.unlink(missing_ok=True)


def remove_leftovers(out: Path) -> None:
    """Delete the work folder and the temporary files of atomic writes a crash cut short."""
    shutil.rmtree(out / WORK_DIR, ignore_errors=True)
    for pattern in _FILES:
        for path in out.glob(f".{pattern}.*.tmp"):
            path.unlink(missing_ok=True)


def _ours(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in OUTPUT_PATTERNS)


@contextlib.contextmanager
def undo_when_rejected(out: Path) -> Iterator[None]:
    """On a GptlabError inside, delete what was created under `out` since entering (and `out`, if made and left empty)."""
    made = [parent for parent in [out, *out.parents] if not parent.exists()]  # deepest first
    work = out / WORK_DIR
    before = set(_entries(out)) | {f"{WORK_DIR}/{name}" for name in _entries(work)}
    work_existed = work.is_dir()
    try:
        yield
    except GptlabError:
        if work.is_dir() and not work_existed:
            shutil.rmtree(work, ignore_errors=True)
        elif work.is_dir():
            for name in _entries(work):
                if f"{WORK_DIR}/{name}" not in before:
                    (work / name).unlink(missing_ok=True)
        for name in _entries(out):
            if name not in before and name != WORK_DIR and _ours(name):
                (out / name).unlink(missing_ok=True)
        for directory in made:
            with contextlib.suppress(OSError):  # not empty: something else is there now; keep it
                directory.rmdir()
        raise


def _entries(directory: Path) -> list[str]:
    return [path.name for path in directory.iterdir()] if directory.is_dir() else []
