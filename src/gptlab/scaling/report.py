"""A fit in words: `summary(fit)` turns the dict of gptlab.scaling.fit.fit_results into a few lines per section.

    IsoFLOP minima (approach 2)      one line per budget: its lowest run and its parabola's minimum
    power laws                       N_opt = k C^a, D_opt = k' C^b with 95% bootstrap intervals on the exponents
    parametric law (approach 3)      L(N, D) = E + A / N^alpha + B / D^beta with intervals
    predictions                      per target budget, by both, in tokens per parameter beside Chinchilla's and nanochat's
    learning rate, notes

Not here: computing any of it (gptlab.scaling.fit), figures (gptlab.scaling.plots).
"""

from __future__ import annotations

CHINCHILLA_TOKENS_PER_PARAM = 20  # Hoffmann et al. 2022: ~20 tokens per parameter at the compute optimum
NANOCHAT_TOKENS_PER_PARAM = 12  # nanochat's default data-to-params ratio for its depth dial


def _number(value: float | None) -> str:
    """3 significant figures, exponents without '+': 72300000000.0 -> '7.23e10'."""
    return "-" if value is None else f"{value:.3g}".replace("e+", "e")


def _interval(ci: list[float] | None) -> str:
    return "" if ci is None else f" [{_number(ci[0])}, {_number(ci[1])}]"


def _isoflop_lines(fit: dict) -> list[str]:
    lines = ["IsoFLOP minima (approach 2: a parabola of loss in ln N per budget)",
             f"  {'budget':>9} {'sizes':>5} {'lowest N':>9} {'loss':>7} {'parabola N':>11} {'tokens':>9} {'loss':>7}"]
    for minimum in fit["isoflop"]:
        lowest, parabola = minimum["lowest"], minimum["parabola"] or {}
        where = "" if not parabola or parabola["inside"] else "  (outside the sizes run)"
        lines.append(f"  {_number(minimum['budget']):>9} {minimum['sizes']:>5} {_number(lowest['params']):>9} "
                     f"{lowest['loss']:>7.4f} {_number(parabola.get('params')):>11} {_number(parabola.get('tokens')):>9} "
                     f"{format(parabola['loss'], '.4f') if parabola else '-':>7}{where}")
    laws = fit["power_laws"]
    if laws is None:
        return lines + ["  power laws: none (see notes)"]
    source = "parabola minima" if laws["method"] == "parabola" else "lowest runs"
    lines.append(f"  power laws over {len(laws['budgets'])} budgets ({source}; "
                 f"{laws['bootstrap_valid']} of {laws['bootstrap_samples']} bootstrap replicates usable):")
    for name, symbol in (("params", "N_opt"), ("tokens", "D_opt")):
        law = laws[name]
        lines.append(f"    {symbol} = {_number(law['coefficient'])} C^{law['exponent']:.3f}{_interval(law['exponent_ci'])}")
    return lines


def _parametric_lines(fit: dict) -> list[str]:
    law = fit["parametric"]
    if law is None:
        return ["parametric law (approach 3): none (see notes)"]
    ci = law["ci"] or {}
    lines = [f"parametric law (approach 3: Huber delta {law['huber_delta']:g} on log loss, "
             f"{law['bootstrap_valid']} bootstrap refits)",
             f"  L(N, D) = {law['E']:.3f} + {_number(law['A'])} / N^{law['alpha']:.3f} + {_number(law['B'])} / D^{law['beta']:.3f}"]
    lines.append("  " + "  ".join(f"{name} {_number(law[name])}{_interval(ci.get(name))}"
                                  for name in ("E", "A", "B", "alpha", "beta")))
    if "params_exponent" in law:
        lines.append(f"  N_opt ∝ C^{law['params_exponent']:.3f}{_interval(ci.get('params_exponent'))}, "
                     f"D_opt ∝ C^{law['tokens_exponent']:.3f}{_interval(ci.get('tokens_exponent'))}")
    return lines


def _prediction_lines(fit: dict) -> list[str]:
    if not fit["predictions"]:
        return []
    lines = [f"predictions (Chinchilla: ~{CHINCHILLA_TOKENS_PER_PARAM} tokens per parameter; "
             f"nanochat: {NANOCHAT_TOKENS_PER_PARAM})"]
    for prediction in fit["predictions"]:
        lines.append(f"  C = {_number(prediction['budget'])} FLOPs")
        for method in ("isoflop", "parametric"):
            guess = prediction[method]
            if guess is None:
                continue
            loss = f", loss {guess['loss']:.4f}{_interval(guess['loss_ci'])}" if "loss" in guess else ""
            lines.append(f"    {method:>10}: N {_number(guess['params'])}{_interval(guess['params_ci'])}, "
                         f"D {_number(guess['tokens'])}{_interval(guess['tokens_ci'])}, "
                         f"{guess['tokens_per_param']:.1f} tokens/param{loss}")
    return lines


def summary(fit: dict) -> str:
    """The fit as readable text: sections for approach 2, approach 3, the targets, the lr rule and the notes."""
    unfinished = ", ".join(f"{number} {status}" for status, number in sorted(fit.get("unfinished", {}).items()))
    lines = [f"scaling fit: {fit['runs']} finished runs ({unfinished or 'none failed'}); "
             f"N = {fit['count']} parameters, loss = {fit['loss']}"]
    lines += _isoflop_lines(fit) + _parametric_lines(fit) + _prediction_lines(fit)
    lr = fit["lr"]
    if lr is None:
        lines.append("learning rate: no rule (see notes)")
    else:
        lines.append(f"learning rate: lr_opt = {_number(lr['coefficient'])} N^{lr['exponent']:.3f}"
                     f"{_interval(lr['exponent_ci'])} over {len(lr['points'])} (budget, size) points")
    dial = fit["depth_dial"]
    if dial is not None:
        lines.append(f"depth dial ({dial['source']}): N_opt = {_number(dial['params']['coefficient'])} "
                     f"C^{dial['params']['exponent']:.3f}; a model of N params trains on C / (6 N) tokens")
    if fit["notes"]:
        lines += ["notes:"] + [f"  - {note}" for note in fit["notes"]]
    return "\n".join(lines)
