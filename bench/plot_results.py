"""The benchmarks page's plots: one bar chart per benchmark of its ratios to the anchor, drawn from results.json.

    .venv/bin/python bench/plot_results.py                                   # docs/img/bench/results.json -> docs/img/bench/*.png
    .venv/bin/python bench/plot_results.py --results FILE.json --out FOLDER

results.json holds the figures copied out of the bench outputs (docs/bench_*.txt, or the page's tables where a
bench's output was not kept), as the benches printed them, so they can be checked against those outputs
(tests/test_bench_plots.py does):

    {"format_version": 1, "benchmarks": [{"name": "eval_speed", "title": ..., "source": "docs/bench_eval_speed.txt",
      "machine": ..., "date": ..., "command": ..., "measure": "questions/s", "quotient": "value / anchor",
      "reading": "above 1: gptlab faster", "arithmetic": false,
      "bars": [{"label": "letters", "anchor": "lm-eval HFLM", "value": "7.57", "anchor_value": "2.73", "ratio": "2.77"}]}]}

A bar's ratio is the one the bench printed ("ratio"), else its quotient of the two values; "quotient" says which
way round (`value / anchor` for speeds and the time multiples the kernels print, `anchor / value` where a bench
prints the anchor's step time over the side's). The anchor is the line at 1.0. Each PNG is drawn with Agg and
carries no version or date, so the same results give the same bytes; its "Description" text chunk holds the bars
as JSON, so a reader (or a test) gets the plotted numbers back without reading pixels.
Not here: running the benchmarks (each bench/*.py script), the page's tables (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import textwrap
from pathlib import Path

from gptlab.runtime import GptlabError
from gptlab.runtime.files import atomic_write_bytes, read_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "img" / "bench" / "results.json"
FORMAT_VERSION = 1
FIELDS = ("name", "title", "source", "machine", "date", "command", "measure", "quotient", "reading", "bars")
QUOTIENTS = ("value / anchor", "anchor / value")
COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3")  # one per anchor of a chart, in order of appearance


def number(text: object, where: str) -> float:
    """A figure as the bench printed it ("11,990", "2.77") as a float; anything else names the bar and the fix."""
    try:
        value = float(str(text).replace(",", ""))
    except ValueError:
        raise GptlabError(f"{where}: {text!r} is not a number; write the figure as the bench printed it, e.g. \"2.77\"") from None
    if not value > 0:
        raise GptlabError(f"{where}: {text!r} is not a positive figure; a ratio needs both sides above 0")
    return value


def bar_ratio(bar: dict, quotient: str, where: str) -> float:
    """The bench's printed ratio where it printed one (it comes from unrounded medians), else the values' quotient."""
    if bar.get("ratio") is not None:
        return number(bar["ratio"], where)
    if "value" not in bar or "anchor_value" not in bar:
        raise GptlabError(f"{where}: has neither \"ratio\" nor both \"value\" and \"anchor_value\"; give one of them")
    value, anchor = number(bar["value"], where), number(bar["anchor_value"], where)
    return value / anchor if quotient == "value / anchor" else anchor / value


def check_benchmark(benchmark: object, index: int) -> list[tuple[str, str, float]]:
    """A benchmark entry's (label, anchor, ratio) bars, after checking every field the chart needs."""
    if not isinstance(benchmark, dict):
        raise GptlabError(f"results.json: benchmark {index} is {type(benchmark).__name__}, not an object with {', '.join(FIELDS)}")
    name = benchmark.get("name", f"#{index}")
    missing = [field for field in FIELDS if field not in benchmark]
    if missing:
        raise GptlabError(f"results.json: benchmark {name!r} lacks {', '.join(missing)}; every benchmark needs {', '.join(FIELDS)}")
    if not str(name).replace("_", "").isalnum():
        raise GptlabError(f"results.json: benchmark name {name!r} is not a file name of letters, digits and _; it names the PNG")
    if benchmark["quotient"] not in QUOTIENTS:
        raise GptlabError(f"results.json: benchmark {name!r} has quotient {benchmark['quotient']!r}; use one of {', '.join(QUOTIENTS)}")
    if not isinstance(benchmark["bars"], list) or not benchmark["bars"]:
        raise GptlabError(f"results.json: benchmark {name!r} has no bars; give a list of {{label, anchor, value, anchor_value}}")
    bars = []
    for bar in benchmark["bars"]:
        where = f"results.json: benchmark {name!r}, bar {bar.get('label') if isinstance(bar, dict) else bar!r}"
        if not isinstance(bar, dict) or "label" not in bar or "anchor" not in bar:
            raise GptlabError(f"{where}: a bar is an object with at least \"label\" and \"anchor\"")
        bars.append((str(bar["label"]), str(bar["anchor"]), bar_ratio(bar, benchmark["quotient"], where)))
    return bars


