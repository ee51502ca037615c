"""Curves of one or more runs, drawn with matplotlib (Agg, no display) into PNG bytes.

    figure, axes = subplots(1, 2)
    draw(axes[0], [run], "loss", x="tokens")      # a run's train loss against tokens seen
    png = png_bytes(figure)                       # the figure as PNG bytes; the figure is closed

Not here: which panels a report or a comparison shows (gptlab.runs.report, gptlab.runs.compare).
"""

from __future__ import annotations

import io

from gptlab.runs.record import RunRecord

AXIS_LABELS = {"step": "step", "tokens": "tokens", "time": "training time", "flops": "training FLOPs"}
LABELS = {"loss": "train loss", "val_loss": "val loss", "val_bpb": "val bits per byte",
          "tokens_per_s": "tokens/s", "mfu": "MFU (fraction of peak)", "lr": "learning rate", "grad_norm": "gradient norm",
          "moe_max_load": "max / mean expert load (worst layer)", "moe_aux_loss": "MoE balance losses in the loss"}
TIME_UNITS = ((7200, 3600, "h"), (120, 60, "min"), (0, 1, "s"))  # (from this many seconds, divide by, unit)
SUFFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))  # tokens and steps: 1.2M, not 1200000
X_TICKS = 6  # at most this many labelled ticks on x: seven-digit labels on a 4.6-inch panel would touch


def compact(value: float) -> str:
    """A tick label short enough to stand beside its neighbours: 1200000 -> "1.2M", 2500 -> "2.5k", 180 -> "180"."""
    for size, suffix in SUFFIXES:
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}"


def scientific(value: float) -> str:
    """FLOPs as a tick label: 0 -> "0", 3e+15 -> "3e15", 1.25e+16 -> "1.25e16"."""
    if value == 0:
        return "0"
    mantissa, exponent = f"{value:.2e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only), imported when something is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def subplots(rows: int, columns: int, *, width: float = 4.6, height: float = 3.0):
    """A grid of panels, each `width` x `height` inches with fixed margins for its labels.

    Fixed margins instead of tight_layout: that would draw the figure once more just to measure its
    text, and drawing is most of the cost of a report the Trainer refreshes at every checkpoint.
    """
    left, right, bottom, top = 0.75, 0.2, 0.55, 0.35  # inches around each panel: tick labels, axis labels, a title
    figure, axes = pyplot().subplots(rows, columns, figsize=(width * columns, height * rows), dpi=80, squeeze=False)
    figure.subplots_adjust(left=left / (width * columns), right=1 - right / (width * columns),
                           bottom=bottom / (height * rows), top=1 - top / (height * rows),
                           wspace=(left + right) / (width - left - right), hspace=(bottom + top) / (height - bottom - top))
    return figure, axes


def png_bytes(figure, software: str | None = None) -> bytes:
    """The figure as PNG (with a Software text chunk when given), then closed to free its memory."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": software} if software else None)
    pyplot().close(figure)
    return buffer.getvalue()


def _time_scale(runs: list[RunRecord]) -> tuple[float, str]:
    longest = max((r.get("elapsed") or 0 for run in runs for r in run.train), default=0)
    return next((divide, unit) for start, divide, unit in TIME_UNITS if longest >= start)


def draw(axis, runs: list[RunRecord], key: str, x: str = "step", *, label: str | None = None, marker: str = "") -> list[tuple]:
    """Each run's `key` against `x` on `axis`, labelled by run (or `label` for one run); the (xs, ys) drawn ([] if none)."""
    divide, unit = _time_scale(runs) if x == "time" else (1, "")
    drawn = []
    for run in runs:
        xs, ys = run.series(key, x)
        if ys:
            xs = [value / divide for value in xs]
            style = marker if len(ys) > 1 else "o"  # a line through one point draws nothing: a run of one record is a dot
            axis.plot(xs, ys, style, label=label or run.name, linewidth=1.2, markersize=4)
            drawn.append((xs, ys))
    axis.set_xlabel(AXIS_LABELS[x] + (f" ({unit})" if unit else ""))
    _x_ticks(axis, scientific if x == "flops" else compact)
    axis.set_ylabel(LABELS.get(key, key))
    axis.grid(alpha=0.3)
    return drawn


def _x_ticks(axis, label) -> None:
    """Few ticks at round values, each labelled by `label` (no offset text for the eye to combine)."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    axis.xaxis.set_major_locator(MaxNLocator(nbins=X_TICKS - 1, steps=[1, 2, 2.5, 5, 10]))
    axis.xaxis.set_major_formatter(FuncFormatter(lambda value, _: label(value)))


def zoom_past_start(axis, drawn: list[tuple]) -> None:
    """Scale y to the curves past the first tenth of x: a loss falls from ~ln(vocab) so fast that its start
    would flatten everything after it. Only for curves of 20+ points, whose first tenth is a start."""
    if not drawn or sum(len(ys) for _, ys in drawn) < 20:
        return
    start, end = min(xs[0] for xs, _ in drawn), max(xs[-1] for xs, _ in drawn)
    later = [y for xs, ys in drawn for x, y in zip(xs, ys) if x >= start + 0.1 * (end - start)]
    low, high = min(min(ys) for _, ys in drawn), max(later, default=None)
    if high is not None and high > low:
        axis.set_ylim(low - 0.05 * (high - low), high + 0.05 * (high - low))


def nothing_logged(axis, why: str) -> None:
    """An empty panel that says why it is empty."""
    axis.text(0.5, 0.5, why, ha="center", va="center", transform=axis.transAxes, color="gray")
    axis.set_xticks([])
    axis.set_yticks([])
