"""`gptlab data curate`: inputs through the per-document stages in parallel, then corpus-wide deduplication, into shards.

    phase 1  each input file, in a worker process: read -> extract -> language -> gopher -> repetition -> quality
             -> fastText classifiers -> PII, into OUT/work/filtered_NNNNN.jsonl and its counts (.stats.json)
    phase 2  over every filtered file in input order: exact document dedup, MinHash near-duplicates, exact line dedup,
             into OUT/shards/shard_NNNNN.jsonl (or .parquet): {"id", "text", metadata...}, what
             `gptlab data prepare OUT/shards` reads
    report   OUT/report.json (per stage: documents and bytes in and out, drop reasons, examples) and OUT/report.txt

Resumable: a file's phase-1 output is written atomically with its counts, so a rerun after a kill skips the files
done; phase 2 is deterministic and reruns whole. OUT/work is removed once the report is written; a rerun of a
finished curation only reprints its report. The folder is claimed as a run (gptlab.runtime.rundir): the same
inputs (recorded relative to the folder, so a project moved whole resumes) and config resume, others are refused.
Each input is read up to its first document before the claim, so garbage, empty and binary inputs leave nothing
behind; one found bad later (a truncated crawl) keeps the inputs filtered before it, for the rerun. Not here: the stages themselves (the other gptlab.curate modules).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from gptlab.curate.config import CurateConfig, build_dedup, build_stages
from gptlab.curate.document import Document, StageStats
from gptlab.curate.readers import expand_inputs, read_documents
from gptlab.runtime import GptlabError, atomic_write, atomic_write_text, read_json
from gptlab.runtime.processes import default_workers, worker_pool
from gptlab.runtime.rundir import claim_run_folder, read_marker

WORK = "work"
SHARDS = "shards"
CURATE_FILES = (SHARDS, "report.json", "report.txt", WORK)


def curate(inputs: list[str], out: str | os.PathLike, config: CurateConfig, *, workers: int | None = None, force: bool = False,
           log: Callable[[str], None] = print) -> dict:
    """Curate `inputs` into `out`; returns the report. Refuses a folder holding anything else, and inputs that are
    not what their names say (not a WARC, empty, binary), before any work. `workers` None: one per core."""
    if workers is not None and workers < 1:
        raise GptlabError(f"--workers {workers}: give at least 1 process (or leave it out for one per core)")
    files = expand_inputs(inputs)
    out = Path(out)
    build_stages(config)  # a bad config (a missing classifier file, ...) fails here, before the folder is claimed
    for path in files:
        probe(path, config)
    record = {"inputs": recorded_inputs(files, out), "config": dataclasses.asdict(config)}
    folder = claim_run_folder(out, command="data curate", config=record, ours=CURATE_FILES, force=force, free=["workers"])
    if folder.status == "resume" and (out / "report.json").is_file() and not (out / WORK).exists():
        log(f"{out} holds this curation, finished: its report follows (--force starts over)")
        return read_json(out / "report.json")
    (out / WORK).mkdir(exist_ok=True)
    done = [index for index in range(len(files)) if _stats_path(out, index).is_file()]
    if folder.status == "resume" and done:
        log(f"resuming {out}: {len(done)} of {len(files)} inputs filtered before")
    labels = input_labels(files)
    todo = [(index, str(path), labels[index], out, config) for index, path in enumerate(files) if index not in done]
    workers = min(workers or default_workers(), max(1, len(todo)))
    if todo:
        log(f"phase 1: {len(todo)} inputs through {', '.join(stage.name for stage in build_stages(config))} ({workers} worker{'s' if workers != 1 else ''})")
        try:
            _run_phase_one(todo, workers, log)
        except GptlabError as error:  # an input found bad only once read through (truncated, no documents)
            raise GptlabError(_after_failure(folder, out, len(files), error)) from None
    per_file = [read_json(_stats_path(out, index)) for index in range(len(files))]
    log("phase 2: deduplication over the whole corpus")
    dedup_stats, shards = _run_phase_two(out, len(files), config)
    report = _report(files, per_file, dedup_stats, shards)
    atomic_write_text(out / "report.json", json.dumps(report, indent=1) + "\n")
    atomic_write_text(out / "report.txt", summary(report) + "\n")
    shutil.rmtree(out / WORK)  # a copy of the filtered corpus, needed only to resume
    return report


def probe(path: Path, config: CurateConfig) -> None:
    """Read `path` up to its first document, so an input that is not what its name says (garbage, empty, binary, no
    documents at all) is refused before the folder is claimed; one cut short later is found when it is read through."""
    reader = read_documents(path, text_field=config.text_field, id_field=config.id_field)
    next(reader, None)  # raises, naming the file, where it gives no document
    reader.close()


def recorded_inputs(files: list[Path], out: Path) -> list[str]:
    """The inputs as the folder records them: relative (below); a folder made before inputs were recorded relative
    holds them absolute, and these same files, named so, resume it rather than read as other settings."""
    marker = read_marker(Path(out)) or {}
    earlier = (marker.get("config") or {}).get("inputs")
    if earlier == [str(path.absolute()) for path in files]:
        return earlier
    return relative_inputs(files, out)


def relative_inputs(files: list[Path], out: Path) -> list[str]:
    """The inputs as recorded in the run folder: relative to it, so a project moved whole (crawl and output
    together), or run from another folder, resumes; absolute only where no relative path exists (another drive)."""
    paths = []
    for path in files:
        try:
            paths.append(Path(os.path.relpath(path.absolute(), out.absolute())).as_posix())
        except ValueError:
            paths.append(str(path.absolute()))
    return paths


def _after_failure(folder, out: Path, count: int, error: GptlabError) -> str:
    """A bad input met in phase 1: a new curation with nothing filtered yet leaves nothing behind; otherwise the
    inputs filtered so far stay for the rerun, and the message says so."""
    done = sum(_stats_path(out, index).is_file() for index in range(count))
    if folder.status == "new" and not done:
        folder.undo()
        return str(error)
    return f"{error}. The {done} inputs filtered so far stay in {out}: once it is fixed, the same command resumes"


def _stats_path(out: Path, index: int) -> Path:
    return out / WORK / f"filtered_{index:05d}.stats.json"


def _filtered_path(out: Path, index: int) -> Path:
    return out / WORK / f"filtered_{index:05d}.jsonl"


def _run_phase_one(todo: list[tuple], workers: int, log: Callable[[str], None]) -> None:
    if workers == 1:
        for job in todo:
            log(_filter_file(job))
        return
    with worker_pool(workers) as pool:  # workers leave Ctrl-C to this process, which ends them
        for line in pool.imap_unordered(_filter_file, todo):
            log(line)


def _filter_file(job: tuple) -> str:
    """One input through the per-document stages: its documents, then its counts, each written atomically."""
    index, path, label, out, config = job
    stages = build_stages(config)
    reader = read_documents(path, text_field=config.text_field, id_field=config.id_field)
    documents: Iterator[Document] = relabel(reader, Path(path).name, label)
    for stage in stages:
        documents = stage.run(documents)
    kept = 0
    with atomic_write(_filtered_path(out, index)) as handle:
        for document in documents:
            handle.write(json.dumps(_record(document), ensure_ascii=False) + "\n")
            kept += 1
    stats = {"input": path, "read": _read_counts(reader), "stages": [stage.stats.as_dict() for stage in stages]}
    atomic_write_text(_stats_path(out, index), json.dumps(stats) + "\n")
    return f"  {Path(path).name}: {kept:,} documents kept"


def input_labels(files: list[Path]) -> list[str]:
    """How each input names its documents: its file name, or its path below the inputs' common folder where two
    inputs share a name (part-0.warc.gz in two crawls), so document ids stay unique."""
    names = [path.name for path in files]
    if len(set(names)) == len(names):
        return names
    common = Path(os.path.commonpath([str(path.absolute().parent) for path in files]))
    return [str(path.absolute().relative_to(common)) if names.count(path.name) > 1 else path.name for path in files]


def relabel(documents, name: str, label: str) -> Iterator[Document]:
    """Ids that start with the file name ("part-0.warc.gz/17") start with its label instead."""
    for document in documents:
        if label != name and document.id.startswith(name + "/"):
            document.id = label + document.id[len(name):]
        yield document


def _read_counts(reader) -> dict:
    counts = getattr(reader, "stats", None)
    return dataclasses.asdict(counts) if dataclasses.is_dataclass(counts) else dict(counts or {})


def _record(document: Document) -> dict:
    metadata = {key: value for key, value in document.metadata.items() if not isinstance(value, bytes)}
    return {"id": document.id, "text": document.text, "metadata": metadata}


def _filtered_documents(out: Path, count: int) -> Callable[[], Iterator[Document]]:
    """Every phase-1 document in input order, as a callable giving a fresh pass (dedup reads the corpus twice)."""
    def documents() -> Iterator[Document]:
        for index in range(count):
            with open(_filtered_path(out, index), encoding="utf-8") as handle:
                for line in handle:
                    record = json.loads(line)
                    yield Document(id=record["id"], text=record["text"], metadata=record["metadata"])
    return documents


def _run_phase_two(out: Path, count: int, config: CurateConfig) -> tuple[list[StageStats], list[str]]:
    """The dedup passes over the whole corpus, then the output shards; stale shards of an earlier run removed."""
    documents = _filtered_documents(out, count)
    passes = build_dedup(config)
    for dedup in passes:
        documents = dedup.apply(documents)
    (out / SHARDS).mkdir(exist_ok=True)
    shards = _write_shards(out / SHARDS, documents(), config)
    for stale in sorted((out / SHARDS).glob("shard_*")):
        if stale.name not in shards:
            stale.unlink()
    return [dedup.stats for dedup in passes], shards


def _write_shards(out: Path, documents: Iterator[Document], config: CurateConfig) -> list[str]:
    names, batch = [], []
    for document in documents:
        batch.append(_output_row(document))
        if len(batch) == config.output.shard_documents:
            names.append(_write_shard(out, len(names), batch, config.output.format))
            batch = []
    if batch or not names:
        names.append(_write_shard(out, len(names), batch, config.output.format))
    return names


def _output_row(document: Document) -> dict:
    return {"id": document.id, "text": document.text, **{key: value for key, value in document.metadata.items()
                                                         if key not in ("id", "text") and not isinstance(value, bytes)}}


def _write_shard(out: Path, number: int, rows: list[dict], kind: str) -> str:
    name = f"shard_{number:05d}.{kind}"
    if kind == "jsonl":
        with atomic_write(out / name) as handle:
            handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from gptlab.runtime import atomic_path

        table = pa.Table.from_pylist(rows) if rows else pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())})
        with atomic_path(out / name) as path:
            pq.write_table(table, path)
    return name


def _report(files: list[Path], per_file: list[dict], dedup: list[StageStats], shards: list[str]) -> dict:
    """Per-file stage counts merged, the read counts summed, and the dedup passes' counts, in pipeline order."""
    stages: dict[str, StageStats] = {}
    read: dict[str, int] = {}
    for record in per_file:
        for key, value in record["read"].items():
            read[key] = read.get(key, 0) + value if isinstance(value, int) else value
        for stage in record["stages"]:
            stats = StageStats.from_dict(stage)
            stages.setdefault(stats.name, StageStats(stats.name)).merge(stats)
    ordered = [*stages.values(), *dedup]  # never empty: CurateConfig refuses a skip of every stage
    return {"format": "gptlab-curate-report", "version": 1, "inputs": [str(path) for path in files], "read": read,
            "stages": [stats.as_dict() for stats in ordered], "shards": shards,
            "documents_out": ordered[-1].documents_out, "bytes_out": ordered[-1].bytes_out}


