"""One run on one page: OUT/report.html, self-contained (inline styles and base64 PNG plots, nothing fetched).

Sections, in order: the final figures; loss and val bits per byte against step, tokens, training time and
training FLOPs; throughput and MFU over time; for a mixture-of-experts run, each sparse layer's expert
load (max/mean load, dropped assignments, the share of each expert over steps, the latest figures; a collapsing
router shows as one bright band and a max/mean near n_experts / top_k); every other logged figure (learning rate, gradient norm,
a stage's own, benchmark scores); the evaluations table and its final figures; the samples the run printed;
the machine (OUT/machine.json); the config (OUT/train_config.json). Every string is HTML-escaped.

Rewritten whole and atomically from the run's files, so the Trainer can refresh it at each checkpoint
and `gptlab runs report RUN` can redo it at any time. A report.html without our generator tag is someone
else's file: refused, never replaced.
Not here: reading the run (gptlab.runs.record), the figures' formats (gptlab.runs.compare).
"""

from __future__ import annotations

import base64
import json
import os
from html import escape
from pathlib import Path

from gptlab.runs.compare import summary_rows
from gptlab.runs.plots import LABELS, draw, nothing_logged, png_bytes, subplots, zoom_past_start
from gptlab.runs.record import AXES, RunRecord, load_run
from gptlab.runtime import GptlabError, atomic_write_text

REPORT_FILE = "report.html"
GENERATOR = '<meta name="generator" content="gptlab runs report">'  # how a later write knows the page is ours
CURVES = ("loss", "val_bpb")  # drawn against every axis; with val loss beside the train loss
MOE_KEYS = ("moe_aux_loss", "moe_max_load", "moe_layers")  # the Trainer's MoE figures (gptlab.train.moe_stats)
STANDARD = {"step", "loss", "tokens", "tokens_per_s", "mfu", "elapsed", "val_loss", "val_bpb", *MOE_KEYS}  # drawn elsewhere
STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}pre{background:#f6f6f6;padding:.6em;white-space:pre-wrap}
.fields td{text-align:left}img{max-width:100%}h2{border-bottom:1px solid #ddd;margin-top:1.6em}.note{color:#666}"""


def write_report(run_dir: str | os.PathLike) -> Path:
    """(Re)write RUN/report.html from the run's files; returns its path. A report.html we did not write is refused."""
    run = load_run(run_dir, name=Path(run_dir).name or str(run_dir))
    path = Path(run_dir) / REPORT_FILE
    if path.exists() and (not path.is_file() or GENERATOR not in path.read_text(encoding="utf-8", errors="replace")[:2000]):
        raise GptlabError(f"{path} exists and was not written by gptlab; move it away to write the run's report there")
    atomic_write_text(path, render_report(run))
    return path


def render_report(run: RunRecord) -> str:
    sections = [_heading(run), _summary(run), _curves(run), _throughput(run), _experts(run), _others(run), _evaluations(run),
                _card(run), _samples(run), _key_values("Machine", run.machine, f"no machine.json in {run.path}"),
                _key_values("Config", _flatten(run.config) if run.config else None, f"no train_config.json in {run.path}")]
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">{GENERATOR}<title>{escape(run.name)}: gptlab run report</title>"
            f"<style>{STYLE}</style></head>\n<body>\n" + "\n".join(sections) + "\n</body></html>\n")


def table(headers: list[str], rows: list[list], css_class: str = "") -> str:
    head = "".join(f"<th>{escape(str(cell))}</th>" for cell in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(cell))}</td>" for cell in row) + "</tr>\n" for row in rows)
    return f"<table{f' class={css_class!r}' if css_class else ''}><tr>{head}</tr>\n{body}</table>"


def image(png: bytes, alt: str) -> str:
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def _note(text: str) -> str:
    return f'<p class="note">{escape(text)}</p>'


