"""Evaluation data: a task's records and few-shot pool, from the hub, a file, a folder, or DCLM's eval bundle.

    load_task_records("arc_easy")                                  the hub dataset at its pinned revision (native.DATASETS)
    load_task_records("arc_easy", source="hf:/data/arc")           any hf: source gptlab.data.sources reads (hub, local folder)
    load_task_records("arc_easy", source="arc_easy.jsonl")         a .jsonl or .parquet file, shared shape or native columns
    load_task_records("mmlu", source="/data/mmlu")                 MMLU's CSV folder: dev/, val/, test/ of SUBJECT_{split}.csv
    load_task_records("hellaswag_zeroshot", source="eval_bundle/") a DCLM eval bundle's task, by its label
    -> TaskData(records=[{"query": ..., "choices": [...], "gold": 1, "id": ...}, ...], fewshot_pool=[...], provenance={...})

Each row is read in the shared shape when it has the shared fields, else as the task's native columns
(gptlab.eval.tasks.native); a row that is neither is refused with where it is (file:line, or the split's
row number) and the fields that were expected. The few-shot pool is the task's few-shot split (train, or
MMLU's dev) where the source has one; a single file or a bundle task has no other split, so its pool is its
own records (provenance["fewshot_split"] == "records") and the example being asked must be left out of its
shots, as DCLM does. The provenance (source, revision, split, a local file's sha256, counts) is plain JSON,
saved with the results so that a number names exactly the data behind it.

Not here: the row conversions (gptlab.eval.tasks.native), the bundle's format and download (gptlab.eval.tasks.bundle),
reading hub datasets (gptlab.data.sources).
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gptlab.data.sources import HuggingFaceSource, SourceOptions
from gptlab.eval.tasks.bundle import BundleTask, bundle_task, is_bundle, read_bundle
from gptlab.eval.tasks.native import DATASETS, DatasetSpec, convert_mmlu, dataset_spec, to_record
from gptlab.runtime import GptlabError

# our task names -> the labels DCLM's core.yaml gives the same task
BUNDLE_LABELS = {"openbookqa": "openbook_qa", "lambada": "lambada_openai"}
MMLU_FOLDERS = {"test": "test", "validation": "val", "val": "val", "dev": "dev"}  # split asked -> the CSV folder holding it
MMLU_COLUMNS = 6  # question, A, B, C, D, answer letter
RECORDS_ARE_POOL = "records"  # provenance["fewshot_split"] when the pool is the records themselves
HASH_BLOCK = 1 << 20

__all__ = ["BundleTask", "TaskData", "load_task_records", "read_bundle"]


@dataclass(frozen=True)
class TaskData:
    """A task's evaluation records, the pool its few-shot examples come from, and where both came from."""

    records: list[dict]
    fewshot_pool: list[dict]
    provenance: dict


def load_task_records(task: str, *, source: str | os.PathLike | None = None, split: str | None = None) -> TaskData:
    """The records of `task` from `source` (None: the pinned hub dataset); `split` overrides the evaluation split."""
    if source is not None and not isinstance(source, str | os.PathLike):
        raise GptlabError(f"a task source is a path or hf:DATASET, got {source!r}")
    if source is not None and Path(source).is_dir() and is_bundle(source):
        return _from_bundle(task, Path(source))
    spec = dataset_spec(task)
    if source is None or str(source).startswith("hf:"):
        return _from_hub(spec, str(source) if source is not None else spec.hub_spec, split)
    path = Path(source)
    if path.is_dir():
        if spec.name == "mmlu" and any((path / folder).is_dir() for folder in set(MMLU_FOLDERS.values())):
            return _from_mmlu_csv(spec, path, split)
        return _from_hub(spec, f"hf:{path}", split)  # a dataset folder (split files, or save_to_disk's), read as hf:/path reads it
    if path.is_file():
        return _from_file(spec, path, split)
    raise GptlabError(f"{spec.name} source not found: {source} (give a .jsonl or .parquet file, a folder, or hf:DATASET)")


# ---------------------------------------------------------------- the hub, or a local dataset folder


def _from_hub(spec: DatasetSpec, hub: str, split: str | None) -> TaskData:
    split = split or spec.split
    source = HuggingFaceSource(hub, SourceOptions(split=split))
    records = _convert(source.records(), spec, f"{hub} {split} row", start=0)
    if not records:
        raise GptlabError(f"{hub} split {split!r} holds no records for {spec.name}")
    pool, pool_split = [], None
    if spec.fewshot_split and spec.fewshot_split != split:
        pool_source = HuggingFaceSource(hub, SourceOptions(split=spec.fewshot_split))
        try:
            pool = _convert(pool_source.records(), spec, f"{hub} {spec.fewshot_split} row", start=0)
            pool_split = spec.fewshot_split
        except GptlabError as error:
            # a dataset without the few-shot split (a local copy of the test split alone) evaluates zero-shot;
            # any other failure (the hub, a bad row) is the user's to see
            if not any(words in str(error) for words in ("Bad split", "Unknown split", "has no split")):
                raise
    described = source.describe()
    provenance = {"task": spec.name, "kind": "huggingface", "source": hub, "dataset": described["name"], "config": described["config"],
                  "revision": described.get("revision"), "split": split, "fewshot_split": pool_split}
    return TaskData(records, pool, provenance | {"records": len(records), "fewshot_records": len(pool)})


def _convert(rows: Iterable[object], spec: DatasetSpec, where: str, start: int) -> list[dict]:
    return [to_record(row, spec.kind, spec, f"{where} {number}", number) for number, row in enumerate(rows, start=start)]


# ---------------------------------------------------------------- one local file


