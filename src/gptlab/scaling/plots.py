"""Figures of a scaling fit, drawn with matplotlib (Agg, no display) into PNG files written atomically.

    plot_isoflops(fit, rows, path)     loss against N (log x) per budget: the runs, each budget's parabola, its minima
    plot_power_laws(fit, path)         N_opt(C) and D_opt(C) on log-log panels: the IsoFLOP minima, the fitted power
                                       laws and the parametric law's optimum, extended to the target budgets, whose
                                       predictions carry their 95% bootstrap intervals as vertical lines
    plot_parametric(fit, rows, path)   the parametric law's predicted loss against each size's observed loss

Each returns the path written, or None when the fit has nothing to draw there (no file is written then).
Not here: the fit itself (gptlab.scaling.fit).
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gptlab.runs.plots import pyplot
from gptlab.runtime import atomic_write_bytes
from gptlab.scaling.fit import best_over_lrs, finished_runs
from gptlab.scaling.laws import ParametricLaw

LAW_FIELDS = ("E", "A", "B", "alpha", "beta")


def _save(figure, path: str | os.PathLike) -> Path:
    """The figure as a PNG at `path`, written atomically (never half a file), then closed to free its memory."""
    buffer = io.BytesIO()
    try:
        figure.savefig(buffer, format="png", dpi=100)
    finally:
        pyplot().close(figure)
    atomic_write_bytes(path, buffer.getvalue())
    return Path(path)


def _colours(count: int) -> list:
    """One colour per budget, light to dark as the budget grows."""
    import matplotlib

    return list(matplotlib.colormaps["viridis"](np.linspace(0.1, 0.85, max(count, 1))))


def plot_isoflops(fit: dict, rows: Sequence[dict], path: str | os.PathLike) -> Path:
    """Loss against N per budget: every finished run (faint where another lr of its size did better), the parabola
    in ln N as a curve, its minimum as a star and the lowest run as a ring."""
    runs, _ = finished_runs(rows, count=fit["count"], loss=fit["loss"])
    best = best_over_lrs(runs)
    figure, axis = pyplot().subplots(figsize=(7, 4.5))
    for colour, minimum in zip(_colours(len(fit["isoflop"])), fit["isoflop"]):
        budget = minimum["budget"]
        here, chosen = runs.budgets == budget, best.budgets == budget
        axis.scatter(runs.params[here], runs.losses[here], color=colour, alpha=0.3, s=14)
        axis.scatter(best.params[chosen], best.losses[chosen], color=colour, s=22, label=f"C = {budget:.3g}")
        parabola = minimum["parabola"]
        if parabola is not None:
            sizes = np.geomspace(best.params[chosen].min() / 1.5, best.params[chosen].max() * 1.5, 100)
            axis.plot(sizes, np.polyval(parabola["coefficients"], np.log(sizes)), color=colour, linewidth=1.2)
            axis.scatter([parabola["params"]], [parabola["loss"]], color=colour, marker="*", s=140, edgecolors="black",
                         linewidths=0.6, zorder=3)
        lowest = minimum["lowest"]
        axis.scatter([lowest["params"]], [lowest["loss"]], facecolors="none", edgecolors=colour, s=90, linewidths=1.2)
    axis.set_xscale("log")
    axis.set_xlabel(f"parameters N ({fit['count']})")
    axis.set_ylabel(fit["loss"])
    axis.set_title("IsoFLOP curves: * parabola minimum, o lowest run")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    figure.tight_layout()
    return _save(figure, path)


def _minima(fit: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(C, N*, D*) of the minima the power laws were fitted to: the parabolas', or the lowest runs'."""
    laws = fit["power_laws"]
    if laws is None:
        chosen = [(entry["budget"], entry["lowest"]) for entry in fit["isoflop"]]
    else:
        key = "parabola" if laws["method"] == "parabola" else "lowest"
        chosen = [(entry["budget"], entry[key]) for entry in fit["isoflop"] if entry["budget"] in laws["budgets"]]
    return (np.array([budget for budget, _ in chosen]), np.array([point["params"] for _, point in chosen]),
            np.array([point["tokens"] for _, point in chosen]))


