"""Sweeps: a grid of FLOP budgets x model sizes (x learning-rate scales), each run given the steps that spend its budget.

Compute is counted as Chinchilla and Kaplan count it, C = 6 N D: N the parameters in one convention
(`count`: "total" as Chinchilla, every parameter; "non_embedding" as Kaplan et al.; "matmul", every matrix
multiplied; "active", the matrices one token multiplies, = matmul for a dense model), D the tokens trained.
A mixture of experts costs 6 N_active per token, so its steps always come from the active count (whatever
`count` the laws are stated in): dense and MoE sizes in one grid spend the same FLOPs per budget. A run of N parameters at budget C trains
D = C / 6N tokens, rounded to whole steps of the base config's batch; its cosine schedule is stretched to those
steps (Chinchilla's point: a schedule longer than the run overstates its loss). Each row also records N under
every convention and the FLOPs with attention (6N + 12 L d T per token, gptlab.model.accounting), so a fit can
choose its convention afterwards.

A size is a depth ("4": nanochat's shape, gptlab.train.config.depth_model), a shape ("3x192": layers x width,
heads of --head-dim) or a model preset name ("gpt2-mini"). Every size takes the depth dial's lr rule
(sqrt(base width / width) x the base lr), times each of `lr_scales`. A grid with points of fewer than
`min_steps` steps is refused, every such point named in one line; `plan(allow_short=True)` keeps them (a dry
run shows them marked).

    OUT/gptlab_run.json          the sweep's claim: its base training config (the grid may grow between calls)
    OUT/runs/NAME/               one `gptlab train` run folder per grid point (checkpoints, metrics, report)
    OUT/rows/NAME.json           its result, written atomically when it ends: the row the fit reads
    OUT/results.jsonl            every row, in grid order, rewritten after each run
    OUT/sweep.sbatch             (--slurm) a SLURM job array, one grid point per task

Rerunning the same command skips finished runs, resumes a killed one from its last checkpoint (exactly: the
Trainer's resume) and retries failed ones; a run that raised is recorded as "failed" and one whose loss is not
finite as "diverged", with its error, never as a result. Under SLURM each array task runs one grid point
(`--index`) and writes its own row; the fit reads the rows, so concurrent tasks never lose one.
Not here: fitting the laws (gptlab.scaling.fit), training itself (gptlab.train).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gptlab.data.shards import read_manifest
from gptlab.model import preset
from gptlab.model.accounting import PARAM_CONVENTIONS, flops_per_token, scaling_params
from gptlab.model.config import PRESETS as MODEL_PRESETS
from gptlab.runtime import GptlabError, atomic_write_text, read_json, read_text
from gptlab.runtime.device import init_runtime
from gptlab.runtime.rundir import claim_run_folder
from gptlab.train import TrainConfig, Trainer
from gptlab.train.config import depth_model, scaled_optimizer, shaped_model
from gptlab.train.trainer import FREE_FIELDS

RESULTS_FILE = "results.jsonl"
SWEEP_FILES = ("runs", "rows", RESULTS_FILE, "sweep.sbatch", "logs")
SHAPE = re.compile(r"^(\d+)x(\d+)$")


@dataclass(frozen=True, kw_only=True)
class SweepConfig:
    budgets: tuple[float, ...]  # FLOP budgets C, each run's 6 N D
    sizes: tuple[str, ...]  # depths ("4"), shapes ("3x192") or model presets ("gpt2-mini")
    lr_scales: tuple[float, ...] = (1.0,)  # multiples of the size's rule lr: several per size let a fit find the lr law
    count: str = "total"  # the N of C = 6 N D: total | non_embedding | matmul | active (MoE: what a token uses)
    head_dim: int = 64  # head size of "LxW" shapes
    min_steps: int = 20  # a grid point with fewer optimizer steps is refused: too short to mean anything
    tokens_per_param: tuple[float, float] | None = None  # keep only points with D/N in [lo, hi]: each budget's sizes near its optimum

    def __post_init__(self) -> None:
        if not self.budgets or not self.sizes:
            raise GptlabError("a sweep needs at least one --budgets value and one --sizes value")
        bad = [b for b in (*self.budgets, *self.lr_scales) if not (math.isfinite(b) and b > 0)]
        if bad:
            raise GptlabError(f"budgets and lr scales must be positive numbers, got {bad[0]}")
        if self.count not in PARAM_CONVENTIONS:
            raise GptlabError(f"unknown --count {self.count!r}; use one of {', '.join(PARAM_CONVENTIONS)}")
        if self.min_steps < 1:
            raise GptlabError(f"--min-steps must be at least 1, got {self.min_steps}")
        if self.tokens_per_param is not None and not 0 < self.tokens_per_param[0] < self.tokens_per_param[1]:
            raise GptlabError(f"--tokens-per-param takes LOW HIGH with 0 < LOW < HIGH, got {self.tokens_per_param}")

    def keeps(self, tokens: float, params: float) -> bool:
        """Whether a point of D tokens and N params is in the tokens-per-parameter window (always, without one)."""
        return self.tokens_per_param is None or self.tokens_per_param[0] <= tokens / params <= self.tokens_per_param[1]


@dataclass(frozen=True)
class GridPoint:
    """One run of the sweep: where it sits in the grid, and the training config that spends its budget."""

    name: str
    budget: float
    size: str
    lr_scale: float
    config: TrainConfig
    params: dict[str, int]  # N under every convention
    flops_per_token: dict[str, int]
    steps: int  # the steps that spend the budget: config.max_steps, unless fewer than 1 (a point too short to run)

    @property
    def tokens(self) -> int:
        return self.steps * self.config.batch_tokens


def budget_label(value: float) -> str:
    """1e12 -> "1e12", 3e12 -> "3e12", 2.5e13 -> "2.5e13": short, sortable by eye, safe in a folder name."""
    mantissa, exponent = f"{value:.3g}".split("e") if "e" in f"{value:.3g}" else (f"{value:.3g}", "0")
    return f"{mantissa}e{int(exponent)}"


def size_model(base: TrainConfig, size: str, head_dim: int):
    """The model of one size spec, with the base's vocabulary, context and architecture switches."""
    shape = SHAPE.match(size)
    if size.isdigit():
        return depth_model(base.model, int(size), head_dim)
    if shape:
        return shaped_model(base.model, int(shape[1]), int(shape[2]), head_dim)
    if size in MODEL_PRESETS:
        return preset(size, vocab_size=base.model.vocab_size, block_size=max(base.seq_len, preset(size).block_size))
    raise GptlabError(f"unknown size {size!r}; use a depth (4), a shape layers x width (3x192) or a model preset "
                      f"({', '.join(MODEL_PRESETS)})")


