"""Scaling laws as formulas, and the estimators that fit them to (N params, D tokens, loss) points.

    L(N, D)   = E + A / N^alpha + B / D^beta                     Hoffmann et al. 2022 (Chinchilla), eq. 2
    N_opt(C)  = G (C/6)^a,   D_opt(C) = G^-1 (C/6)^b              eq. 4, minimising L under C = 6 N D
    G = (alpha A / (beta B))^(1/(alpha+beta)),   a = beta/(alpha+beta),   b = alpha/(alpha+beta)

Estimators: `fit_parametric` / `ParametricFitter` (Chinchilla approach 3: a Huber loss on log L, L-BFGS from a grid),
`fit_parabola` (approach 2: one IsoFLOP curve, loss against ln N or ln lr), `fit_power_law` (y = k x^a).
Example: `EPOCH.compute_optimal(5.76e23)` -> (7.2e10 params, 1.33e12 tokens), 18 tokens per parameter.

Not here: sweep rows, bootstrap intervals and the fit file (gptlab.scaling.fit); running sweeps (gptlab.scaling.sweep).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gptlab.runtime import GptlabError
from gptlab.runtime.processes import one_blas_thread


@dataclass(frozen=True, kw_only=True)
class ParametricLaw:
    """L(N, D) = E + A / N^alpha + B / D^beta: the irreducible loss E, and what a finite model and finite data add."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float

    def loss(self, params, tokens):
        """The predicted loss of N params trained on D tokens (numbers or numpy arrays)."""
        params, tokens = np.asarray(params, dtype=float), np.asarray(tokens, dtype=float)
        return self.E + self.A / params**self.alpha + self.B / tokens**self.beta

    @property
    def params_exponent(self) -> float:
        """a in N_opt ∝ C^a: beta / (alpha + beta)."""
        return self.beta / (self.alpha + self.beta)

    @property
    def tokens_exponent(self) -> float:
        """b in D_opt ∝ C^b: alpha / (alpha + beta); a + b = 1 because C = 6 N D."""
        return self.alpha / (self.alpha + self.beta)

    @property
    def balance(self) -> float:
        """G = (alpha A / (beta B))^(1 / (alpha + beta)) of eq. 4."""
        return (self.alpha * self.A / (self.beta * self.B)) ** (1 / (self.alpha + self.beta))

    def compute_optimal(self, flops):
        """(N_opt, D_opt) minimising L(N, D) under 6 N D = C, by the closed form of eq. 4 (numbers or arrays)."""
        scaled = np.asarray(flops, dtype=float) / 6
        return self.balance * scaled**self.params_exponent, scaled**self.tokens_exponent / self.balance

    def params_power_law(self) -> tuple[float, float]:
        """(k, a) with N_opt(C) = k C^a: k = G 6^-a, the form the depth dial inverts."""
        return self.balance * 6 ** -self.params_exponent, self.params_exponent


# Hoffmann et al. 2022, appendix D.2 (rounded as published). Epoch AI noted these rounded values imply ~32B params at
# Chinchilla's 5.76e23 FLOPs, not the 70B the paper trained: the next law is their refit of the same data.
CHINCHILLA = ParametricLaw(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)
# Besiroglu et al. 2024, "Chinchilla Scaling: A replication attempt", approach 3 refit: 72B params, 1.33T tokens at 5.76e23.
EPOCH = ParametricLaw(E=1.82, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658)

# The initialisation grid of Hoffmann et al. 2022, appendix D.2: 6 x 6 x 5 x 5 x 5 = 4,500 starting points (a, b, e, alpha, beta).
GRID_AB = (0.0, 5.0, 10.0, 15.0, 20.0, 25.0)
GRID_E = (-1.0, -0.5, 0.0, 0.5, 1.0)
GRID_EXPONENTS = (0.0, 0.5, 1.0, 1.5, 2.0)
# L-BFGS stopping rules, far tighter than scipy's defaults: Besiroglu et al. 2024 suggest the original estimates came
# from an optimiser stopped before convergence. The objective is a sum of Huber terms ~delta |residual|, tiny numbers,
# and near its minimum the last digits of the exponents move it by less than default tolerances notice. They cost
# little: L-BFGS converges fast once close, so tightening them from scipy's defaults adds ~10% evaluations.
LBFGS_OPTIONS = {"ftol": 1e-15, "gtol": 1e-11, "maxiter": 20_000, "maxfun": 40_000, "maxcor": 10}


