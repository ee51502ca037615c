"""Scaling laws fitted to a sweep's results: Chinchilla approaches 2 and 3 with bootstrap intervals, a learning-rate
rule, and the depth dial the trainer inverts.

Input: the rows `gptlab sweep` writes, one dict per run; only status "finished" counts. Fields used: budget
(the run's target FLOPs C, the IsoFLOP group), params[count] (N), tokens (D), lr, and the chosen loss.
Per (budget, size) the run with the lowest loss over its learning rates stands for that size.

    approach 2   per budget, a parabola of loss in ln N; its minimum N*, D* = C / (6 N*);
                 then N_opt = k C^a and D_opt = k' C^b over budgets (Hoffmann et al. 2022, section 3.2)
    approach 3   L(N, D) = E + A / N^alpha + B / D^beta fitted to every size (gptlab.scaling.laws)
    intervals    95% percentile bootstrap: runs resampled within each budget (approach 2) or over all (approach 3)
    lr rule      lr_opt = k N^g over the sizes run at 3 or more learning rates
    depth dial   N_opt(C) = k C^a: a model of N params trains on D = C / (6 N) tokens with C = (N / k)^(1/a)

Output: a JSON-ready dict, format "gptlab-fit" version 1 (see `fit_results`); `summary` (gptlab.scaling.report,
re-exported here) words it. Not here: the formulas and optimisers (gptlab.scaling.laws), the figures
(gptlab.scaling.plots), running sweeps (gptlab.scaling.sweep).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gptlab.model.accounting import PARAM_CONVENTIONS
from gptlab.runtime import GptlabError, read_json
from gptlab.runtime.processes import one_blas_thread
from gptlab.scaling.laws import (
    ParametricFit,
    ParametricFitter,
    ParametricLaw,
    fit_parabola,
    fit_power_law,
    parabola_minimum,
)
from gptlab.scaling.report import summary
from gptlab.train.config import DepthRule

__all__ = ["Runs", "best_over_lrs", "budget_for", "depth_rule", "finished_runs", "fit_results", "interval", "isoflop_minimum",
           "read_depth_rule", "summary", "tokens_for"]

COUNTS = PARAM_CONVENTIONS  # conventions for N: Chinchilla's, Kaplan's, the weights matmuls use
LOSSES = ("val_loss", "train_loss", "val_bpb")
MIN_RUNS = 5  # a parametric law has 5 parameters
BOOTSTRAP_STARTS = 1  # best grid points per bootstrap refit, beside the full data's optimum (2 gave the same intervals, 1.5x slower)
PROGRESS_STEPS = 10  # lines the parametric bootstrap, most of a fit's time, reports as it goes

Progress = Callable[[str], None] | None  # told one line per stage of a fit, and the bootstrap's count as it goes


def _say(progress: Progress, line: str) -> None:
    if progress is not None:
        progress(line)


@dataclass(frozen=True)
class Runs:
    """Runs as columns: run i is (budgets[i], params[i], tokens[i], losses[i], lrs[i]); lr is NaN when not recorded."""

    names: list[str]
    budgets: np.ndarray
    params: np.ndarray
    tokens: np.ndarray
    losses: np.ndarray
    lrs: np.ndarray

    def take(self, index) -> Runs:
        index = np.asarray(index, dtype=int)
        return Runs([self.names[i] for i in index], *(column[index] for column in self.columns()))

    def columns(self) -> tuple[np.ndarray, ...]:
        return self.budgets, self.params, self.tokens, self.losses, self.lrs


def finished_runs(rows: Sequence[dict], *, count: str = "total", loss: str = "val_loss") -> tuple[Runs, dict[str, int]]:
    """The finished rows as `Runs`, and how many rows ended otherwise, by status ({"failed": 2, "diverged": 1}).

    Raises GptlabError for an unknown `count`, fewer than 5 finished runs, or a finished run without the loss,
    the count, or positive finite values.
    """
    if count not in COUNTS:
        raise GptlabError(f"unknown parameter count {count!r}: choose one of {', '.join(COUNTS)}")
    finished = [row for row in rows if row.get("status") == "finished"]
    unfinished: dict[str, int] = {}
    for row in rows:
        if row.get("status") != "finished":
            unfinished[str(row.get("status"))] = unfinished.get(str(row.get("status")), 0) + 1
    if len(finished) < MIN_RUNS:
        ended = ", ".join(f"{number} {status}" for status, number in sorted(unfinished.items())) or "none other"
        raise GptlabError(f"{len(finished)} of {len(rows)} runs finished ({ended}): a fit needs at least {MIN_RUNS} "
                          "finished runs; sweep more sizes or budgets, or fix what made runs fail")
    _check_fields(finished, count, loss)
    columns = [[float(row[key]) for row in finished] for key in ("budget", "tokens", loss)]
    lrs = [float(row["lr"]) if row.get("lr") is not None else np.nan for row in finished]
    params = [float(row["params"][count]) for row in finished]
    runs = Runs([str(row.get("run", "?")) for row in finished], np.array(columns[0]), np.array(params),
                np.array(columns[1]), np.array(columns[2]), np.array(lrs))
    values = np.array(runs.columns()[:4])
    bad = np.flatnonzero(~np.all(np.isfinite(values) & (values > 0), axis=0))
    if len(bad):
        budget, params, tokens, value = values[:, bad[0]]
        raise GptlabError(f"run {runs.names[bad[0]]} is marked finished but has budget {budget:.4g}, params {params:.4g}, "
                          f"tokens {tokens:.4g}, {loss} {value:.4g}: all must be positive numbers; mark it diverged or "
                          "remove it from the results")
    return runs, unfinished


def _check_fields(finished: list[dict], count: str, loss: str) -> None:
    """Every finished row has the loss (else: which loss every run has) and params[count]."""
    missing = [row.get("run", "?") for row in finished if row.get(loss) is None]
    if missing:
        others = [key for key in LOSSES if key != loss and all(row.get(key) is not None for row in finished)]
        fix = f"pass --loss {others[0]}" if others else f"choose a loss every run recorded ({', '.join(LOSSES)})"
        raise GptlabError(f"{len(missing)} of {len(finished)} finished runs have no {loss!r} (first: {missing[0]}); {fix}")
    for row in finished:
        params = row.get("params") if isinstance(row.get("params"), dict) else {}
        if params.get(count) is None:
            raise GptlabError(f"run {row.get('run')} has no params[{count!r}] (it has {sorted(params)}); "
                              f"pass a count it has: {', '.join(COUNTS)}")
        for name, value in (("budget", row.get("budget")), ("tokens", row.get("tokens")), (loss, row[loss]),
                            (f"params[{count!r}]", params[count])):
            if isinstance(value, bool) or not isinstance(value, (int, float)):  # else float() fails with no run named
                raise GptlabError(f"run {row.get('run', '?')} is marked finished but its {name} is {value!r}, not a number; "
                                  "mark it failed or remove it from the results")


def best_over_lrs(runs: Runs) -> Runs:
    """One run per (budget, size): the lowest loss over its learning rates, since each size deserves its best lr."""
    best: dict[tuple[float, float], int] = {}
    for index, key in enumerate(zip(runs.budgets.tolist(), runs.params.tolist())):
        if key not in best or runs.losses[index] < runs.losses[best[key]]:
            best[key] = index
    return runs.take(sorted(best.values(), key=lambda index: (runs.budgets[index], runs.params[index])))


def isoflop_minimum(budget: float, params, losses, tokens=None) -> dict:
    """One IsoFLOP curve's optimum: the lowest run, and the minimum of L = c2 (ln N)^2 + c1 ln N + c0 (approach 2).

    The parabola is None when it cannot have a minimum (fewer than 3 sizes, or c2 <= 0: the loss does not curve up);
    `inside` says whether its minimum lies within the sizes run, where it interpolates rather than extrapolates.
    The lowest run's tokens are its own (`tokens`) or C / (6 N); the parabola's are C / (6 N*).
    """
    params, losses = np.asarray(params, dtype=float), np.asarray(losses, dtype=float)
    lowest = int(np.argmin(losses))
    lowest_tokens = float(tokens[lowest]) if tokens is not None else budget / (6 * params[lowest])
    result = {"budget": float(budget), "sizes": len(np.unique(params)), "parabola": None,
              "lowest": {"params": float(params[lowest]), "tokens": lowest_tokens, "loss": float(losses[lowest])}}
    coefficients = fit_parabola(np.log(params), losses)
    minimum = parabola_minimum(coefficients)
    if minimum is not None and np.isfinite(np.exp(minimum)):
        c2, c1, c0 = coefficients
        size = float(np.exp(minimum))
        result["parabola"] = {"params": size, "tokens": budget / (6 * size), "loss": c0 - c1**2 / (4 * c2),
                              "coefficients": [c2, c1, c0], "inside": bool(params.min() <= size <= params.max())}
    return result


def _curves(points: Runs) -> list[tuple[float, np.ndarray, np.ndarray, np.ndarray]]:
    """(budget, params, tokens, losses) of each budget's IsoFLOP curve, budgets ascending."""
    return [(budget, *(column[points.budgets == budget] for column in (points.params, points.tokens, points.losses)))
            for budget in np.unique(points.budgets).tolist()]


