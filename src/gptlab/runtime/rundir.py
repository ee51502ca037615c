"""Run folders: a folder belongs to one run.

A command that makes a run (`gptlab run`, `gptlab train`) claims its output
folder with `claim_run_folder`, which writes `gptlab_run.json`:

    {"format": "gptlab-run", "version": 1, "command": "train",
     "config": {...the resolved config...}, "stages": {"tokenizer": {...}, ...}}

Claiming a folder that is new or empty starts a run. A folder with that file,
made by the same command with the same settings (apart from `free` keys such
as logging intervals), is resumed. Settings are compared as the user asked
for them ("asked", recorded beside the config that ran) where the record has
them: a value gptlab derived (a warmup shortened to fit the run) is never
reported as a change the user made. Anything else is refused with one line that
says what is there and what to pass: other settings (`--force` starts over,
clearing that run's own files and nothing else), another command's run (never
replaced, not even with `--force`: pass another `--out`), a folder that is not
a gptlab run (never touched: pass a new or empty `--out`), a file.
Not here: what a run writes (gptlab.pipeline, gptlab.train).
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gptlab.runtime.config import config_changes
from gptlab.runtime.errors import GptlabError
from gptlab.runtime.files import atomic_write_text, describe_entries, read_json

MARKER = "gptlab_run.json"
FORMAT = "gptlab-run"
VERSION = 1


@dataclass
class RunFolder:
    path: Path
    status: str  # "new" or "resume"
    record: dict
    ours: Sequence[str] = ()
    made: tuple[Path, ...] = ()  # folders the claim created (deepest first)

    def undo(self) -> None:
        """A new run refused for bad input before its work began: remove what it made, so the corrected
        command starts cleanly. A resumed run keeps everything."""
        if self.status != "new" or not self.path.is_dir():
            return
        clear_run_files(self.path, self.ours)
        for folder in self.made:
            try:
                folder.rmdir()
            except OSError:  # not empty: something else is there now; keep it
                break

    def stage(self, name: str) -> dict | None:
        """What a finished stage recorded (None if it has not finished in this run)."""
        return self.record.get("stages", {}).get(name)

    def finish_stage(self, name: str, info: dict) -> None:
        self.record.setdefault("stages", {})[name] = info
        _write(self.path, self.record)


def _write(path: Path, record: dict) -> None:
    atomic_write_text(path / MARKER, json.dumps(record, indent=1) + "\n")


def _without(config: dict, free: Iterable[str]) -> dict:
    """A deep copy of a config dict without the dotted `free` keys."""
    copy = json.loads(json.dumps(config))
    for key in free:
        *parents, name = key.split(".")
        target = copy
        for part in parents:
            target = target.get(part, {}) if isinstance(target, dict) else {}
        if isinstance(target, dict):
            target.pop(name, None)
    return copy


def clear_run_files(path: Path, ours: Sequence[str]) -> list[str]:
    """Delete the entries a run makes (the `ours` glob patterns and the marker), nothing else; return their names."""
    removed = []
    for entry in sorted(path.iterdir()):
        if entry.name == MARKER or any(fnmatch.fnmatch(entry.name, pattern) for pattern in ours):
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
            removed.append(entry.name)
    return removed


def _is_legacy(path: Path, entries: list[str], ours: Sequence[str], legacy: Callable[[Path], bool] | None) -> bool:
    owned = all(any(fnmatch.fnmatch(name.rstrip("/"), pattern) for pattern in ours) for name in entries)
    return legacy is not None and owned and legacy(path)


def _refuse(path: Path, out_flag: str, changes: list[str], held: list[str], hints: dict[str, str], resumes: bool = True) -> None:
    """The one line that says why a run folder is not resumed (or, for results that do not resume, not replaced)."""
    what = "a run" if resumes else "results"
    why = (f"{what} with other settings ({', '.join(changes[:4])}{', ...' if len(changes) > 4 else ''})" if changes
           else f"{what} ({describe_entries(held)}) that --no-resume would start over")
    hinted = [hint for key, hint in hints.items() if any(change.startswith(key + " ") for change in changes)]
    raise GptlabError(f"{out_flag} {path} holds {why}; "
                      + ("rerun with the same settings to resume, " if changes and resumes else "")
                      + "".join(hint + ", " for hint in hinted)
                      + ("pass --force to start over (clears that run's files)" if resumes else "pass --force to replace them")
                      + f", or another {out_flag}")


def read_marker(path: Path) -> dict | None:
    marker = path / MARKER
    if not marker.is_file():
        return None
    record = read_json(marker)
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise GptlabError(f"{marker} is not a gptlab run record; remove it or pass another --out")
    if record.get("version") != VERSION:
        raise GptlabError(f"{marker} is run record version {record.get('version')}; this gptlab reads {VERSION}")
    return record


def claim_run_folder(path: str | os.PathLike, *, command: str, config: dict, ours: Sequence[str],
                     free: Iterable[str] = (), force: bool = False, fresh: bool = False,
                     out_flag: str = "--out", legacy: Callable[[Path], bool] | None = None,
                     defaults: dict | None = None, asked: dict | None = None,
                     hints: dict[str, str] | None = None, resumes: bool = True) -> RunFolder:
    """Start or resume the run in `path`, or refuse (see the module docstring). `fresh`: never resume.

    `legacy(path)` recognises a run made before run records existed (all its entries are `ours`):
    it cannot be resumed safely, so it is refused unless `force` clears it. `defaults` (field_defaults of the
    config's class): a field added since the run was saved, left at its default, is no change. `asked`: the
    settings before gptlab derived any, compared instead of `config` when the record holds them too. `hints`
    ({"max_steps": "pass --extend to ..."}): a sentence added to the refusal when that key is among the changes.
    `resumes=False`: the folder holds results that a rerun replaces rather than continues (an evaluation's).
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise GptlabError(f"{out_flag} {path} is a file, not a folder; pass a folder path")
    record = read_marker(path) if path.is_dir() else None
    entries = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir()) if path.is_dir() else []
    new_record = {"format": FORMAT, "version": VERSION, "command": command, "config": config, "stages": {}}
    if asked is not None:
        new_record["asked"] = asked
    if record is None and entries and _is_legacy(path, entries, ours, legacy):
        if not force:
            raise GptlabError(f"{out_flag} {path} holds a `gptlab {command}` run made by an earlier gptlab, without a run record, "
                              f"so it cannot be resumed safely; pass --force to start over (clears that run's files), "
                              f"or another {out_flag}")
        clear_run_files(path, ours)
    elif record is None and entries:
        raise GptlabError(f"{out_flag} {path} is not empty and is not a gptlab run folder (it holds {describe_entries(entries)}); "
                          f"gptlab never deletes what it did not make: pass a new or empty {out_flag}")
    if record is not None:
        held = [name for name in entries if name != MARKER]
        if record.get("command") != command:  # --force replaces this command's own output, never another's
            raise GptlabError(f"{out_flag} {path} holds a `gptlab {record.get('command')}` run, not a `gptlab {command}` one, "
                              f"and --force never replaces another command's folder; pass another {out_flag}")
        if force:
            clear_run_files(path, ours)
        else:
            both = asked is not None and "asked" in record
            before, now = (record["asked"], asked) if both else (record.get("config", {}), config)
            changes = config_changes(_without(before, free), _without(now, free), defaults=defaults)
            if changes or (fresh and held):
                _refuse(path, out_flag, changes, held, hints or {}, resumes)
            record["config"] = config  # the settings free to change are the latest ones
            if asked is not None:
                record["asked"] = asked
            _write(path, record)
            return RunFolder(path, "resume", record, ours)
    made = tuple(folder for folder in [path, *path.absolute().parents] if not folder.exists())
    path.mkdir(parents=True, exist_ok=True)
    _write(path, new_record)
    return RunFolder(path, "new", new_record, ours, made)