def _number(value) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if 0.01 <= abs(value) < 1e5 else f"{value:.4g}"
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _heading(run: RunRecord) -> str:
    command = f"gptlab {run.command}" if run.command else "a training run"
    last = run.train[-1]["step"] if run.train else 0
    return (f"<h1>{escape(run.name)}</h1>\n<p>{escape(command)} in <code>{escape(str(run.path.resolve()))}</code>, "
            f"{escape(progress(run.config or {}, last, run.train[-1].get('elapsed') if run.train else None))}.</p>")


def progress(config: dict, last: int, elapsed: float | None = None) -> str:
    """How far the run is: "step 180 of 1,000", or for a time-limited run "step 180 (time limit 180 s)". A
    time-limited run's max_steps is a ceiling (gptlab run sets 10**9), named only when the pace so far
    (`elapsed` seconds for `last` steps) reaches it within the time limit: "step 180 of 200 (time limit 600 s)"."""
    max_steps, time_limit = config.get("max_steps"), config.get("time_limit") or 0
    of = f" of {max_steps:,}" if isinstance(max_steps, int) and not isinstance(max_steps, bool) else ""
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or time_limit <= 0:
        return f"step {last:,}{of}"
    reaches = bool(of and isinstance(elapsed, (int, float)) and elapsed > 0 and last / elapsed * time_limit >= max_steps)
    return f"step {last:,}{of if reaches else ''} (time limit {_seconds(float(time_limit))})"


def _seconds(seconds: float) -> str:
    """180 -> "180 s", 600 -> "10 min", 5400 -> "90 min", 7200 -> "2 h": the unit a person would say the budget in."""
    for size, unit in ((3600, "h"), (60, "min")):
        if seconds >= 10 * 60 and seconds >= 2 * size and seconds % size == 0:
            return f"{seconds / size:,.0f} {unit}"
    return f"{seconds:,.0f} s" if seconds == int(seconds) else f"{seconds:,.1f} s"


def _summary(run: RunRecord) -> str:
    headers, rows = summary_rows([run])
    summary = run.summary()
    flops = f"training FLOPs so far {summary['flops']:.3g} (6N + 12 L d T per token)" if summary["flops"] else ""
    return "<h2>Final figures</h2>\n" + table(headers[1:], [row[1:] for row in rows]) + (_note(flops) if flops else "")


def _curves(run: RunRecord) -> str:
    if not run.train:
        return "<h2>Curves</h2>\n" + _note("nothing logged yet")
    figure, axes_names = curves_figure(run)
    return "<h2>Curves</h2>\n" + image(png_bytes(figure), "loss and val bits per byte against " + ", ".join(axes_names))


def curves_figure(run: RunRecord):
    """(figure, x axes): loss and val bits per byte, a row of panels per x axis (FLOPs only with a model config)."""
    axes_names = [x for x in AXES if x != "flops" or run.flops_per_token() is not None]
    figure, axes = subplots(len(axes_names), len(CURVES))
    for row, x in zip(axes, axes_names):
        train = draw(row[0], [run], "loss", x, label="train")
        val = draw(row[0], [run], "val_loss", x, label="val", marker="o-")
        zoom_past_start(row[0], train + val)
        if val:
            row[0].legend(fontsize=8)
        row[0].set_ylabel("loss")
        if not draw(row[1], [run], "val_bpb", x, label="val", marker="o-"):
            nothing_logged(row[1], "no val bits per byte logged")
    return figure, axes_names


def _throughput(run: RunRecord) -> str:
    if not run.train:
        return ""
    figure, axes = subplots(1, 2)
    draw(axes[0][0], [run], "tokens_per_s", "time")
    if not draw(axes[0][1], [run], "mfu", "time"):
        nothing_logged(axes[0][1], "no MFU: no peak FLOP/s known\n(pass --mfu-peak NAME or a number)")
    return "<h2>Throughput</h2>\n" + image(png_bytes(figure), "tokens per second and MFU over training time")


