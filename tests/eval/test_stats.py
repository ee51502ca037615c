"""pass@k against enumerating every k-subset; Wilson and t intervals against scipy."""

import itertools
import math

import pytest

from gptlab.eval.stats import mean_interval, mean_pass_at_k, pass_at_k, t_quantile, wilson_interval
from gptlab.runtime import GptlabError

stats = pytest.importorskip("scipy.stats")


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """The fraction of all k-subsets of n samples (c right) that hold at least one right sample."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(samples, k))
    return sum(any(subset) for subset in subsets) / len(subsets)


def test_pass_at_k_equals_enumerating_every_subset():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_is_stable_where_the_binomials_are_huge():
    assert pass_at_k(200, 13, 1) == pytest.approx(13 / 200)
    assert pass_at_k(200, 13, 100) == pytest.approx(1 - math.comb(187, 100) / math.comb(200, 100), rel=1e-12)
    assert pass_at_k(5000, 1, 10) == pytest.approx(10 / 5000)
    assert mean_pass_at_k([(10, 3), (10, 0), (10, 10)], k=1) == pytest.approx((0.3 + 0.0 + 1.0) / 3)


@pytest.mark.parametrize("n, c, k, message", [
    (10, 11, 1, "c=11 must be between 0 and the samples n=10"),
    (10, 3, 0, "k=0 must be between 1"),
    (4, 1, 5, "draw at least k samples per problem"),
    (10.0, 3, 1, "n must be a whole number"),
])
def test_pass_at_k_bad_counts_raise(n, c, k, message):
    with pytest.raises(GptlabError, match=message):
        pass_at_k(n, c, k)


@pytest.mark.parametrize("confidence", [0.8, 0.95, 0.99])
def test_wilson_interval_equals_scipy(confidence):
    for n in (1, 2, 7, 30, 100, 1319):
        for successes in sorted({0, 1, n // 3, n // 2, n - 1, n}):
            expected = stats.binomtest(successes, n).proportion_ci(confidence_level=confidence, method="wilson")
            low, high = wilson_interval(successes, n, confidence)
            assert (low, high) == pytest.approx((expected.low, expected.high), abs=1e-12), (successes, n)
            assert 0.0 <= low <= successes / n <= high <= 1.0


def test_wilson_interval_bad_arguments_raise():
    with pytest.raises(GptlabError, match="successes must be a whole number from 0 to n=10"):
        wilson_interval(11, 10)
    with pytest.raises(GptlabError, match="n must be a whole number of trials"):
        wilson_interval(0, 0)
    with pytest.raises(GptlabError, match="confidence must be between 0 and 1"):
        wilson_interval(1, 10, confidence=95)


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 9, 10, 30, 299, 300, 301, 1000, 100_000])
def test_t_quantile_equals_scipy(df):
    for p in (0.5, 0.6, 0.9, 0.95, 0.975, 0.995, 0.9995, 0.025):
        assert t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-9, abs=1e-12), p


def test_mean_interval_equals_scipy_t_interval():
    for values in ([0.5, 0.7, 0.9, 0.4], [1.0, 0.0], [3.0] * 5, [float(i % 7) for i in range(500)]):
        sem = stats.sem(values) if len(set(values)) > 1 else 0.0
        mean = sum(values) / len(values)
        for confidence in (0.9, 0.95, 0.99):
            low, high = mean_interval(values, confidence)
            if sem == 0.0:
                assert low == high == mean
                continue
            expected = stats.t.interval(confidence, len(values) - 1, loc=mean, scale=sem)
            assert (low, high) == pytest.approx(expected, rel=1e-9)
    with pytest.raises(GptlabError, match="at least 2 values"):
        mean_interval([0.5])
    with pytest.raises(GptlabError, match="finite"):
        mean_interval([0.5, math.inf])