def starting_grid() -> np.ndarray:
    """The paper's 4,500 starting points as rows (a, b, e, alpha, beta)."""
    rows = itertools.product(GRID_AB, GRID_AB, GRID_E, GRID_EXPONENTS, GRID_EXPONENTS)
    return np.array(list(rows), dtype=float)


def predicted_log_loss(theta: np.ndarray, log_params: np.ndarray, log_tokens: np.ndarray) -> tuple[np.ndarray, list]:
    """LSE(a - alpha ln N, b - beta ln D, e) = ln L(N, D), and the softmax shares of its three terms.

    `theta` is (5,) or (k, 5); the results are (n,) or (k, n), and the three shares are the derivatives of the
    log-sum-exp by each term. Shifting by the largest term keeps exp() in range for any grid point.
    """
    a, b, e, alpha, beta = (theta[..., i, None] for i in range(5))
    model, data = a - alpha * log_params, b - beta * log_tokens
    top = np.maximum(np.maximum(model, data), e)
    exps = (np.exp(model - top), np.exp(data - top), np.exp(e - top))
    total = exps[0] + exps[1] + exps[2]
    return top + np.log(total), [each / total for each in exps]


def huber(residual: np.ndarray, delta: float) -> np.ndarray:
    """Huber_delta(r): r^2 / 2 within delta, linear beyond, so a few bad runs pull the fit less than squares would."""
    size = np.abs(residual)
    return np.where(size <= delta, 0.5 * residual**2, delta * (size - 0.5 * delta))


def huber_objective(theta, log_params, log_tokens, log_losses, delta: float, weights=None) -> tuple[float, np.ndarray]:
    """Σ_i w_i Huber_delta(LSE(a - alpha ln N_i, b - beta ln D_i, e) - ln L_i), and its gradient by (a, b, e, alpha, beta).

    The weights are the bootstrap's resampling counts (one each for a plain fit): resampling a run twice counts it twice.
    """
    weights = np.ones_like(log_losses) if weights is None else weights
    predicted, shares = predicted_log_loss(np.asarray(theta, dtype=float), log_params, log_tokens)
    residual = predicted - log_losses
    slopes = weights * np.clip(residual, -delta, delta)  # dHuber/dr
    by_model, by_data = shares[0] * slopes, shares[1] * slopes
    gradient = [by_model.sum(), by_data.sum(), (shares[2] * slopes).sum(),
                -(by_model * log_params).sum(), -(by_data * log_tokens).sum()]
    return float((weights * huber(residual, delta)).sum()), np.array(gradient)


@dataclass(frozen=True)
class ParametricFit:
    """The best law found, with the optimiser's view of it: (a, b, e, alpha, beta) = (ln A, ln B, ln E, alpha, beta)."""

    law: ParametricLaw
    theta: tuple[float, ...]
    objective: float


