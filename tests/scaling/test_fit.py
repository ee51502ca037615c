"""Scaling-law fits against laws we know: the published Chinchilla and Epoch AI laws, brute-force minima, finite
differences, and sweeps simulated from a known law (with and without noise), whose truth the fit must recover."""

import json
import re

import numpy as np
import pytest
from scipy.optimize import check_grad

from gptlab.runtime import GptlabError
from gptlab.scaling.fit import finished_runs, fit_results, isoflop_minimum, summary, tokens_for
from gptlab.scaling.laws import CHINCHILLA, EPOCH, ParametricLaw, fit_parametric, fit_power_law, huber_objective
from gptlab.scaling.plots import plot_isoflops, plot_parametric, plot_power_laws

BUDGETS = (1e15, 1e16, 1e17)  # two decades; EPOCH's optimum runs from 2.3M to 25M params over them
RATIOS = (1 / 4, 1 / 2, 1, 2, 4)  # sizes per budget, as multiples of a centre near the optimum
LR_RULE = (0.5, -0.3)  # the true lr_opt = k N^g of the simulated sweeps
LR_SCALES = (0.5, 1.0, 2.0)


def sweep_rows(law=EPOCH, *, budgets=BUDGETS, ratios=RATIOS, centre=1.0, noise=0.0, lr_scales=(1.0,), seed=0):
    """Rows as `gptlab sweep` writes them, for runs whose loss follows `law` exactly, times a log-normal noise of
    `noise`, plus a bowl 0.2 ln(lr / lr_opt)^2 over learning rates around lr_opt = 0.5 N^-0.3."""
    rng = np.random.default_rng(seed)
    rows = []
    for budget in budgets:
        optimum = float(law.compute_optimal(budget)[0])
        for ratio in ratios:
            params = optimum * centre * ratio
            tokens = budget / (6 * params)
            for scale in lr_scales:
                lr = LR_RULE[0] * params ** LR_RULE[1] * scale
                loss = float(law.loss(params, tokens)) * np.exp(noise * rng.standard_normal()) + 0.2 * np.log(scale) ** 2
                rows.append({"run": f"c{budget:.0e}-n{params:.3g}-lr{scale}", "status": "finished", "budget": budget,
                             "params": {"total": params, "non_embedding": 0.8 * params, "matmul": 0.9 * params,
                                        "embeddings": 0.2 * params},
                             "tokens": tokens, "flops": 6 * params * tokens, "lr": lr, "lr_scale": scale,
                             "val_loss": loss, "train_loss": loss + 0.01, "val_bpb": loss / np.log(2)})
    return rows


def true_optimum(law: ParametricLaw, budget: float) -> float:
    """The brute-force compute-optimal N: the lowest loss along 6 N D = C over a dense log grid of N."""
    sizes = np.geomspace(1e-6, 1e3, 400_001) * float(law.compute_optimal(budget)[0])
    return float(sizes[np.argmin(law.loss(sizes, budget / (6 * sizes)))])


@pytest.fixture(scope="module")
def noisy():
    """A noisy sweep at 3 learning rates per size, its fit (200 bootstrap samples) and its rows."""
    rows = sweep_rows(noise=0.005, lr_scales=LR_SCALES, centre=1.3)
    return fit_results(rows, targets=[1e18, 5.76e23], samples=200, seed=0), rows


def test_compute_optimal_matches_published_laws():
    params, tokens = EPOCH.compute_optimal(5.76e23)  # Chinchilla's budget
    assert 72.0e9 < params < 72.5e9 and 1.32e12 < tokens < 1.34e12  # Besiroglu et al. 2024: 72B, 1.33T
    assert 60e9 < params < 80e9 and 1.2e12 < tokens < 1.5e12  # ... close to Chinchilla's 70B, 1.4T
    assert 18 < tokens / params < 19
    params, _ = CHINCHILLA.compute_optimal(5.76e23)
    assert 31e9 < params < 33e9  # the rounded published coefficients: the inconsistency Epoch AI pointed out


@pytest.mark.parametrize("law", [EPOCH, CHINCHILLA], ids=["epoch", "chinchilla"])
@pytest.mark.parametrize("budget", [1e15, 1e19, 5.76e23])
def test_compute_optimal_matches_brute_force_minimum(law, budget):
    params, tokens = law.compute_optimal(budget)
    assert params == pytest.approx(true_optimum(law, budget), rel=1e-4)
    assert 6 * params * tokens == pytest.approx(budget)
    coefficient, exponent = law.params_power_law()
    assert coefficient * budget**exponent == pytest.approx(params)


