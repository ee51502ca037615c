"""MinHash arithmetic against direct computation: exact modular hashing, Jaccard estimates, the banding S-curve."""

import math
import random

import numpy as np
import pytest

from gptlab.curate.minhash import (
    MERSENNE,
    MinHashConfig,
    band_keys,
    candidate_probability,
    jaccard,
    normalise_text,
    permutation_parameters,
    shingle_hashes,
    signature,
    universal_hash,
    workspace,
)
from gptlab.runtime import GptlabError


def random_hashes(generator: np.random.Generator, count: int) -> np.ndarray:
    return np.unique(generator.integers(0, 2**64, size=count, dtype=np.uint64, endpoint=False))


def overlapping_sets(generator: np.random.Generator, union: int, common: int) -> tuple[np.ndarray, np.ndarray]:
    """Two hash sets with |A ∪ B| = union and |A ∩ B| = common, so J = common / union exactly."""
    values = generator.permutation(random_hashes(generator, union + 16))[:union]
    each = (union + common) // 2
    assert 2 * each - union == common
    return np.sort(values[:each]), np.sort(values[union - each:])


@pytest.mark.parametrize("field, value, fix", [
    ("num_hashes", {"num_hashes": 100, "bands": 16}, "set num_hashes to 96"),
    ("threshold", {"threshold": 1.5}, "use a value in (0, 1]"),
    ("ngram", {"ngram": 0}, "positive integer"),
    ("seed", {"seed": -1}, "[0, 2^32 - 1]"),
])
def test_minhash_config_names_the_field_and_the_fix_when_invalid(field, value, fix):
    with pytest.raises(GptlabError) as error:
        MinHashConfig(**value)
    assert f"minhash.{field}=" in str(error.value) and fix in str(error.value)


def test_universal_hash_equals_python_integers_at_the_extremes():
    generator = np.random.default_rng(1)
    a = np.array([1, 2, MERSENNE - 1, MERSENNE - 2, *generator.integers(1, MERSENNE, 60)], dtype=np.uint64)
    b = np.array([0, MERSENNE - 1, MERSENNE - 1, 5, *generator.integers(0, MERSENNE, 60)], dtype=np.uint64)
    x = np.array([0, 1, 2**32 - 1, 2**31, *generator.integers(0, 2**32, 600)], dtype=np.uint64)
    slow = [[(int(ai) * int(xj) + int(bi)) % MERSENNE for xj in x] for ai, bi in zip(a, b)]
    assert universal_hash(x, a, b).tolist() == slow  # more than CHUNK columns: its own scratch
    scratch = workspace(len(a))
    assert universal_hash(x[:300], a, b, scratch).tolist() == [row[:300] for row in slow]
    assert universal_hash(x[300:], a, b, scratch).tolist() == [row[300:] for row in slow]  # the scratch reused


def test_signature_is_the_minimum_of_each_universal_hash_over_chunks():
    config = MinHashConfig(num_hashes=32, bands=4)
    a, b = permutation_parameters(config)
    hashes = random_hashes(np.random.default_rng(2), 5000)  # more than one CHUNK
    expected = [min((int(ai) * (int(h) & 0xFFFFFFFF) + int(bi)) % MERSENNE for h in hashes) for ai, bi in zip(a, b)]
    assert signature(hashes, a, b).tolist() == expected


@pytest.mark.parametrize("union, common", [(1000, 500), (1000, 800), (1000, 200), (400, 380)])
def test_signature_agreement_estimates_jaccard_within_three_standard_errors(union, common):
    true = common / union
    generator = np.random.default_rng(union + common)
    first, second = overlapping_sets(generator, union, common)
    assert jaccard(first, second) == pytest.approx(true)
    estimates = []
    for seed in range(20):
        config = MinHashConfig(num_hashes=256, bands=16, seed=seed)
        a, b = permutation_parameters(config)
        estimate = float(np.mean(signature(first, a, b) == signature(second, a, b)))
        assert abs(estimate - true) <= 3 * math.sqrt(true * (1 - true) / 256)
        estimates.append(estimate)
    assert abs(np.mean(estimates) - true) <= 3 * math.sqrt(true * (1 - true) / (256 * 20))  # unbiased