def plan(base: TrainConfig, sweep: SweepConfig, out: str | Path, *, allow_short: bool = False) -> list[GridPoint]:
    """Every grid point, budgets outermost, with the steps that spend its budget. Points with fewer than
    --min-steps steps are refused (all of them in one line), unless `allow_short`: a dry run shows them marked."""
    out, points = Path(out), []
    for budget in sweep.budgets:
        for size in sweep.sizes:
            model = size_model(base, size, sweep.head_dim)
            params = scaling_params(model)
            steps = round(budget / (6 * compute_params(model, params, sweep.count)) / base.batch_tokens)
            if not sweep.keeps(steps * base.batch_tokens, params[sweep.count]):
                continue
            for lr_scale in sweep.lr_scales:
                points.append(_grid_point(base, sweep, out, budget, size, lr_scale, model, params, steps))
    if not points:
        raise GptlabError(f"no grid point has between {sweep.tokens_per_param[0]:g} and {sweep.tokens_per_param[1]:g} tokens per "
                          "parameter; widen --tokens-per-param or change the budgets or sizes")
    names = [point.name for point in points]
    if len(set(names)) < len(names):
        raise GptlabError(f"the grid names a run twice ({', '.join(sorted({n for n in names if names.count(n) > 1}))}); "
                          "list each budget, size and lr scale once")
    if not allow_short:
        refuse_short(points, sweep)
    return points