def test_huber_objective_gradient_matches_finite_differences():
    rng = np.random.default_rng(1)
    log_params, log_tokens = rng.uniform(13, 19, 12), rng.uniform(17, 23, 12)
    log_losses = np.log(EPOCH.loss(np.exp(log_params), np.exp(log_tokens))) + rng.normal(0, 2e-3, 12)
    weights = rng.integers(0, 3, 12).astype(float)
    for theta in ([6.18, 7.64, 0.6, 0.35, 0.37], [5.0, 9.0, 0.2, 0.3, 0.45], [12.0, 3.0, -0.5, 0.9, 0.1]):
        def value(point):
            return huber_objective(point, log_params, log_tokens, log_losses, 1e-3, weights)[0]

        def gradient(point):
            return huber_objective(point, log_params, log_tokens, log_losses, 1e-3, weights)[1]

        error = check_grad(value, gradient, np.array(theta), epsilon=1e-7)
        assert error < 1e-5 * max(np.linalg.norm(gradient(np.array(theta))), 1e-3)
        a, b, e, alpha, beta = theta  # the objective itself, spelled out without log-sum-exp's shift
        residual = np.log(np.exp(a - alpha * log_params) + np.exp(b - beta * log_tokens) + np.exp(e)) - log_losses
        reference = np.where(np.abs(residual) <= 1e-3, residual**2 / 2, 1e-3 * (np.abs(residual) - 5e-4))
        assert value(np.array(theta)) == pytest.approx(weights @ reference, rel=1e-10)


def test_fit_parametric_recovers_law_without_noise():
    rows = sweep_rows()
    params = [row["params"]["total"] for row in rows]
    law = fit_parametric(params, [row["tokens"] for row in rows], [row["val_loss"] for row in rows]).law
    for name in ("E", "A", "B", "alpha", "beta"):
        assert getattr(law, name) == pytest.approx(getattr(EPOCH, name), rel=1e-3), name


def test_fit_results_parametric_intervals_cover_true_law_with_noise(noisy):
    fit, _ = noisy
    parametric = fit["parametric"]
    assert parametric["bootstrap_valid"] >= 190
    truths = {"E": EPOCH.E, "alpha": EPOCH.alpha, "beta": EPOCH.beta, "params_exponent": EPOCH.params_exponent}
    for name, truth in truths.items():
        low, high = parametric["ci"][name]
        assert low < truth < high, (name, low, truth, high)
        assert low < parametric[name] < high
    prediction = fit["predictions"][0]["parametric"]  # C = 1e18, one decade past the sweep
    assert prediction["params_ci"][0] < float(EPOCH.compute_optimal(1e18)[0]) < prediction["params_ci"][1]


def test_isoflop_minimum_matches_brute_force_optimum():
    rows = sweep_rows(centre=1.3)  # sizes off-centre: the parabola must find the minimum, not the middle size
    for budget in BUDGETS:
        here = [row for row in rows if row["budget"] == budget]
        minimum = isoflop_minimum(budget, [row["params"]["total"] for row in here], [row["val_loss"] for row in here])
        parabola = minimum["parabola"]
        assert parabola["inside"] and parabola["params"] == pytest.approx(true_optimum(EPOCH, budget), rel=0.03)
        assert parabola["tokens"] == pytest.approx(budget / (6 * parabola["params"]))
        assert minimum["lowest"]["params"] == pytest.approx(1.3 * float(EPOCH.compute_optimal(budget)[0]))
    fit = fit_results(rows, samples=0)
    assert fit["power_laws"]["method"] == "parabola"
    assert fit["power_laws"]["params"]["exponent"] == pytest.approx(EPOCH.params_exponent, abs=0.005)
    assert fit["power_laws"]["tokens"]["exponent"] == pytest.approx(EPOCH.tokens_exponent, abs=0.005)


def test_fit_results_isoflop_interval_covers_true_exponent_with_noise(noisy):
    fit, _ = noisy
    laws = fit["power_laws"]
    assert laws["method"] == "parabola" and laws["bootstrap_valid"] > 100
    low, high = laws["params"]["exponent_ci"]
    assert low < EPOCH.params_exponent < high
    low, high = laws["tokens"]["exponent_ci"]
    assert low < EPOCH.tokens_exponent < high


def test_isoflop_minimum_is_none_when_loss_does_not_curve_up():
    minimum = isoflop_minimum(1e15, [1e6, 2e6, 4e6, 8e6], [4.0, 3.9, 3.6, 3.0])  # falling ever faster: concave in ln N
    assert minimum["parabola"] is None and minimum["lowest"]["params"] == 8e6
    rows = sweep_rows()
    for row in rows:
        if row["budget"] == 1e16:
            row["val_loss"] = 10 - np.log(row["params"]["total"]) / 4  # falling linearly in ln N: c2 = 0
    fit = fit_results(rows, samples=0)
    assert fit["isoflop"][1]["parabola"] is None
    assert any("1e+16" in note and "does not curve upwards" in note for note in fit["notes"])
    assert fit["power_laws"]["budgets"] == [1e15, 1e17]