class ParametricFitter:
    """Chinchilla approach 3 on fixed data, refitted cheaply under different run weights (the bootstrap's).

    As Hoffmann et al. 2022 state it (appendix D.2): minimise the Huber objective with L-BFGS over
    (a, b, e, alpha, beta), A = e^a, B = e^b, E = e^e, delta = 1e-3, from a grid of starts, keeping the best minimum.
    The paper runs L-BFGS from all 4,500 grid points; here the objective is evaluated on the whole grid at once
    (one numpy pass, computed once per data set) and L-BFGS starts only from the best few, plus any `extra_starts`
    (the bootstrap passes the full data's optimum): the other grid points lie in the same few basins and only cost
    time. Tolerances are tight (LBFGS_OPTIONS): an optimiser that stops early gives a wrong law.
    L-BFGS steps in centred coordinates, ln N - mean and a - alpha mean (likewise for D and b): the same objective and
    minimum, but a and alpha no longer move together along a ridge ~ln N long, which saves ~40% of the evaluations.
    """

    def __init__(self, params, tokens, losses, *, delta: float = 1e-3):
        log_params, log_tokens, self.log_losses = (np.log(np.asarray(values, dtype=float))
                                                   for values in (params, tokens, losses))
        if not np.all(np.isfinite(log_params + log_tokens + self.log_losses)):
            raise GptlabError("a parametric fit needs positive, finite params, tokens and losses")
        self.delta = delta
        self.grid = starting_grid()
        predicted, _ = predicted_log_loss(self.grid, log_params, log_tokens)
        self.grid_terms = huber(predicted - self.log_losses, delta)  # (4500, n): a grid point's score is this @ weights
        # Centred coordinates: theta' = theta - theta[[alpha, beta, e, alpha, beta]] * shift, that is
        # a' = a - alpha mean(ln N), b' = b - beta mean(ln D), and e, alpha, beta as they are.
        self.shift = np.array([log_params.mean(), log_tokens.mean(), 0.0, 0.0, 0.0])
        self.centred = (log_params - self.shift[0], log_tokens - self.shift[1])

    def fit(self, weights=None, *, starts: int = 25, extra_starts: Sequence[Sequence[float]] = ()) -> ParametricFit:
        """The best L-BFGS minimum from the `starts` best grid points and `extra_starts` (rows a, b, e, alpha, beta)."""
        from scipy.optimize import minimize

        weights = np.ones_like(self.log_losses) if weights is None else np.asarray(weights, dtype=float)
        order = np.argsort(self.grid_terms @ weights)[:starts]
        candidates = np.concatenate([self.grid[order], np.asarray(extra_starts, dtype=float).reshape(-1, 5)])
        arguments = (*self.centred, self.log_losses, self.delta, weights)
        best = None
        for start in candidates - candidates[:, [3, 4, 2, 3, 4]] * self.shift:
            result = minimize(huber_objective, start, args=arguments, jac=True, method="L-BFGS-B", options=LBFGS_OPTIONS)
            if np.all(np.isfinite(result.x)) and (best is None or result.fun < best.fun):
                best = result
        if best is None:
            raise GptlabError(f"the parametric fit diverged from all {len(candidates)} starts: check the runs' losses")
        a, b, e, alpha, beta = (float(value) for value in best.x + best.x[[3, 4, 2, 3, 4]] * self.shift)
        with np.errstate(over="ignore"):  # a runaway bootstrap refit: an infinite A or B, dropped by its caller
            law = ParametricLaw(E=float(np.exp(e)), A=float(np.exp(a)), B=float(np.exp(b)), alpha=alpha, beta=beta)
        return ParametricFit(law=law, theta=(a, b, e, alpha, beta), objective=float(best.fun))


def fit_parametric(params, tokens, losses, *, delta: float = 1e-3, starts: int = 25) -> ParametricFit:
    """Chinchilla approach 3 (see ParametricFitter): L(N, D) fitted to runs of N params, D tokens and these losses."""
    with one_blas_thread():
        return ParametricFitter(params, tokens, losses, delta=delta).fit(starts=starts)


def fit_power_law(x, y) -> tuple[float, float]:
    """(k, a) with y = k x^a, by least squares on ln y = ln k + a ln x. Example: x = [1, 10], y = [2, 20] -> (2.0, 1.0)."""
    log_x, log_y = np.log(np.asarray(x, dtype=float)), np.log(np.asarray(y, dtype=float))
    if len(np.unique(log_x)) < 2:
        raise GptlabError(f"a power law needs at least 2 distinct x values, got {sorted(set(np.exp(log_x).tolist()))}")
    exponent, intercept = np.polyfit(log_x, log_y, 1)
    return float(np.exp(intercept)), float(exponent)


def fit_parabola(x, y) -> tuple[float, float, float] | None:
    """(c2, c1, c0) with y ≈ c2 x^2 + c1 x + c0 by least squares; None with fewer than 3 distinct x, which do not
    determine a parabola."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(np.unique(x)) < 3:
        return None
    return tuple(float(value) for value in np.polyfit(x, y, 2))


def parabola_minimum(coefficients: tuple[float, float, float] | None) -> float | None:
    """The x of the parabola's minimum, -c1 / (2 c2); None without a parabola or when it opens downwards (c2 <= 0)."""
    if coefficients is None or coefficients[0] <= 0:
        return None
    return -coefficients[1] / (2 * coefficients[0])