def _experts(run: RunRecord) -> str:
    """Mixture of experts: per sparse layer, load and drops against step and each expert's share as a heatmap
    (experts x steps), then the latest figures. Nothing for a dense run."""
    records = [record for record in run.train if isinstance(record.get("moe_layers"), list) and record["moe_layers"]]
    if not records:
        return ""
    numbers = list(dict.fromkeys(layer["layer"] for record in records for layer in record["moe_layers"]))
    figure, axes = subplots(1 + len(numbers), 3, width=3.6, height=2.6)
    for axis, key in zip(axes[0], ("moe_max_load", "moe_aux_loss")):
        draw(axis, [run], key, "step")
        axis.set_title(LABELS[key], fontsize=9)
        axis.set_ylabel("")
    axes[0][2].set_visible(False)
    top_k = ((run.config or {}).get("model") or {}).get("moe", {}).get("top_k")
    for row, number in zip(axes[1:], numbers):
        _expert_panels(row, records, number, top_k)
    latest = [[layer["layer"], _number(layer["max_load"]), f"{layer['dropped']:.2%}", _number(layer["balance"]),
               _number(layer["z"]), " ".join(f"{share:.0%}" for share in layer["tokens"])] for layer in records[-1]["moe_layers"]]
    return ("<h2>Mixture of experts</h2>\n"
            + _note("max / mean load: 1 when the experts share the tokens evenly, n_experts / top_k when every token "
                    "picks the same experts (a collapsed router). Figures of the logged steps, summed over ranks.")
            + image(png_bytes(figure), "expert load per sparse layer: max/mean load, dropped assignments, tokens per expert")
            + f"<h3>Expert load at step {records[-1]['step']:,}</h3>\n"
            + table(["layer", "max / mean load", "dropped", "balance loss", "z-loss", "tokens per expert"], latest))


def _expert_panels(row, records: list[dict], number: int, top_k: int | None) -> None:
    """One sparse layer's three panels: max/mean load, dropped fraction, and the expert shares as a heatmap
    from 0 to 1 / top_k (an expert that every token picks): the same colours at every step and in every run."""
    points = [(record["step"], layer) for record in records for layer in record["moe_layers"] if layer["layer"] == number]
    steps = [step for step, _ in points]
    style = "-" if len(points) > 1 else "o"
    for axis, key, title in ((row[0], "max_load", "max / mean load"), (row[1], "dropped", "dropped fraction")):
        axis.plot(steps, [layer[key] for _, layer in points], style, linewidth=1.2, markersize=4)
        axis.set_title(f"layer {number}: {title}", fontsize=9)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    shares = [layer["tokens"] for _, layer in points]  # (steps, experts)
    experts = len(shares[0])
    span = (steps[0] - 0.5, steps[-1] + 0.5) if len(steps) == 1 else (steps[0], steps[-1])
    brightest = 1 / top_k if isinstance(top_k, int) and top_k > 0 else max(max(share) for share in shares) or 1.0
    row[2].imshow([list(column) for column in zip(*shares)], aspect="auto", origin="lower", cmap="viridis",
                  vmin=0.0, vmax=brightest, extent=(*span, -0.5, experts - 0.5), interpolation="nearest")
    row[2].set_title(f"layer {number}: tokens per expert (dark 0, bright {brightest:.0%})", fontsize=9)
    row[2].set_xlabel("step")
    row[2].set_ylabel("expert")


