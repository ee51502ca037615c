"""Statistics for evaluation results: pass@k, and confidence intervals for accuracies and mean scores.

    pass_at_k(n=10, c=3, k=1)             -> 0.3     (3 of 10 samples right: the chance one drawn sample is right)
    pass_at_k(n=10, c=3, k=5)             -> 0.9167  (1 - C(7, 5) / C(10, 5))
    wilson_interval(81, 100)              -> (0.7222, 0.8749)   95% interval for 81 right of 100
    mean_interval([0.5, 0.7, 0.9, 0.4])   -> (0.2722, 0.9778)   95% t interval for the mean

pass@k is the unbiased estimator of Chen et al. (2021), "Evaluating Large Language
Models Trained on Code", eq. 1: draw n >= k samples per problem, count the c right,
and 1 - C(n-c, k) / C(n, k) is the chance that k of them drawn without replacement
hold a right one. It is computed as their product form, 1 - prod_{i=n-c+1}^{n} (1 - k/i),
which never forms the huge binomials.

The Wilson score interval (Wilson, 1927) is the interval for a proportion that stays
inside [0, 1] and keeps its coverage near 0 and 1, where the normal ("Wald")
interval collapses to a point. The mean interval is the Student t interval,
mean ± t_{n-1} · s / sqrt(n). Both are computed here by hand: the normal quantile
from the standard library, the t quantile from the t distribution's closed-form
CDF for whole degrees of freedom (Abramowitz & Stegun 26.7.3-4), inverted by
bisection, or its Cornish-Fisher expansion (A&S 26.7.5) when the degrees of
freedom are many. No scipy at run time; the tests check against it.

Not here: producing the samples and grading them (gptlab.eval.chat).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

from gptlab.runtime import GptlabError

EXACT_T_UP_TO = 300  # degrees of freedom up to which the t quantile inverts the exact CDF (an O(df) sum)
BISECTION_STEPS = 80  # halvings of [0, pi/2): far below float resolution


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that k of the n samples, c of them right, include a right one (Chen et al. 2021, eq. 1)."""
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise GptlabError(f"pass_at_k: {name} must be a whole number, got {value!r}")
    if not 0 <= c <= n:
        raise GptlabError(f"pass_at_k: the right samples c={c} must be between 0 and the samples n={n}")
    if not 1 <= k <= n:
        raise GptlabError(f"pass_at_k: k={k} must be between 1 and the samples n={n}; draw at least k samples per problem")
    if n - c < k:
        return 1.0  # every k-subset holds a right sample
    missed = 1.0  # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i)
    for i in range(n - c + 1, n + 1):
        missed *= 1.0 - k / i
    return 1.0 - missed


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """pass@k over problems: the mean of pass_at_k(n, c, k) for each problem's (n samples, c right)."""
    if not counts:
        raise GptlabError("mean_pass_at_k needs at least one problem's (n, c)")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval (low, high) for the proportion successes / n."""
    _check_confidence(confidence)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise GptlabError(f"wilson_interval: n must be a whole number of trials, at least 1, got {n!r}")
    if isinstance(successes, bool) or not isinstance(successes, int) or not 0 <= successes <= n:
        raise GptlabError(f"wilson_interval: successes must be a whole number from 0 to n={n}, got {successes!r}")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    shrink = 1 + z * z / n
    center = (p + z * z / (2 * n)) / shrink
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / shrink
    low = 0.0 if successes == 0 else max(0.0, center - half)  # the bounds are exactly 0 and 1 there
    high = 1.0 if successes == n else min(1.0, center + half)
    return low, high


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """The Student t interval (low, high) for the mean of the values; the mean is its midpoint."""
    _check_confidence(confidence)
    count = len(values)
    if count < 2:
        raise GptlabError(f"mean_interval needs at least 2 values to measure their spread, got {count}")
    mean = math.fsum(values) / count
    variance = math.fsum((value - mean) ** 2 for value in values) / (count - 1)
    if not math.isfinite(variance):
        raise GptlabError("mean_interval: the values must be finite numbers")
    half = t_quantile(0.5 + confidence / 2, count - 1) * math.sqrt(variance / count)
    return mean - half, mean + half


def t_quantile(p: float, df: int) -> float:
    """The p quantile of Student's t with df degrees of freedom, p in (0, 1): t_quantile(0.975, 10) = 2.2281."""
    if not 0 < p < 1:
        raise GptlabError(f"t_quantile: p must be between 0 and 1, got {p!r}")
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise GptlabError(f"t_quantile: df must be a whole number of at least 1, got {df!r}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    central = 2 * p - 1  # P(|T| <= t), the mass the two-sided interval holds
    if df > EXACT_T_UP_TO:
        return _cornish_fisher(NormalDist().inv_cdf(p), df)
    low, high = 0.0, math.pi / 2  # bisect on theta = atan(t / sqrt(df)), where the mass is monotone and bounded
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2
        if _central_mass(middle, df) < central:
            low = middle
        else:
            high = middle
    return math.sqrt(df) * math.tan((low + high) / 2)


def _central_mass(theta: float, df: int) -> float:
    """P(|T| <= sqrt(df) tan(theta)) for whole df, A&S 26.7.3 (odd df) and 26.7.4 (even df)."""
    cos2, sin, cos = math.cos(theta) ** 2, math.sin(theta), math.cos(theta)
    if df % 2:  # 2/pi (theta + sin cos (1 + 2/3 cos^2 + (2·4)/(3·5) cos^4 + ... up to cos^(df-3)))
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for j in range(1, (df - 3) // 2 + 1):
            term *= cos2 * (2 * j) / (2 * j + 1)
            total += term
        return 2 / math.pi * (theta + sin * cos * total)
    term, total = 1.0, 1.0  # sin (1 + 1/2 cos^2 + (1·3)/(2·4) cos^4 + ... up to cos^(df-2))
    for j in range(1, (df - 2) // 2 + 1):
        term *= cos2 * (2 * j - 1) / (2 * j)
        total += term
    return sin * total


def _cornish_fisher(z: float, df: int) -> float:
    """The t quantile from the normal one, A&S 26.7.5: error of order df^-5."""
    terms = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
    )
    return z + sum(term / df**power for power, term in enumerate(terms, start=1))


def _check_confidence(confidence: float) -> None:
    if not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise GptlabError(f"confidence must be between 0 and 1 (e.g. 0.95), got {confidence!r}")