def summary(report: dict) -> str:
    """The report in a few lines: each stage's documents and bytes in and out, and its most common drop reasons."""
    lines = [f"{len(report['inputs'])} inputs; read: " + ", ".join(f"{key} {value:,}" for key, value in report["read"].items()
                                                                  if isinstance(value, int)),
             f"{'stage':<14} {'docs in':>9} {'docs out':>9} {'kept':>6} {'MB in':>8} {'MB out':>8}  top reasons / changes"]
    for stage in report["stages"]:
        kept = stage["documents_out"] / stage["documents_in"] if stage["documents_in"] else 1.0
        reasons = sorted(stage["reasons"].items(), key=lambda item: -item[1])[:3] + sorted(stage["changes"].items(), key=lambda item: -item[1])[:2]
        lines.append(f"{stage['name']:<14} {stage['documents_in']:>9,} {stage['documents_out']:>9,} {kept:>6.1%} "
                     f"{stage['bytes_in'] / 1e6:>8.2f} {stage['bytes_out'] / 1e6:>8.2f}  "
                     + "; ".join(f"{reason} {count:,}" for reason, count in reasons))
    lines.append(f"out: {report['documents_out']:,} documents, {report['bytes_out'] / 1e6:.2f} MB in {len(report['shards'])} shards")
    return "\n".join(lines)