def _isoflop_optima(curves, method: str) -> np.ndarray | None:
    """Rows (C, N*, D*) of each curve's optimum by `method` ("parabola" or "lowest"); None if a parabola is degenerate."""
    optima = []
    for budget, params, tokens, losses in curves:
        minimum = isoflop_minimum(budget, params, losses, tokens)
        chosen = minimum["lowest"] if method == "lowest" else minimum["parabola"]
        if chosen is None:
            return None
        optima.append((budget, chosen["params"], chosen["tokens"]))
    return np.array(optima)


def _power_laws(optima: np.ndarray) -> tuple[float, float, float, float]:
    """(k, a, k', b) of N* = k C^a and D* = k' C^b."""
    return (*fit_power_law(optima[:, 0], optima[:, 1]), *fit_power_law(optima[:, 0], optima[:, 2]))


def interval(values) -> list[float] | None:
    """The 95% percentile bootstrap interval [2.5%, 97.5%] of the finite values; None with fewer than 2."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return None if len(values) < 2 else [float(value) for value in np.percentile(values, [2.5, 97.5])]


def _resample(curve, rng: np.random.Generator):
    """The curve's runs drawn with replacement, as many as it has: the budget is kept, so each budget stays a curve."""
    budget, *columns = curve
    pick = rng.integers(0, len(columns[0]), len(columns[0]))
    return (budget, *(column[pick] for column in columns))