def _draw_targets(axes, fit: dict) -> None:
    """Each target's predictions with their bootstrap intervals as vertical lines (isoflop: squares, parametric: diamonds)."""
    for method, marker, colour in (("isoflop", "s", "tab:blue"), ("parametric", "D", "tab:red")):
        for number, prediction in enumerate(prediction for prediction in fit["predictions"] if prediction[method]):
            guess = prediction[method]
            for axis, name in zip(axes, ("params", "tokens")):
                ci = guess[f"{name}_ci"]
                if ci is not None:  # a line, not error bars: a percentile interval need not hold its point estimate
                    axis.vlines(prediction["budget"], ci[0], ci[1], color=colour, linewidth=1.5)
                axis.plot([prediction["budget"]], [guess[name]], marker=marker, color=colour, markersize=5, linestyle="none",
                          label=None if number else f"{method} prediction")


def plot_power_laws(fit: dict, path: str | os.PathLike) -> Path | None:
    """N_opt(C) and D_opt(C) on log-log panels; None (nothing written) when the fit has neither law."""
    laws, parametric = fit["power_laws"], fit["parametric"]
    if laws is None and (parametric is None or "params_exponent" not in parametric):
        return None
    budgets, params, tokens = _minima(fit)
    which = "IsoFLOP parabola minima" if laws is not None and laws["method"] == "parabola" else "lowest run per budget"
    targets = [prediction["budget"] for prediction in fit["predictions"]]
    span = np.geomspace(min([*budgets, *targets]) / 2, max([*budgets, *targets]) * 2, 200)
    figure, axes = pyplot().subplots(1, 2, figsize=(11, 4.2))
    for axis, values, name, symbol in ((axes[0], params, "params", "N_opt"), (axes[1], tokens, "tokens", "D_opt")):
        axis.scatter(budgets, values, color="black", s=24, zorder=3, label=which)
        if laws is not None:
            law = laws[name]
            axis.plot(span, law["coefficient"] * span ** law["exponent"], color="tab:blue",
                      label=f"power law: {symbol} ∝ C^{law['exponent']:.3f}")
        if parametric is not None and "params_exponent" in parametric:
            optimum = ParametricLaw(**{field: parametric[field] for field in LAW_FIELDS}).compute_optimal(span)
            exponent = parametric["params_exponent" if name == "params" else "tokens_exponent"]
            axis.plot(span, optimum[0 if name == "params" else 1], color="tab:red", linestyle="--",
                      label=f"parametric law: {symbol} ∝ C^{exponent:.3f}")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("training FLOPs C")
        axis.set_ylabel(f"{symbol} ({'parameters, ' + fit['count'] if name == 'params' else 'tokens'})")
        axis.grid(alpha=0.3, which="both")
    _draw_targets(axes, fit)
    axes[0].legend(fontsize=8)
    figure.suptitle("compute-optimal size and data (vertical lines: 95% bootstrap intervals at the targets)", fontsize=10)
    figure.tight_layout()
    return _save(figure, path)


def plot_parametric(fit: dict, rows: Sequence[dict], path: str | os.PathLike) -> Path | None:
    """The parametric law's predicted loss against each size's best observed loss, coloured by budget, beside the
    line y = x; None (nothing written) when the fit has no parametric law."""
    if fit["parametric"] is None:
        return None
    law = ParametricLaw(**{field: fit["parametric"][field] for field in LAW_FIELDS})
    runs, _ = finished_runs(rows, count=fit["count"], loss=fit["loss"])
    best = best_over_lrs(runs)
    predicted = law.loss(best.params, best.tokens)
    figure, axis = pyplot().subplots(figsize=(5.5, 5))
    budgets = np.unique(best.budgets)
    for colour, budget in zip(_colours(len(budgets)), budgets):
        here = best.budgets == budget
        axis.scatter(best.losses[here], predicted[here], color=colour, s=22, label=f"C = {budget:.3g}")
    low, high = min(best.losses.min(), predicted.min()), max(best.losses.max(), predicted.max())
    axis.plot([low, high], [low, high], color="grey", linewidth=1, linestyle=":")
    axis.set_xlabel(f"observed {fit['loss']}")
    axis.set_ylabel("predicted by L(N, D)")
    axis.set_title(f"L = {law.E:.3f} + {law.A:.3g}/N^{law.alpha:.3f} + {law.B:.3g}/D^{law.beta:.3f}", fontsize=9)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    return _save(figure, path)