def _grid_point(base: TrainConfig, sweep: SweepConfig, out: Path, budget: float, size: str, lr_scale: float, model, params,
                steps: int) -> GridPoint:
    """One run: the size's depth-dial lr times the scale, a schedule stretched to its steps, its own folder."""
    optimizer = scaled_optimizer(base, model)
    optimizer = dataclasses.replace(optimizer, lr=optimizer.lr * lr_scale, embedding_lr=optimizer.embedding_lr * lr_scale,
                                    head_lr=optimizer.head_lr * lr_scale)
    name = f"c{budget_label(budget)}-{size}" + (f"-lr{lr_scale:g}" if lr_scale != 1 else "")  # scale 1 keeps its name: grids can grow
    runnable = max(steps, 1)  # a config needs a step; a point with none is only shown (and refused) by its `steps`
    warmup = min(base.schedule.warmup_steps, max(1, runnable // 10))
    config = dataclasses.replace(base, model=model, optimizer=optimizer, max_steps=runnable, out=str(out / "runs" / name),
                                 schedule=dataclasses.replace(base.schedule, warmup_steps=warmup))
    return GridPoint(name, budget, size, lr_scale, config, params, flops_per_token(model, base.seq_len), steps)


def compute_params(model, params: dict[str, int], count: str) -> int:
    """The N whose 6N is a token's cost: the convention's, but a mixture of experts' active count (its idle experts
    cost no FLOPs; budgeting them would under-train it next to dense sizes of the same compute)."""
    return params["active"] if model.is_moe else params[count]


def short_points(points: list[GridPoint], sweep: SweepConfig) -> list[GridPoint]:
    """The points with fewer optimizer steps than --min-steps: too short to mean anything."""
    return [point for point in points if point.steps < sweep.min_steps]


def refuse_short(points: list[GridPoint], sweep: SweepConfig, shown: int = 4) -> None:
    """One line naming every (budget, size) below --min-steps, the budget each needs, and the ways out."""
    short = short_points(points, sweep)
    if not short:
        return
    batch = short[0].config.batch_tokens
    named: dict[str, str] = {}
    for point in short:  # one entry per (budget, size): lr scales share the steps
        least = _round_up(6 * compute_params(point.config.model, point.params, sweep.count) * batch * sweep.min_steps)
        named.setdefault(f"c{budget_label(point.budget)}-{point.size}",
                         f"{point.steps} step{'s' if point.steps != 1 else ''}, needs a budget of {budget_label(least)}")
    listed = [f"{name} ({why})" for name, why in list(named.items())[:shown]]
    more = f" and {len(named) - shown} more" if len(named) > shown else ""
    raise GptlabError(f"{len(short)} of {len(points)} grid points train fewer than --min-steps {sweep.min_steps} steps of "
                      f"{batch:,} tokens: {', '.join(listed)}{more}; raise those budgets, drop those sizes, pass a smaller "
                      "--batch-tokens or a lower --min-steps")


def _round_up(value: float) -> float:
    """`value` rounded up to 2 significant digits: 4.61e7 -> 4.7e7, a budget that is surely enough."""
    unit = 10.0 ** (math.floor(math.log10(value)) - 1)
    return math.ceil(value / unit) * unit


def describe_plan(points: list[GridPoint], sweep: SweepConfig, train_tokens: int | None) -> str:
    """The grid as a table: what each run trains and what it costs, before any compute is spent."""
    lines = [f"{'run':<28} {sweep.count + ' N':>14} {'tokens':>12} {'tok/N':>7} {'steps':>7} {'6ND':>9} {'epochs':>6}"]
    for point in points:
        n = point.params[sweep.count]
        epochs = f"{point.tokens / train_tokens:.2f}" if train_tokens else "?"
        short = f"  < --min-steps {sweep.min_steps}" if point.steps < sweep.min_steps else ""
        lines.append(f"{point.name:<28} {n:>14,} {point.tokens:>12,} {point.tokens / n:>7.1f} {point.steps:>7,} "
                     f"{6 * compute_params(point.config.model, point.params, sweep.count) * point.tokens:>9.3g} {epochs:>6}{short}")
    return "\n".join(lines)


def check_point(config: TrainConfig, runtime) -> None:
    """Data, tokenizer, vocabulary and batch arithmetic of a run, checked as its Trainer checks them, before any compute."""
    Trainer(config, runtime=runtime, log=lambda _: None)


def sweep_record(base: TrainConfig, sweep: SweepConfig) -> dict:
    """What the sweep folder is claimed with: everything a run computes from, and the grid (free to grow)."""
    return {"train": dataclasses.asdict(dataclasses.replace(base, out="")), "count": sweep.count, "head_dim": sweep.head_dim,
            "grid": {"budgets": list(sweep.budgets), "sizes": list(sweep.sizes), "lr_scales": list(sweep.lr_scales),
                     "min_steps": sweep.min_steps, "tokens_per_param": sweep.tokens_per_param}}


def claim_sweep(out: Path, base: TrainConfig, sweep: SweepConfig, force: bool):
    """The sweep folder, new or resumed: the same training settings (logging and the like may change, the grid may
    grow); anything else is refused, as a training run's folder is."""
    return claim_run_folder(out, command="sweep", config=sweep_record(base, sweep), ours=SWEEP_FILES, force=force,
                            free=["grid", *(f"train.{name}" for name in FREE_FIELDS)], defaults={"train": _train_defaults()})


def run_sweep(base: TrainConfig, sweep: SweepConfig, out: str | Path, *, index: int | None = None, force: bool = False,
              log: Callable[[str], None] = print, runtime=None) -> list[dict]:
    """Run the grid (or its point number `index`) one run after another; returns the rows of the points run or skipped.

    Every mistake visible before compute (sizes, budgets, data, tokenizer, vocabulary, batch) is refused first,
    and a new sweep refused that way leaves no folder behind.
    """
    out = Path(out)
    points = plan(base, sweep, out)
    runtime = runtime or init_runtime(base.device)
    if index is not None and not 0 <= index < len(points):
        raise GptlabError(f"--index {index} is outside the grid of {len(points)} runs (0..{len(points) - 1})")
    chosen = points if index is None else [points[index]]
    check_point(chosen[0].config, runtime)
    folder = claim_sweep(out, base, sweep, force)
    log(("resuming" if folder.status == "resume" else "starting") + f" the sweep in {out}: {len(points)} runs, "
        f"C = 6 N D with N the {sweep.count} parameters")
    rows = []
    for number, point in enumerate(chosen, 1):
        row = read_row(point)
        if row is not None and row["status"] == "finished":
            log(f"[{number}/{len(chosen)}] {point.name}: finished before (val loss {_show(row['val_loss'])}); skipped")
        else:
            log(f"[{number}/{len(chosen)}] {point.name}: {point.params[sweep.count]:,} params, {point.tokens:,} tokens, "
                f"{point.config.max_steps:,} steps" + (f" (retrying: it {row['status']} before)" if row else ""))
            row = train_point(point, sweep, runtime, log)
            write_row(point, row)
            write_results(out, points)
        rows.append(row)
    return rows


def write_slurm_script(base: TrainConfig, sweep: SweepConfig, out: str | Path, command: list[str], *, force: bool = False) -> Path:
    """OUT/sweep.sbatch: a SLURM job array, task i running grid point i (`command` + --index i); returns its path.

    The sweep folder is claimed now (the same checks as a run), so every task resumes the same sweep; SLURM does
    not create an --output folder, so OUT/logs is made here. The #SBATCH lines are a starting point: set the
    partition, time and GPUs your cluster wants. Each task trains one model on one GPU, one process.
    """
    out = Path(out)
    points = plan(base, sweep, out)
    check_point(dataclasses.replace(points[0].config, device="cpu"), None)  # here, on the login node: data and tokenizer
    claim_sweep(out, base, sweep, force)
    (out / "logs").mkdir(exist_ok=True)
    line = " ".join(shlex.quote(part) for part in [sys.executable, "-m", "gptlab", *command]) + ' --index "$SLURM_ARRAY_TASK_ID"'
    script = "\n".join([
        "#!/bin/bash",
        f"#SBATCH --job-name=gptlab-sweep-{out.name}",
        f"#SBATCH --array=0-{len(points) - 1}",
        "#SBATCH --ntasks=1",
        "#SBATCH --gres=gpu:1",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --time=04:00:00",
        f"#SBATCH --output={shlex.quote(str(out.absolute() / 'logs'))}/%A_%a.out",
        f"# {len(points)} runs of `gptlab sweep` in {out}; submit with: sbatch {out / 'sweep.sbatch'}",
        "# Edit the #SBATCH lines for your cluster (partition, account, time); --array=0-N%K runs at most K at once.",
        "# A task that is killed resumes from its checkpoint when resubmitted (sbatch --array=I ...).",
        "set -euo pipefail",
        f"cd {shlex.quote(str(Path.cwd()))}",
        line,
        "",
    ])
    path = out / "sweep.sbatch"
    atomic_write_text(path, script)
    return path


def _train_defaults() -> dict:
    from gptlab.runtime.config import field_defaults

    return field_defaults(TrainConfig)


def train_point(point: GridPoint, sweep: SweepConfig, runtime, log: Callable[[str], None]) -> dict:
    """One grid point's run, resumed from its checkpoint if it has one; its row, "failed" if it raised.

    Ctrl-C ends the whole sweep (the run keeps the checkpoint the Trainer saves); any other exception is the
    run's failure, recorded with its message, and the sweep goes on to the next point.
    """
    try:
        result = Trainer(point.config, runtime=runtime, log=lambda line: log("    " + line)).fit()
    except KeyboardInterrupt:
        raise
    except Exception as error:  # noqa: BLE001 - a run's failure is data for the sweep, not the end of it
        log(f"    {point.name} failed: {type(error).__name__}: {error}")
        return result_row(point, sweep, "failed", error=f"{type(error).__name__}: {error}")
    if result.status == "interrupted":
        raise KeyboardInterrupt
    row = result_row(point, sweep, "finished")
    if not all(math.isfinite(row[key]) for key in ("train_loss", "val_loss") if row[key] is not None):
        row.update(status="diverged", error=f"loss is not finite (train {row['train_loss']}, val {row['val_loss']})")
    return row


def result_row(point: GridPoint, sweep: SweepConfig, status: str, error: str | None = None) -> dict:
    """The sweep's record of one run: the grid point, N under every convention, D, C and the losses it reached.

    train_loss is the mean logged train loss over the run's last tenth of steps (one step's loss is noisy);
    val_loss and val_bpb are the final evaluation's; seconds counts training time across resumes.
    """
    from gptlab.runs.record import read_metrics

    path = Path(point.config.out) / "metrics.jsonl"
    records = read_metrics(path) if path.is_file() else []
    train = [r for r in records if "loss" in r]
    tail = [r["loss"] for r in train if r["step"] > 0.9 * point.config.max_steps] or [r["loss"] for r in train[-1:]]
    evals = [r for r in records if "val_loss" in r and r["step"] == point.config.max_steps]
    model = point.config.model
    manifest = read_manifest(point.config.data)
    return {
        "run": point.name, "status": status, "budget": point.budget, "size": point.size, "lr_scale": point.lr_scale,
        "lr": point.config.optimizer.lr, "count": sweep.count,
        "n_layer": model.n_layer, "n_embd": model.n_embd, "n_head": model.n_head, "params": point.params,
        "tokens": point.tokens, "steps": point.config.max_steps, "batch_tokens": point.config.batch_tokens,
        "seq_len": point.config.seq_len, "flops": 6 * compute_params(model, point.params, sweep.count) * point.tokens,
        "flops_with_attention": point.flops_per_token["training"] * point.tokens,
        "epochs": point.tokens / manifest["splits"]["train"]["tokens"],
        "train_loss": sum(tail) / len(tail) if tail else None,
        "val_loss": evals[-1]["val_loss"] if evals and status != "failed" else None,
        "val_bpb": evals[-1].get("val_bpb") if evals and status != "failed" else None,
        "seconds": train[-1]["elapsed"] if train else None, "error": error,
    }


def row_path(point: GridPoint) -> Path:
    """OUT/rows/NAME.json, beside the run's folder OUT/runs/NAME (which belongs to its Trainer)."""
    run = Path(point.config.out)
    return run.parent.parent / "rows" / f"{run.name}.json"


def read_row(point: GridPoint) -> dict | None:
    path = row_path(point)
    return read_json(path) if path.is_file() else None


def write_row(point: GridPoint, row: dict) -> None:
    row_path(point).parent.mkdir(exist_ok=True)
    atomic_write_text(row_path(point), json.dumps(row, indent=1) + "\n")


def read_rows(out: str | Path) -> list[dict]:
    """Every row under a sweep folder (rows/*.json), or the lines of a results.jsonl file."""
    path = Path(out)
    if path.is_file():
        return _read_results_file(path)
    if not (path / "runs").is_dir():
        raise GptlabError(f"{path} is neither a sweep folder (made by `gptlab sweep`) nor a results.jsonl file")
    rows = []
    for file in sorted((path / "rows").glob("*.json")):
        row = read_json(file)
        if not isinstance(row, dict):
            raise GptlabError(f"{file} is not a sweep row (a JSON object); delete it and rerun the sweep to redo its run")
        rows.append(row)
    return rows


def _read_results_file(path: Path) -> list[dict]:
    """The rows of a results.jsonl, one JSON object a line (blank lines skipped); errors name the file's own line."""
    what = "it is not a sweep's results file (JSON lines); pass the sweep folder or its results.jsonl"
    rows = []
    for number, line in enumerate(read_text(path, what).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise GptlabError(f"{path} line {number} is not JSON ({error.msg}, column {error.colno}); {what}") from None
        if not isinstance(row, dict):
            raise GptlabError(f"{path} line {number} is not a row (a JSON object); {what}")
        rows.append(row)
    return rows


def write_results(out: Path, points: list[GridPoint]) -> None:
    """results.jsonl: the rows of the grid's points that have one, in grid order (then any from other grids)."""
    order = {point.name: number for number, point in enumerate(points)}
    rows = sorted(read_rows(out), key=lambda row: (order.get(row["run"], len(order)), row["run"]))
    atomic_write_text(out / RESULTS_FILE, "".join(json.dumps(row) + "\n" for row in rows))


def _show(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)