def _approach_2(curves, minima, targets, samples, rng) -> tuple[dict | None, list[dict | None], list[str]]:
    """The IsoFLOP power laws over budgets, with intervals, and their predictions at the targets."""
    inside = [curve for curve, minimum in zip(curves, minima) if minimum["parabola"] and minimum["parabola"]["inside"]]
    notes = []
    if len(inside) >= 2:
        method, used = "parabola", inside
    elif len(curves) >= 2:
        method, used = "lowest", curves
        notes.append(f"{len(inside)} of {len(curves)} budgets have a parabola minimum inside the sizes run: the power "
                     "laws use each budget's lowest run, which can only land on a size you ran")
    else:
        return None, [None] * len(targets), ["one budget only: sweep at least 2 budgets (3 or more) for power laws over C"]
    fitted = _power_laws(_isoflop_optima(used, method))
    replicates = []
    for _ in range(samples):
        optima = _isoflop_optima([_resample(curve, rng) for curve in used], method)
        if optima is not None and np.all(np.isfinite(optima)) and np.all(optima[:, 1:] > 0):
            replicates.append(_power_laws(optima))
    replicates = np.array(replicates).reshape(-1, 4)
    laws = {"method": method, "bootstrap_valid": len(replicates), "bootstrap_samples": samples,
            "budgets": [float(curve[0]) for curve in used]}
    for name, column in (("params", 0), ("tokens", 2)):
        laws[name] = {"coefficient": fitted[column], "exponent": fitted[column + 1],
                      "exponent_ci": interval(replicates[:, column + 1])}
    predictions = []
    for budget in targets:
        params, tokens = fitted[0] * budget ** fitted[1], fitted[2] * budget ** fitted[3]
        predictions.append({"params": params, "params_ci": interval(replicates[:, 0] * budget ** replicates[:, 1]),
                            "tokens": tokens, "tokens_ci": interval(replicates[:, 2] * budget ** replicates[:, 3]),
                            "tokens_per_param": tokens / params})
    if samples and len(replicates) < 0.5 * samples:
        notes.append(f"only {len(replicates)} of {samples} bootstrap replicates of the IsoFLOP parabolas were usable: "
                     "add sizes per budget for steadier intervals")
    return laws, predictions, notes