def _from_file(spec: DatasetSpec, path: Path, split: str | None) -> TaskData:
    if path.suffix == ".jsonl":
        records = [to_record(row, spec.kind, spec, f"{path}:{line}", line) for line, row in read_jsonl(path)]
    elif path.suffix == ".parquet":
        records = _convert(read_parquet(path), spec, f"{path} row", start=1)
    else:
        raise GptlabError(f"{path}: unsupported file type {path.suffix!r} for {spec.name} (use .jsonl or .parquet, or a folder)")
    if not records:
        raise GptlabError(f"{path} holds no records for {spec.name}")
    provenance = {"task": spec.name, "kind": "file", "source": str(path), "sha256": file_sha256(path), "split": split,
                  "fewshot_split": RECORDS_ARE_POOL, "records": len(records), "fewshot_records": len(records)}
    return TaskData(records, records, provenance)


def read_jsonl(path: Path) -> list[tuple[int, object]]:
    """(line number, parsed object) for each non-blank line; a line that is not JSON is refused as file:line."""
    rows = []
    with open(path, encoding="utf-8-sig") as lines:  # -sig: editors on Windows start UTF-8 files with a byte-order mark
        try:
            for number, line in enumerate(lines, start=1):
                if line.strip():
                    try:
                        rows.append((number, json.loads(line)))
                    except json.JSONDecodeError as error:
                        raise GptlabError(f"{path}:{number}: not valid JSON ({error.msg} at column {error.colno})") from None
        except UnicodeDecodeError:
            raise GptlabError(f"{path} is not UTF-8 text; convert it first (e.g. iconv -t UTF-8)") from None
    return rows


def read_parquet(path: Path) -> list[dict]:
    """Every row of a parquet file as a dict (nested columns become dicts and lists)."""
    import pyarrow.parquet as parquet

    try:
        return parquet.read_table(path).to_pylist()
    except Exception as error:  # pyarrow raises several types for a damaged file
        raise GptlabError(f"{path} is not a readable parquet file: {str(error).splitlines()[0] if str(error) else type(error).__name__}") from None


def file_sha256(*paths: Path) -> str:
    """The sha256 of one file's bytes; of several, over each file's name and bytes in the given order."""
    digest = hashlib.sha256()
    for path in paths:
        if len(paths) > 1:
            digest.update(path.name.encode("utf-8") + b"\0")
        with open(path, "rb") as handle:
            while block := handle.read(HASH_BLOCK):
                digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------- MMLU's CSV folder


def _from_mmlu_csv(spec: DatasetSpec, folder: Path, split: str | None) -> TaskData:
    split = split or spec.split
    if split not in MMLU_FOLDERS:
        raise GptlabError(f"MMLU's CSV folder has the splits {', '.join(MMLU_FOLDERS)}; got split {split!r}")
    records, files = _read_mmlu_split(folder, MMLU_FOLDERS[split])
    pool, pool_files = ([], []) if MMLU_FOLDERS[split] == "dev" or not (folder / "dev").is_dir() else _read_mmlu_split(folder, "dev")
    provenance = {"task": spec.name, "kind": "mmlu_csv", "source": str(folder), "split": split, "fewshot_split": "dev" if pool else None,
                  "sha256": file_sha256(*files, *pool_files), "files": len(files) + len(pool_files), "records": len(records),
                  "fewshot_records": len(pool)}
    return TaskData(records, pool, provenance)


def _read_mmlu_split(folder: Path, name: str) -> tuple[list[dict], list[Path]]:
    """The records of every SUBJECT_{name}.csv in folder/name (no header: question, A, B, C, D, answer letter), by subject."""
    files = sorted((folder / name).glob(f"*_{name}.csv"))
    if not files:
        raise GptlabError(f"{folder / name} holds no *_{name}.csv files (MMLU's layout: {name}/SUBJECT_{name}.csv)")
    records = []
    for path in files:
        subject = path.name[: -len(f"_{name}.csv")]
        with open(path, encoding="utf-8", newline="") as handle:
            reader = csv.reader(handle)
            for row in reader:
                where = f"{path}:{reader.line_num}"
                if len(row) != MMLU_COLUMNS:
                    raise GptlabError(f"{where}: expected {MMLU_COLUMNS} columns (question, A, B, C, D, answer letter), found {len(row)}")
                native = {"question": row[0], "choices": row[1:5], "answer": row[5], "subject": subject, "id": f"mmlu/{subject}/{name}/{reader.line_num}"}
                records.append(convert_mmlu(native, where))
    if not records:
        raise GptlabError(f"{folder / name} holds no MMLU questions")
    return records, files


# ---------------------------------------------------------------- DCLM's eval bundle


def _from_bundle(task: str, folder: Path) -> TaskData:
    """A bundle task by its label (or our name for it: openbookqa is openbook_qa); records in the bundle's shared shape."""
    spec = bundle_task(folder, BUNDLE_LABELS.get(task, task))
    native = DATASETS.get(task) if task in DATASETS and DATASETS[task].kind == spec.kind else None
    records = [to_record(row, spec.kind, native, f"{spec.path}:{line}", line) for line, row in read_jsonl(spec.path)]
    if not records:
        raise GptlabError(f"{spec.path} holds no records for {spec.label}")
    provenance = {"task": spec.label, "kind": "dclm_bundle", "source": str(folder), "dataset_uri": spec.dataset_uri, "sha256": file_sha256(spec.path),
                  "icl_task_type": spec.kind, "num_fewshot": spec.num_fewshot, "continuation_delimiter": spec.continuation_delimiter,
                  "random_baseline": spec.random_baseline, "split": None, "fewshot_split": RECORDS_ARE_POOL, "records": len(records),
                  "fewshot_records": len(records)}
    return TaskData(records, records, provenance)
