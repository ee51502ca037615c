"""Where a report card goes: its folder (claimed like a run folder) and the two files written there.

    folder = claim_card_folder(model_dir, config, out=None)   # RUN/eval-core for a run's model; None: print only
    count = save_card(folder.path, card, examples)            # eval.json and examples.jsonl, each written atomically

An evaluation folder holds `eval.json` (gptlab.eval.card) and `examples.jsonl` (every question as it was asked,
answered and scored, a JSON object per line, with its task). It is `--out`, or, when the model belongs to a training
run (a folder above it holds metrics.jsonl), RUN/eval-SUITE: `gptlab runs report RUN` shows the cards found there.
The folder is claimed with gptlab.runtime.rundir: the same settings replace their own files, other settings are
refused (`force` replaces them), a folder holding anything else is never touched. Not here: computing the card
(gptlab.eval.suite), reading it back into a run's report (gptlab.runs).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from gptlab.eval.card import CARD_FILE, CARD_FILES, Card
from gptlab.runtime import GptlabError, atomic_write_text
from gptlab.runtime.rundir import RunFolder, claim_run_folder

EXAMPLES_FILE = "examples.jsonl"
RUN_DEPTH = 4  # a model folder lies at most this deep in its run (RUN/checkpoints/step_N/...)


def run_folder_of(path: Path) -> Path | None:
    """The training run a model folder belongs to (the nearest folder above holding metrics.jsonl), if any."""
    for folder in [path, *path.parents][:RUN_DEPTH]:
        if (folder / "metrics.jsonl").is_file():
            return folder
    return None


def shown(path: Path) -> Path:
    """A path as the user would type it: relative to the working folder when it lies inside it."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def claim_card_folder(model_dir: Path, config, *, out: str | None = None, force: bool = False) -> RunFolder | None:
    """The folder the card of `config` (a gptlab.eval.suite.EvalConfig) goes to, claimed before any compute:
    `out`, else RUN/eval-SUITE for a run's model; None when there is neither (the card is only printed)."""
    run = run_folder_of(model_dir.resolve())
    folder = Path(out) if out else (run / f"eval-{config.suite or 'judge'}" if run is not None else None)
    if folder is None:
        return None
    settings = {"model": str(model_dir.resolve()), **{key: value for key, value in asdict(config).items() if key != "batch_size"}}
    try:
        return claim_run_folder(folder, command="eval", config=json.loads(json.dumps(settings, default=str)), ours=CARD_FILES,
                                force=force, resumes=False)
    except GptlabError as error:
        if out:
            raise
        raise GptlabError(f"{error} (no --out was given: {shown(folder)} is where the cards of this run's model go)") from None


def save_card(folder: Path, card: Card, examples: dict[str, list[dict]]) -> int:
    """Write examples.jsonl, then eval.json (the card last: a folder with a card has its questions); returns their count."""
    lines = [json.dumps({"task": task, **record}, default=str) for task, records in examples.items() for record in records]
    atomic_write_text(Path(folder) / EXAMPLES_FILE, "".join(line + "\n" for line in lines))
    card.save(Path(folder) / CARD_FILE)
    return len(lines)