def _law_row(law: ParametricLaw, targets) -> list[float]:
    """E, A, B, alpha, beta, a, b, then N_opt, D_opt and L(N_opt, D_opt) at each target: one bootstrap row."""
    row = [law.E, law.A, law.B, law.alpha, law.beta, law.params_exponent, law.tokens_exponent]
    for budget in targets:
        params, tokens = law.compute_optimal(budget)
        row += [float(params), float(tokens), float(law.loss(params, tokens))]
    return row


def _refits(fitter: ParametricFitter, full: ParametricFit, targets, samples: int, rng, progress: Progress = None) -> np.ndarray:
    """Bootstrap rows (see _law_row) of the law refitted to runs drawn with replacement (as weights: a run drawn
    twice counts twice), from the full data's optimum and the best grid points; refits without exponents > 0 dropped."""
    count = len(fitter.log_losses)
    replicates = []
    every = max(1, -(-samples // PROGRESS_STEPS))
    for done in range(1, samples + 1):
        weights = np.bincount(rng.integers(0, count, count), minlength=count)
        law = fitter.fit(weights, starts=BOOTSTRAP_STARTS, extra_starts=[full.theta]).law
        if law.alpha > 0 and law.beta > 0 and np.isfinite([law.A, law.B, law.E]).all():
            replicates.append(_law_row(law, targets))
        if done % every == 0 or done == samples:
            _say(progress, f"fit: parametric bootstrap {done}/{samples} refits ({len(replicates)} usable)")
    return np.array(replicates).reshape(len(replicates), 7 + 3 * len(targets))


def _approach_3(points: Runs, targets, samples, rng, delta: float,
                progress: Progress = None) -> tuple[dict | None, list[dict | None], list[str]]:
    """The parametric law L(N, D) with intervals, and its compute-optimal predictions at the targets."""
    if len(points.losses) < MIN_RUNS:
        return None, [None] * len(targets), [f"{len(points.losses)} (budget, size) points: the parametric law "
                                             f"needs at least {MIN_RUNS}; sweep more sizes"]
    with one_blas_thread():
        fitter = ParametricFitter(points.params, points.tokens, points.losses, delta=delta)
        full = fitter.fit()
        if not (full.law.alpha > 0 and full.law.beta > 0):
            parametric = {"E": full.law.E, "A": full.law.A, "B": full.law.B, "alpha": full.law.alpha, "beta": full.law.beta,
                          "ci": None, "huber_delta": delta, "objective": full.objective, "bootstrap_valid": 0,
                          "bootstrap_samples": samples}
            return parametric, [None] * len(targets), [
                f"the parametric fit has alpha = {full.law.alpha:.3g}, beta = {full.law.beta:.3g}: with an exponent <= 0 "
                "there is no compute-optimal size; sweep sizes and budgets over a wider range"]
        _say(progress, f"fit: parametric L(N, D) fitted to {len(points.losses)} points; {samples} bootstrap refits")
        replicates = _refits(fitter, full, targets, samples, rng, progress)
    fitted = _law_row(full.law, targets)
    names = ("E", "A", "B", "alpha", "beta", "params_exponent", "tokens_exponent")
    parametric = {name: fitted[column] for column, name in enumerate(names)}
    parametric.update(ci={name: interval(replicates[:, column]) for column, name in enumerate(names)},
                      huber_delta=delta, objective=full.objective, bootstrap_valid=len(replicates), bootstrap_samples=samples)
    predictions = []
    for target in range(len(targets)):
        column = len(names) + 3 * target
        params, tokens, loss = fitted[column:column + 3]
        predictions.append({"params": params, "params_ci": interval(replicates[:, column]), "tokens": tokens,
                            "tokens_ci": interval(replicates[:, column + 1]), "tokens_per_param": tokens / params,
                            "loss": loss, "loss_ci": interval(replicates[:, column + 2])})
    return parametric, predictions, []


def _best_lr(lrs: np.ndarray, losses: np.ndarray) -> tuple[float, bool]:
    """One size's best lr: the minimum of a parabola of loss in ln lr when it lies within the lrs tried, else the
    lowest run's lr; and whether that is an edge of the lrs tried (the true best may lie beyond it)."""
    minimum = parabola_minimum(fit_parabola(np.log(lrs), losses))
    if minimum is not None and np.log(lrs.min()) <= minimum <= np.log(lrs.max()):
        return float(np.exp(minimum)), False
    lowest = float(lrs[np.argmin(losses)])
    return lowest, lowest in (lrs.min(), lrs.max())


def _lr_curves(runs: Runs) -> tuple[list[tuple[float, float, np.ndarray, np.ndarray]], str | None]:
    """(budget, N, lrs, losses) of each (budget, size) run at 3 or more lrs; or [] and why no rule can be fitted."""
    groups: dict[tuple[float, float], list[int]] = {}
    for index in np.flatnonzero(np.isfinite(runs.lrs)):
        groups.setdefault((float(runs.budgets[index]), float(runs.params[index])), []).append(int(index))
    varied = {key: index for key, index in groups.items() if len(np.unique(runs.lrs[index])) >= 3}
    sizes_per_budget = [sum(budget == key[0] for key in varied) for budget in {key[0] for key in varied}]
    if max(sizes_per_budget, default=0) >= 2:
        return [(*key, runs.lrs[index], runs.losses[index]) for key, index in varied.items()], None
    if not groups:
        return [], "the rows record no learning rates"
    most = max(len(np.unique(runs.lrs[index])) for index in groups.values())
    if most < 3:
        reason = "one learning rate per size" if most == 1 else f"at most {most} learning rates per size"
        return [], f"{reason}: sweep --lr-scales 0.5,1,2 to fit a rule"
    return [], "3 or more learning rates at only one size per budget: sweep --lr-scales at 2 or more sizes"


def _lr_rule(runs: Runs, samples: int, rng: np.random.Generator) -> tuple[dict | None, list[str]]:
    """lr_opt = k N^g over the sizes run at 3+ lrs (budgets pooled), with a bootstrap interval on g that resamples
    runs within each (budget, size)."""
    curves, why = _lr_curves(runs)
    if why:
        return None, [f"no learning-rate rule: {why}"]
    best = [_best_lr(lrs, losses) for _, _, lrs, losses in curves]
    notes = [f"budget {budget:.3g}, N = {params:.3g}: the best lr ({lr:.3g}) is an edge of the lrs tried; widen --lr-scales"
             for (budget, params, _, _), (lr, edge) in zip(curves, best) if edge]
    sizes = [params for _, params, _, _ in curves]
    coefficient, exponent = fit_power_law(sizes, [lr for lr, _ in best])
    exponents = []
    for _ in range(samples):
        picks = [rng.integers(0, len(lrs), len(lrs)) for _, _, lrs, _ in curves]
        resampled = [_best_lr(lrs[pick], losses[pick])[0] for (_, _, lrs, losses), pick in zip(curves, picks)]
        exponents.append(fit_power_law(sizes, resampled)[1])
    return {"coefficient": coefficient, "exponent": exponent, "exponent_ci": interval(exponents),
            "points": [[params, lr] for params, (lr, _) in zip(sizes, best)]}, notes


def _isoflop_notes(minima: list[dict]) -> list[str]:
    """What each IsoFLOP curve lacks: sizes, curvature, or sizes on both sides of its minimum."""
    notes = []
    for minimum in minima:
        budget, parabola, sizes = minimum["budget"], minimum["parabola"], minimum["sizes"]
        if sizes < 3:
            notes.append(f"budget {budget:.3g}: {sizes} size(s), a parabola needs 3 or more")
        elif parabola is None:
            notes.append(f"budget {budget:.3g}: the loss does not curve upwards in ln N (no minimum); add sizes on "
                         f"both sides of the lowest run (N = {minimum['lowest']['params']:.3g})")
        elif not parabola["inside"]:
            side = "larger" if parabola["params"] > minimum["lowest"]["params"] else "smaller"
            notes.append(f"budget {budget:.3g}: the parabola's minimum (N = {parabola['params']:.3g}) lies outside the "
                         f"sizes run; add {side} sizes")
    return notes


def _depth_dial(count: str, power_laws: dict | None, parametric: dict | None, lr: dict | None) -> dict | None:
    """N_opt(C) = k C^a for the trainer: from the IsoFLOP power law when there is one, else the parametric law."""
    if power_laws is not None and power_laws["params"]["exponent"] > 0:
        params, source = power_laws["params"], "isoflop"
    elif parametric is not None and parametric["alpha"] > 0 and parametric["beta"] > 0:
        law = ParametricLaw(**{name: parametric[name] for name in ("E", "A", "B", "alpha", "beta")})
        coefficient, exponent = law.params_power_law()
        params, source = {"coefficient": coefficient, "exponent": exponent}, "parametric"
    else:
        return None
    return {"count": count, "params": {"coefficient": params["coefficient"], "exponent": params["exponent"]},
            "source": source, "lr": None if lr is None else {"coefficient": lr["coefficient"], "exponent": lr["exponent"]}}


def fit_results(rows: Sequence[dict], *, count: str = "total", loss: str = "val_loss", targets: Sequence[float] = (),
                samples: int = 500, seed: int = 0, huber_delta: float = 1e-3, progress: Progress = None) -> dict:
    """The whole fit of a sweep's rows as a JSON-ready dict (format "gptlab-fit", version 1).

    Keys: isoflop (each budget's lowest run and parabola), power_laws (approach 2), parametric (approach 3),
    predictions (at each target budget, by both), lr (the learning-rate rule), depth_dial, notes. A part the data
    cannot support is None, with a note saying what to sweep; fewer than 5 finished runs is a GptlabError.
    `progress`, when given, is told a line per stage (a fit of 500 resamples takes a minute or two).
    """
    targets = [float(target) for target in targets]
    if any(not target > 0 for target in targets) or samples < 0:
        raise GptlabError(f"targets must be positive FLOP budgets (got {targets}) and samples >= 0 (got {samples})")
    runs, unfinished = finished_runs(rows, count=count, loss=loss)
    rng = np.random.default_rng(seed)
    points = best_over_lrs(runs)
    curves = _curves(points)
    minima = [isoflop_minimum(budget, params, losses, tokens) for budget, params, tokens, losses in curves]
    _say(progress, f"fit: {len(runs.losses)} finished runs, {len(points.losses)} (budget, size) points over {len(curves)} "
                   f"budgets; IsoFLOP power laws with {samples} bootstrap resamples")
    power_laws, by_isoflop, isoflop_notes = _approach_2(curves, minima, targets, samples, rng)
    _say(progress, "fit: parametric L(N, D) (the longest stage)")
    parametric, by_parametric, parametric_notes = _approach_3(points, targets, samples, rng, huber_delta, progress)
    _say(progress, f"fit: learning-rate rule with {samples} bootstrap resamples")
    lr, lr_notes = _lr_rule(runs, samples, rng)
    largest = float(points.budgets.max())
    far = [f"target {target:.3g} extrapolates {np.log10(target / largest):.1f} decades beyond the largest budget run "
           f"({largest:.3g})" for target in targets if target > 10 * largest]
    return {
        "format": "gptlab-fit", "version": 1, "count": count, "loss": loss, "runs": len(runs.losses),
        "failed_runs": sum(unfinished.values()), "unfinished": unfinished, "isoflop": minima, "power_laws": power_laws,
        "parametric": parametric,
        "predictions": [{"budget": target, "isoflop": isoflop, "parametric": law}
                        for target, isoflop, law in zip(targets, by_isoflop, by_parametric)],
        "lr": lr, "depth_dial": _depth_dial(count, power_laws, parametric, lr),
        "notes": _isoflop_notes(minima) + isoflop_notes + parametric_notes + lr_notes + far,
    }


def depth_rule(depth_dial: dict, source: str = "") -> DepthRule:
    """The depth dial's rule (gptlab.train.config.DepthRule) from a fit's depth_dial: its N_opt(C) law and lr law."""
    lr = depth_dial.get("lr")
    return DepthRule(count=depth_dial["count"], source=source,
                     params_law=(depth_dial["params"]["coefficient"], depth_dial["params"]["exponent"]),
                     lr_law=(lr["coefficient"], lr["exponent"]) if lr else None)


def read_depth_rule(path: str | os.PathLike) -> DepthRule:
    """`gptlab train --from-fit FILE`: the depth rule of a fit.json written by `gptlab fit`, checked."""
    path = Path(path)
    if path.is_dir():
        path = path / "fit.json"
    if not path.is_file():
        raise GptlabError(f"--from-fit {path}: no such file; pass the fit.json that `gptlab fit` wrote")
    fit = read_json(path)
    if not isinstance(fit, dict) or fit.get("format") != "gptlab-fit":
        raise GptlabError(f"--from-fit {path} is not a fit made by `gptlab fit`")
    if fit.get("version") != 1:
        raise GptlabError(f"--from-fit {path} is fit format version {fit.get('version')}; this gptlab reads 1")
    if not fit.get("depth_dial"):
        raise GptlabError(f"--from-fit {path} has no compute-optimal law (the sweep was too small to fit one; see its notes)")
    return depth_rule(fit["depth_dial"], source=str(path))


def tokens_for(depth_dial: dict, params: float) -> float:
    """Tokens to train a model of `params` parameters on (counted as depth_dial["count"]), inverting N_opt(C) = k C^a:
    C = (N / k)^(1/a), D = C / (6 N). Example, EPOCH's dial: 72.3e9 params -> 1.33e12 tokens."""
    if not params > 0:
        raise GptlabError(f"params must be a positive parameter count, got {params}")
    return depth_rule(depth_dial).tokens(params)


def budget_for(depth_dial: dict, params: float) -> float:
    """The FLOP budget C for which a model of `params` parameters is compute-optimal: C = (N / k)^(1/a) = 6 N D."""
    return 6 * params * tokens_for(depth_dial, params)