def test_isoflop_minimum_flags_minimum_outside_sizes():
    fit = fit_results(sweep_rows(ratios=(1 / 16, 1 / 8, 1 / 4), centre=1.0), samples=0)
    assert all(entry["parabola"] is None or not entry["parabola"]["inside"] for entry in fit["isoflop"])
    assert fit["power_laws"]["method"] == "lowest"
    assert any("outside the sizes run; add larger sizes" in note for note in fit["notes"])


def test_lr_rule_recovers_exponent(noisy):
    rows = sweep_rows(lr_scales=LR_SCALES)
    lr = fit_results(rows, samples=0)["lr"]
    assert lr["exponent"] == pytest.approx(LR_RULE[1], abs=1e-6)
    assert lr["coefficient"] == pytest.approx(LR_RULE[0], rel=1e-5)
    fit, _ = noisy
    low, high = fit["lr"]["exponent_ci"]
    assert low < LR_RULE[1] < high and len(fit["lr"]["points"]) == 15
    assert fit["depth_dial"]["lr"] == {"coefficient": fit["lr"]["coefficient"], "exponent": fit["lr"]["exponent"]}


def test_lr_rule_is_none_with_one_lr_per_size():
    fit = fit_results(sweep_rows(), samples=0)
    assert fit["lr"] is None and fit["depth_dial"]["lr"] is None
    assert any("one learning rate per size" in note and "--lr-scales" in note for note in fit["notes"])


def test_finished_runs_rejects_unknown_count():
    with pytest.raises(GptlabError, match="unknown parameter count 'embedding'.*total, non_embedding, matmul"):
        fit_results(sweep_rows(), count="embedding", samples=0)


def test_finished_runs_rejects_missing_loss():
    rows = sweep_rows()
    for row in rows:
        row["val_loss"] = None  # a sweep without a val split
    with pytest.raises(GptlabError, match="have no 'val_loss'.*--loss train_loss"):
        fit_results(rows, samples=0)
    fit = fit_results(rows, loss="train_loss", samples=0)
    assert fit["loss"] == "train_loss" and fit["parametric"]["E"] == pytest.approx(EPOCH.E + 0.01, rel=1e-3)


def test_finished_runs_rejects_too_few_finished():
    rows = sweep_rows()[:7]
    for row in rows[:3]:
        row["status"] = "failed"
    with pytest.raises(GptlabError, match=r"4 of 7 runs finished \(3 failed\).*at least 5"):
        fit_results(rows, samples=0)


def test_fit_results_ignores_and_counts_failed_rows():
    rows = sweep_rows()
    broken = [{"run": "oom", "status": "failed", "budget": 1e15, "params": {}, "val_loss": None},
              {"run": "nan", "status": "diverged", "budget": 1e16, "params": {"total": 5e6}, "tokens": 1.0, "val_loss": None}]
    fit = fit_results(rows + broken, samples=0)
    assert fit["runs"] == 15 and fit["failed_runs"] == 2 and fit["unfinished"] == {"failed": 1, "diverged": 1}
    clean = fit_results(rows, samples=0)
    assert fit["parametric"] == clean["parametric"] and fit["isoflop"] == clean["isoflop"]
    runs, unfinished = finished_runs(rows + broken, count="non_embedding")
    assert len(runs.params) == 15 and runs.params[0] == pytest.approx(0.8 * rows[0]["params"]["total"])


def test_fit_results_reports_each_stage_and_the_bootstrap_count_and_the_same_fit_without_progress():
    rows = sweep_rows()
    lines: list[str] = []
    fit = fit_results(rows, samples=23, progress=lines.append)
    assert lines[0] == "fit: 15 finished runs, 15 (budget, size) points over 3 budgets; IsoFLOP power laws with 23 bootstrap resamples"
    assert lines[1] == "fit: parametric L(N, D) (the longest stage)"
    assert lines[2] == "fit: parametric L(N, D) fitted to 15 points; 23 bootstrap refits"
    counts = [int(re.match(r"fit: parametric bootstrap (\d+)/23 refits \((\d+) usable\)$", line)[1]) for line in lines[3:-1]]
    assert counts == [3, 6, 9, 12, 15, 18, 21, 23]  # every ceil(23 / 10) refits, and the last
    assert lines[-1] == "fit: learning-rate rule with 23 bootstrap resamples"
    usable = re.search(r"\((\d+) usable\)", lines[-2])[1]
    assert int(usable) == fit["parametric"]["bootstrap_valid"]
    assert fit_results(rows, samples=23) == fit