def test_candidate_probability_equals_the_binomial_sum_and_the_documented_values():
    for similarity in (0.3, 0.5, 0.8, 0.95):
        for bands, rows in ((16, 8), (20, 5), (9, 13)):
            agree = similarity**rows
            direct = sum(math.comb(bands, k) * agree**k * (1 - agree) ** (bands - k) for k in range(1, bands + 1))
            assert candidate_probability(similarity, bands, rows) == pytest.approx(direct, abs=1e-12)
    assert candidate_probability(0.8, 16, 8) == pytest.approx(0.947, abs=5e-4)
    assert candidate_probability(0.5, 16, 8) == pytest.approx(0.061, abs=5e-4)


@pytest.mark.parametrize("similarity", [0.5, 0.7, 0.8, 0.9])
def test_candidate_rate_on_synthetic_pairs_follows_the_s_curve(similarity):
    config = MinHashConfig()
    a, b = permutation_parameters(config)
    generator = np.random.default_rng(int(similarity * 100))
    trials, candidates = 300, 0
    for _ in range(trials):
        first, second = overlapping_sets(generator, 200, int(similarity * 200))
        keys = band_keys(signature(first, a, b), config.bands), band_keys(signature(second, a, b), config.bands)
        candidates += bool(np.any(keys[0] == keys[1]))
    expected = candidate_probability(similarity, config.bands, config.rows)
    assert abs(candidates / trials - expected) <= 4 * math.sqrt(expected * (1 - expected) / trials) + 0.02


def test_band_keys_differ_exactly_in_the_bands_whose_rows_differ():
    values = np.arange(128, dtype=np.uint64) * np.uint64(7919)
    changed = values.copy()
    changed[[3, 70]] += np.uint64(1)  # rows of bands 0 and 8 (8 rows per band)
    differs = band_keys(values, 16) != band_keys(changed, 16)
    assert np.flatnonzero(differs).tolist() == [0, 8]


def test_normalise_text_folds_case_accents_punctuation_and_whitespace():
    assert normalise_text("Héllo,  WORLD!\n\tNaïve   café... (déjà_vu)") == "hello world naive cafe dejavu"
    assert normalise_text("“Quoted” — text; ok?") == "quoted text ok"


def test_shingle_hashes_are_the_distinct_word_ngrams():
    config = MinHashConfig(ngram=2)
    assert shingle_hashes("a b c a b", config).size == 3  # {a b, b c, c a}
    assert shingle_hashes("short", config).size == 1  # fewer words than ngram: one shingle of them all
    assert shingle_hashes(" ,. ", config).size == 0
    words = [f"w{index}" for index in range(60)]
    assert shingle_hashes(" ".join(words), MinHashConfig()).size == 56
    assert shingle_hashes("Ünïcode, TEXT", config).tolist() == shingle_hashes("unicode text", config).tolist()


def test_shingle_hashes_take_lone_surrogates_without_crashing():
    config = MinHashConfig(normalise=False)
    assert shingle_hashes("a \ud800 b c d e", config).size == 2


def test_jaccard_of_brute_force_sets_matches_hashed_shingles():
    rng = random.Random(3)
    vocabulary = [f"word{index}" for index in range(50)]
    for _ in range(20):
        first = " ".join(rng.choice(vocabulary) for _ in range(80))
        second = " ".join(rng.choice(vocabulary) if rng.random() < 0.1 else word for word in first.split())
        grams = [{tuple(text.split()[i:i + 3]) for i in range(len(text.split()) - 2)} for text in (first, second)]
        config = MinHashConfig(ngram=3)
        expected = len(grams[0] & grams[1]) / len(grams[0] | grams[1])
        assert jaccard(shingle_hashes(first, config), shingle_hashes(second, config)) == pytest.approx(expected)
