"""Runs side by side: their curves overlaid in one PNG, and a table of their final figures.

    print(compare_runs(["runs/a", "runs/b"], out_png="compare.png", x="tokens"))

    run     steps  tokens   time   train loss  best val loss  val loss  val bpb  tokens/s  MFU    params
    runs/a  600    2457600  4m05s  3.9612      4.0411         4.0411    2.5031   10,034    -      1,843,968

Figures come from each run's metrics.jsonl (gptlab.runs.record.RunRecord.summary). The PNG carries a
Software text chunk naming us, so a later comparison may replace a file it made; any other existing
file is refused unless `force`.
Not here: one run's full page (gptlab.runs.report).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from gptlab.runs.plots import draw, nothing_logged, png_bytes, subplots, zoom_past_start
from gptlab.runs.record import AXES, RunRecord, load_run
from gptlab.runtime import GptlabError, atomic_write_bytes

SOFTWARE = "gptlab runs compare"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# (summary key, column title, format): the table's columns, in order
COLUMNS = (
    ("steps", "steps", "{:,}"), ("tokens", "tokens", "{:,}"), ("time", "time", None),
    ("final_loss", "train loss", "{:.4f}"), ("best_val_loss", "best val loss", "{:.4f}"),
    ("final_val_loss", "val loss", "{:.4f}"), ("val_bpb", "val bpb", "{:.4f}"),
    ("tokens_per_s", "tokens/s", "{:,.0f}"), ("mfu", "MFU", None), ("params", "params", "{:,}"),
)


def format_duration(seconds: float) -> str:
    """12.3s, 4m05s, 2h03m: a training time at the precision a reader compares."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def format_figure(key: str, value) -> str:
    """One summary figure as the table shows it ("-" when the run has none)."""
    if value is None:
        return "-"
    if key == "time":
        return format_duration(value)
    if key == "mfu":
        return f"{100 * value:.1f}%"
    pattern = next(pattern for name, _, pattern in COLUMNS if name == key)
    return pattern.format(value)


def summary_rows(runs: list[RunRecord]) -> tuple[list[str], list[list[str]]]:
    """(headers, rows of strings): each run's final figures."""
    headers = ["run"] + [title for _, title, _ in COLUMNS]
    rows = []
    for run in runs:
        summary = run.summary()
        rows.append([run.name] + [format_figure(key, summary[key]) for key, _, _ in COLUMNS])
    return headers, rows


def card_rows(runs: list[RunRecord]) -> tuple[list[str], list[list[str]]] | None:
    """(headers, rows): the runs' report cards side by side, a row per task, metric and shots, then the aggregates;
    None when no run has a card (RUN/eval-*/eval.json, written by `gptlab eval`)."""
    figures = [run.card_figures() for run in runs]
    if not any(rows for rows, _ in figures):
        return None

    def key(row: dict) -> str:
        return f"{row['task']} ({row['metric']}, {row['shots']}-shot)"

    def cell(found: list[dict]) -> str:
        return f"{found[0]['score']:.4f} ({found[0]['low']:.2f}-{found[0]['high']:.2f})" if found else "-"

    keys = list(dict.fromkeys(key(row) for rows, _ in figures for row in rows))
    names = list(dict.fromkeys(item["name"] for _, aggregates in figures for item in aggregates))
    table = [[name, *(cell([row for row in rows if key(row) == name]) for rows, _ in figures)] for name in keys]
    table += [[name, *(cell([item for item in aggregates if item["name"] == name]) for _, aggregates in figures)] for name in names]
    return ["task", *(run.name for run in runs)], table


def text_table(headers: list[str], rows: list[list[str]]) -> str:
    """Aligned columns for a terminal: the first left-aligned, the figures right-aligned."""
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    lines = []
    for row in [headers, *rows]:
        cells = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def made_by_us(path: Path) -> bool:
    """A PNG whose Software text chunk names gptlab runs compare (read chunk by chunk up to the image data)."""
    try:
        with open(path, "rb") as handle:
            if handle.read(8) != PNG_SIGNATURE:
                return False
            while len(header := handle.read(8)) == 8:
                length, kind = struct.unpack(">I4s", header)
                if kind == b"IDAT":
                    return False
                data = handle.read(length)
                handle.read(4)  # the chunk's CRC
                if kind == b"tEXt" and data == b"Software\x00" + SOFTWARE.encode():
                    return True
    except OSError:
        return False
    return False


def check_out_png(path: Path, force: bool) -> None:
    """The PNG may be written: new, made by an earlier comparison, or `force`; never a folder."""
    if path.suffix.lower() != ".png":
        raise GptlabError(f"--out {path} is not a .png file name; pass e.g. --out compare.png")
    if path.is_dir():
        raise GptlabError(f"--out {path} is a folder; pass a .png file name")
    if path.exists() and not force and not made_by_us(path):
        raise GptlabError(f"--out {path} exists and was not made by `gptlab runs compare`; pass --force to replace it, or another --out")


def plot_comparison(runs: list[RunRecord], x: str) -> bytes:
    """Train loss and val bits per byte of every run against `x`, side by side, as PNG bytes."""
    return png_bytes(comparison_figure(runs, x), software=SOFTWARE)


def comparison_figure(runs: list[RunRecord], x: str):
    """The comparison's matplotlib figure (the caller closes it; png_bytes does)."""
    figure, axes = subplots(1, 2, width=6.0, height=4.0)
    for axis, key, marker in ((axes[0][0], "loss", "-"), (axes[0][1], "val_bpb", "o-")):
        if drawn := draw(axis, runs, key, x, marker=marker):
            zoom_past_start(axis, drawn)
            axis.legend(fontsize=8)
        else:
            nothing_logged(axis, f"no {'val bits per byte' if key == 'val_bpb' else 'train loss'} logged")
    return figure


def check_request(out_png: str | os.PathLike | None, x: str, force: bool) -> None:
    """The x axis is known and the PNG may be written: checked before any run is read."""
    if x not in AXES:
        raise GptlabError(f"unknown x axis {x!r}; use one of {', '.join(AXES)}")
    if out_png is not None:
        check_out_png(Path(out_png), force)


def write_curves(runs: list[RunRecord], out_png: str | os.PathLike, x: str) -> None:
    """Every run's curves against `x` in `out_png`, each labelled by its name."""
    for run in runs:
        run.check_axis(x)  # a run without this axis (FLOPs without a config) is refused before anything is drawn
    atomic_write_bytes(out_png, plot_comparison(runs, x))


def compare_runs(run_dirs: list[str | os.PathLike], out_png: str | os.PathLike | None = None, x: str = "step",
                 *, force: bool = False) -> str:
    """The table of the runs' final figures; with `out_png`, also their curves against `x` in that PNG."""
    check_request(out_png, x, force)
    if not run_dirs:
        raise GptlabError("no runs to compare: pass one or more run folders, or --group NAME=PATTERN")
    runs = [load_run(path, name=str(path)) for path in run_dirs]
    if out_png is not None:
        write_curves(runs, out_png, x)
    cards = card_rows(runs)
    return text_table(*summary_rows(runs)) + (f"\n\nreport cards (score and 95% interval):\n{text_table(*cards)}" if cards else "")