def load_results(path: Path) -> list[dict]:
    """The benchmarks of a results.json, each checked, with its bars as (label, anchor, ratio)."""
    path = Path(path)
    if not path.is_file():
        raise GptlabError(f"{path} does not exist; pass --results with the path of a results.json (default {RESULTS})")
    data = read_json(path)
    if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
        found = data.get("format_version") if isinstance(data, dict) else type(data).__name__
        raise GptlabError(f"{path}: format_version {found!r}, expected {FORMAT_VERSION}; this script reads results.json format 1")
    benchmarks = data.get("benchmarks")
    if not isinstance(benchmarks, list) or not benchmarks:
        raise GptlabError(f"{path}: no \"benchmarks\" list; results.json holds {{\"format_version\": 1, \"benchmarks\": [...]}}")
    names = [benchmark.get("name") for benchmark in benchmarks if isinstance(benchmark, dict)]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise GptlabError(f"{path}: benchmark names {', '.join(map(str, repeated))} appear twice; each names its own PNG")
    return [dict(benchmark, bars=check_benchmark(benchmark, index)) for index, benchmark in enumerate(benchmarks)]


def draw(benchmark: dict) -> bytes:
    """One benchmark's horizontal bar chart as PNG bytes: a bar per comparison, coloured by anchor, the anchor at 1.0."""
    import matplotlib

    matplotlib.use("Agg")  # no display; also the one backend whose PNG bytes are the same on every machine
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    bars = benchmark["bars"]
    anchors = list(dict.fromkeys(anchor for _, anchor, _ in bars))
    with matplotlib.rc_context({"font.family": "DejaVu Sans", "font.size": 9, "svg.hashsalt": "gptlab"}):
        figure = Figure(figsize=(7.5, 1.9 + 0.32 * len(bars)), dpi=100, layout="constrained")
        axes = figure.add_subplot()
        ratios = [ratio for _, _, ratio in bars]
        positions = range(len(bars))
        colours = [COLOURS[anchors.index(anchor) % len(COLOURS)] for _, anchor, _ in bars]
        axes.barh(positions, ratios, color=colours, height=0.7)
        for position, ratio in zip(positions, ratios):
            axes.text(ratio, position, f" {ratio:.2f}×", va="center", fontsize=8)
        axes.axvline(1.0, color="black", linestyle="--", linewidth=1)
        axes.set_yticks(list(positions), [label for label, _, _ in bars])
        axes.invert_yaxis()  # the first bar on top, as in the page's table
        axes.set_xlim(0, max(ratios + [1.0]) * 1.25)
        axes.set_xlabel(f"{benchmark['measure']}: {benchmark['quotient']}\nthe anchor at 1.0; {benchmark['reading']}")
        where = ("ARITHMETIC, not measured: " if benchmark.get("arithmetic") else "") + f"{benchmark['machine']}, {benchmark['date']}"
        figure.suptitle("\n".join(textwrap.wrap(benchmark["title"], 90) + textwrap.wrap(where, 90)), fontsize=9)
        handles = [Patch(color=COLOURS[i % len(COLOURS)], label=f"anchor: {a}") for i, a in enumerate(anchors)]
        figure.legend(handles=handles, loc="outside lower center", ncols=len(anchors), fontsize=8, frameon=False)
        buffer = io.BytesIO()
        description = json.dumps({"name": benchmark["name"], "bars": [list(bar) for bar in bars]}, ensure_ascii=False)
        # Software None: no matplotlib version in the file, so a rerun with the same figures writes the same bytes
        figure.savefig(buffer, format="png", metadata={"Software": None, "Title": benchmark["title"], "Description": description})
    return buffer.getvalue()


def write_plots(results: Path, out: Path) -> list[Path]:
    """Every benchmark's PNG in `out`, each written atomically; all are checked and drawn before the first is written,
    so a bad results.json leaves nothing behind."""
    pictures = {f"{benchmark['name']}.png": draw(benchmark) for benchmark in load_results(results)}
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise GptlabError(f"--out {out} is a file; pass a folder for the PNGs")
    paths = []
    for name, data in pictures.items():
        atomic_write_bytes(out / name, data)
        paths.append(out / name)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help=f"the figures (default {RESULTS.relative_to(ROOT)})")
    parser.add_argument("--out", type=Path, help="folder for the PNGs (default: the folder of --results)")
    args = parser.parse_args(argv)
    try:
        paths = write_plots(args.results, args.out or args.results.parent)
    except GptlabError as error:
        raise SystemExit(f"plot_results: error: {error}") from None
    for path in paths:
        print(path)


if __name__ == "__main__":
    main(sys.argv[1:])