def test_fit_results_is_json_ready(noisy):
    fit, _ = noisy
    plain = (dict, list, str, int, float, bool, type(None))

    def walk(value):
        assert type(value) in plain, (type(value), value)  # exactly: numpy's float64 would pass isinstance
        for child in value.values() if isinstance(value, dict) else value if isinstance(value, list) else ():
            walk(child)

    walk(fit)
    assert json.loads(json.dumps(fit, allow_nan=False)) == fit
    assert fit["format"] == "gptlab-fit" and fit["version"] == 1


def test_fit_results_degrades_with_one_budget():
    fit = fit_results(sweep_rows(budgets=(1e16,), ratios=(1 / 8, 1 / 4, 1 / 2, 1, 2, 4)), targets=[1e18], samples=10)
    assert fit["power_laws"] is None and fit["predictions"][0]["isoflop"] is None
    assert any("one budget only" in note for note in fit["notes"])
    assert fit["depth_dial"] is None or fit["depth_dial"]["source"] == "parametric"
    fit = fit_results(sweep_rows(ratios=(1 / 2, 2)), samples=10)  # 2 sizes per budget: no parabolas
    assert all(entry["parabola"] is None for entry in fit["isoflop"]) and fit["power_laws"]["method"] == "lowest"
    assert any("2 size(s), a parabola needs 3" in note for note in fit["notes"])


def test_tokens_for_inverts_depth_dial():
    coefficient, exponent = EPOCH.params_power_law()
    dial = {"count": "total", "params": {"coefficient": coefficient, "exponent": exponent}, "source": "parametric"}
    assert tokens_for(dial, 72.3e9) == pytest.approx(1.33e12, rel=0.01)
    for budget in (1e18, 1e21):
        params, tokens = EPOCH.compute_optimal(budget)
        assert tokens_for(dial, float(params)) == pytest.approx(float(tokens), rel=1e-9)
    fit = fit_results(sweep_rows(), samples=0)
    params, tokens = EPOCH.compute_optimal(1e16)
    assert tokens_for(fit["depth_dial"], float(params)) == pytest.approx(float(tokens), rel=0.05)
    with pytest.raises(GptlabError, match="positive"):
        tokens_for(dial, 0)


def test_summary_mentions_every_section(noisy):
    text = summary(noisy[0])
    for words in ("IsoFLOP minima", "N_opt = ", "L(N, D) = ", "tokens/param", "Chinchilla: ~20", "nanochat: 12",
                  "lr_opt = ", "depth dial (isoflop)", "notes:", "extrapolates"):
        assert words in text, words


def test_plots_write_valid_pngs(noisy, tmp_path):
    from matplotlib.image import imread

    fit, rows = noisy
    paths = [plot_isoflops(fit, rows, tmp_path / "isoflops.png"), plot_power_laws(fit, tmp_path / "power_laws.png"),
             plot_parametric(fit, rows, tmp_path / "parametric.png")]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        height, width, _ = imread(path).shape
        assert 300 < height < 1000 and 400 < width < 1500
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["isoflops.png", "parametric.png", "power_laws.png"]


def test_fit_power_law_recovers_exact_power():
    budgets = np.array([1e15, 1e16, 1e17])
    assert fit_power_law(budgets, 3e-2 * budgets**0.52) == pytest.approx((3e-2, 0.52))
    with pytest.raises(GptlabError, match="2 distinct"):
        fit_power_law([1e15, 1e15], [1.0, 2.0])


def test_finished_runs_rejects_non_finite_values():
    rows = sweep_rows()
    rows[3]["val_loss"] = float("nan")  # finished, yet no number: a run the sweep should have called diverged
    with pytest.raises(GptlabError, match=re.escape(rows[3]["run"]) + " is marked finished.*val_loss nan.*mark it diverged"):
        fit_results(rows, samples=0)


def test_plots_skip_parts_the_fit_lacks(tmp_path):
    rows = sweep_rows(budgets=(1e15, 1e16), ratios=(1 / 2, 2), lr_scales=LR_SCALES)  # 4 sizes in all: no parametric law
    fit = fit_results(rows, samples=0)
    assert fit["parametric"] is None and fit["power_laws"]["method"] == "lowest"
    assert plot_parametric(fit, rows, tmp_path / "parametric.png") is None
    assert plot_power_laws(fit, tmp_path / "power_laws.png").exists()
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["power_laws.png"]