def _others(run: RunRecord) -> str:
    """Every other number the run logged, one small panel each against step."""
    keys = list(dict.fromkeys(key for record in run.records for key, value in record.items()
                              if key not in STANDARD and isinstance(value, (int, float)) and not isinstance(value, bool)))
    if not keys:
        return ""
    columns = min(3, len(keys))
    rows = -(-len(keys) // columns)
    figure, axes = subplots(rows, columns, width=3.6, height=2.6)
    panels = [axis for row in axes for axis in row]
    for axis, key in zip(panels, keys):
        evaluated = all("loss" not in record for record in run.records if key in record)
        draw(axis, [run], key, "step", marker="o-" if evaluated else "-")
        axis.set_title(LABELS.get(key, key), fontsize=9)
        axis.set_ylabel("")
    for axis in panels[len(keys):]:
        axis.set_visible(False)
    return "<h2>Other figures</h2>\n" + image(png_bytes(figure), "other logged figures: " + ", ".join(keys))


def _evaluations(run: RunRecord) -> str:
    """Every figure logged at evaluations, a row per step, then each one's final value."""
    by_step: dict[int, dict] = {}
    for record in run.evals:
        by_step.setdefault(record["step"], {}).update({k: v for k, v in record.items() if k != "step"})
    if not by_step:
        return "<h2>Evaluations</h2>\n" + _note("no evaluations logged")
    keys = list(dict.fromkeys(key for figures in by_step.values() for key in figures))
    steps = sorted(by_step)
    tokens = run.x_values(steps, "tokens")
    rows = [[f"{step:,}", f"{int(count):,}"] + [_number(by_step[step].get(key, "")) for key in keys] for step, count in zip(steps, tokens)]
    final = []
    for key in keys:
        last = max(step for step in steps if key in by_step[step])
        final.append([LABELS.get(key, key), _number(by_step[last][key]), f"{last:,}"])
    best = run.summary()["best_val_loss"]
    if best is not None:
        final.append(["best val loss", _number(best), ""])
    return ("<h2>Evaluations</h2>\n" + table(["step", "tokens", *keys], rows) + "<h3>Final</h3>\n"
            + table(["figure", "value", "at step"], final))


def _card(run: RunRecord) -> str:
    """Each report card `gptlab eval` saved for this run's model (RUN/eval-*/eval.json): its table and aggregates."""
    if not run.cards:
        return "<h2>Report card</h2>\n" + _note(f"no report card: gptlab eval {run.path} --suite core (or --suite chat) writes one")
    return "\n".join(_one_card(name, card) for name, card in run.cards.items())


def _one_card(name: str, card: dict) -> str:
    settings = card.get("settings") or {}
    said = ", ".join(f"{key} {value}" for key, value in settings.items() if isinstance(value, (str, int, float)))
    rows = [[row["task"], row["shots"], row["metric"], f"{row['score']:.4f}", f"{row['low']:.4f} to {row['high']:.4f}",
             f"{row['chance']:.2f}", f"{row['n']:,}", row.get("note", "")] for row in card["rows"]]
    aggregates = [[item["name"], f"{item['score']:.4f}", f"{item['low']:.4f} to {item['high']:.4f}", ", ".join(item["tasks"])]
                  for item in card.get("aggregates", [])]
    return (f"<h2>Report card ({escape(name)})</h2>\n" + _note(f"model {card.get('model', '?')}" + (f"; {said}" if said else ""))
            + table(["task", "shots", "metric", "score", "95% interval", "chance", "n", "note"], rows)
            + (f"<h3>Aggregates ({escape(name)})</h3>\n" + table(["aggregate", "score", "95% interval", "over"], aggregates)
               if aggregates else ""))


def _samples(run: RunRecord) -> str:
    if not run.samples:
        return "<h2>Samples</h2>\n" + _note("the run printed no samples")
    body = "\n".join(f"<h3>step {sample['step']:,}</h3>\n<pre>{escape(str(sample['text']))}</pre>" for sample in run.samples)
    return "<h2>Samples</h2>\n" + body


def _key_values(title: str, values: dict | None, missing: str) -> str:
    if not values:
        return f"<h2>{escape(title)}</h2>\n" + _note(missing)
    rows = [[key, value if isinstance(value, str) else json.dumps(value)] for key, value in values.items()]
    return f"<h2>{escape(title)}</h2>\n" + table(["field", "value"], rows, "fields")


def _flatten(config: dict, prefix: str = "") -> dict:
    """{"model": {"n_layer": 2}} -> {"model.n_layer": 2}: the dotted names the command line takes."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat
