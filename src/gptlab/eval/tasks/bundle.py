"""DCLM's eval bundle: the 22 few-shot tasks of CORE, as nanochat's base_eval downloads them.

The bundle is a folder (`eval_bundle.zip` unpacks to `eval_bundle/`):

    core.yaml            icl_tasks: a list of {label, dataset_uri, num_fewshot: [10], icl_task_type, continuation_delimiter?}
    eval_data/**.jsonl   each task's records, at eval_data/<dataset_uri>, one JSON object per line
    eval_meta_data.csv   a row per task: "Eval Task" (the label) and "Random baseline" (in percent: 25.0 is chance 0.25)

icl_task_type is multiple_choice, schema or language_modeling, whose records are the shared shapes of
gptlab.eval.tasks.native. A task whose num_fewshot lists several counts is run at the first, as nanochat does.
Its few-shot examples are drawn from the task's own file, leaving out the example being asked.

`bundle_folder(download=True)` fetches the zip into the gptlab cache: it is downloaded to a temporary name,
unpacked into a temporary folder, checked to read as a bundle, then renamed into place, so an interrupted
download never leaves a half bundle where a later run would trust it.

Not here: scoring (gptlab.eval.tasks.base), the CORE aggregate (gptlab.eval.card).
"""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from gptlab.runtime import GptlabError, cache_dir

BUNDLE_URL = "https://karpathy-public.s3.us-west-2.amazonaws.com/eval_bundle.zip"  # nanochat's scripts/base_eval.py
BUNDLE_NAME = "eval_bundle"
KINDS = ("multiple_choice", "schema", "language_modeling")
DOWNLOAD_TIMEOUT = 60  # seconds without data before giving up
COPY_BLOCK = 1 << 20


@dataclass(frozen=True)
class BundleTask:
    """One CORE task as the bundle declares it; `random_baseline` is chance accuracy as a fraction."""

    label: str
    kind: str
    dataset_uri: str
    path: Path
    num_fewshot: int
    continuation_delimiter: str
    random_baseline: float


def read_bundle(folder: str | os.PathLike) -> list[BundleTask]:
    """The tasks of a bundle folder, in core.yaml's order, each with its data file and random baseline."""
    import yaml

    folder = Path(folder)
    config, meta = folder / "core.yaml", folder / "eval_meta_data.csv"
    for needed in (config, meta):
        if not needed.is_file():
            raise GptlabError(f"{folder} is not a DCLM eval bundle: no {needed.name} (download one with bundle_folder(download=True), from {BUNDLE_URL})")
    try:
        declared = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as error:
        raise GptlabError(f"{config} is not valid YAML: {str(error).splitlines()[0]}") from None
    entries = declared.get("icl_tasks") if isinstance(declared, dict) else None
    if not isinstance(entries, list) or not entries:
        raise GptlabError(f"{config} lists no tasks: expected 'icl_tasks:' with a list of {{label, dataset_uri, num_fewshot, icl_task_type}}")
    baselines = _read_baselines(meta)
    return [_bundle_task(folder, entry, number, baselines) for number, entry in enumerate(entries, start=1)]


def _read_baselines(meta: Path) -> dict[str, float]:
    """{label: chance as a fraction} from eval_meta_data.csv, whose baselines are percentages."""
    with open(meta, encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    if rows and not {"Eval Task", "Random baseline"} <= set(rows[0]):
        raise GptlabError(f"{meta}: expected the columns 'Eval Task' and 'Random baseline', found: {', '.join(rows[0])}")
    baselines = {}
    for line, row in enumerate(rows, start=2):
        try:
            baselines[row["Eval Task"].strip()] = float(row["Random baseline"]) / 100
        except (TypeError, ValueError):
            raise GptlabError(f"{meta}:{line}: random baseline {row['Random baseline']!r} is not a number (a percentage)") from None
    return baselines


def _bundle_task(folder: Path, entry: object, number: int, baselines: dict[str, float]) -> BundleTask:
    where = f"{folder / 'core.yaml'}, task {number}"
    if not isinstance(entry, dict) or not all(key in entry for key in ("label", "dataset_uri", "num_fewshot", "icl_task_type")):
        raise GptlabError(f"{where}: each task needs label, dataset_uri, num_fewshot and icl_task_type, got {entry!r:.100}")
    label, kind = str(entry["label"]), entry["icl_task_type"]
    if kind not in KINDS:
        raise GptlabError(f"{where} ({label}): icl_task_type {kind!r} is not one of {', '.join(KINDS)}")
    shots = entry["num_fewshot"]
    shots = shots[0] if isinstance(shots, list) and shots else shots
    if isinstance(shots, bool) or not isinstance(shots, int) or shots < 0:
        raise GptlabError(f"{where} ({label}): num_fewshot must be a count such as [10], got {entry['num_fewshot']!r}")
    if label not in baselines:
        raise GptlabError(f"{folder / 'eval_meta_data.csv'} has no random baseline for {label!r} (add a row 'Eval Task' = {label})")
    path = folder / "eval_data" / str(entry["dataset_uri"])
    if not path.is_file():
        raise GptlabError(f"{where} ({label}): its data file {path} is missing; the bundle is incomplete, download it again")
    delimiter = entry.get("continuation_delimiter", " ")
    return BundleTask(label, kind, str(entry["dataset_uri"]), path, shots, str(delimiter), baselines[label])


def bundle_task(folder: str | os.PathLike, label: str) -> BundleTask:
    """The bundle's task with this label; one line naming the labels it has if none."""
    tasks = read_bundle(folder)
    for task in tasks:
        if task.label == label:
            return task
    raise GptlabError(f"the eval bundle at {folder} has no task {label!r}; it has: {', '.join(task.label for task in tasks)}")


def is_bundle(folder: str | os.PathLike) -> bool:
    return (Path(folder) / "core.yaml").is_file()


def bundle_folder(*, download: bool = False, url: str = BUNDLE_URL) -> Path:
    """The cached bundle (`<gptlab cache>/eval_bundle`), downloaded first when asked; an error saying how when absent."""
    folder = cache_dir() / BUNDLE_NAME
    if is_bundle(folder):
        return folder
    if not download:
        raise GptlabError(f"no DCLM eval bundle at {folder}: download it (--download), or unzip {url} and pass its folder")
    return download_bundle(folder, url)


def download_bundle(folder: str | os.PathLike, url: str = BUNDLE_URL) -> Path:
    """Fetch and unpack the bundle zip into `folder` (which must not exist yet), through temporary names only."""
    folder = Path(folder)
    if folder.exists():
        raise GptlabError(f"{folder} already exists and is not an eval bundle; move it away before downloading one there")
    folder.parent.mkdir(parents=True, exist_ok=True)
    handle, archive = tempfile.mkstemp(prefix=f".{BUNDLE_NAME}.", suffix=".zip.part", dir=folder.parent)
    os.close(handle)
    unpacked = Path(tempfile.mkdtemp(prefix=f".{BUNDLE_NAME}.", suffix=".part", dir=folder.parent))
    try:
        _fetch(url, Path(archive), folder)
        try:
            with zipfile.ZipFile(archive) as bundle:
                bundle.extractall(unpacked)  # zipfile drops absolute paths and ".." from member names
        except zipfile.BadZipFile:
            raise GptlabError(f"the download from {url} is not a zip file; nothing was kept") from None
        root = unpacked / BUNDLE_NAME if is_bundle(unpacked / BUNDLE_NAME) else unpacked
        read_bundle(root)  # refuse a zip that is not a bundle before it takes the cache's name
        os.rename(root, folder)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(archive)
        shutil.rmtree(unpacked, ignore_errors=True)
    return folder


def _fetch(url: str, archive: Path, folder: Path) -> None:
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT) as response, open(archive, "wb") as out:
            shutil.copyfileobj(response, out, COPY_BLOCK)
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise GptlabError(
            f"could not download the DCLM eval bundle from {url} ({reason}); offline, unzip {BUNDLE_NAME}.zip from that address "
            f"elsewhere and put its {BUNDLE_NAME}/ folder at {folder}, or pass the folder as the task source"
        ) from None
