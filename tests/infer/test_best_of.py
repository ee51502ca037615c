"""Best-of-n over the engine: the highest-scoring candidate is kept, the summary is the scores' own, seeds reproduce it,
and n = 1 is plain sampling with the same seed (gptlab.infer.generate as the reference)."""

import pytest
import torch

from gptlab.infer import Engine, EngineConfig, SamplingConfig, generate
from gptlab.infer.best_of import best_of, candidate_configs, check_best_of, check_scores, choose, describe, ranked
from gptlab.model import GPT, preset
from gptlab.runtime import GptlabError

PROMPT = [5, 9, 2, 17]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(preset("gpt2-tiny", vocab_size=64, block_size=64)).float().eval()


@pytest.fixture()
def engine(model):
    with Engine(model, EngineConfig(slots=4)) as running:
        yield running


def config(seed=3, **changes) -> SamplingConfig:
    return SamplingConfig(**{"max_new_tokens": 8, "temperature": 1.0, "seed": seed, "vocab_size": 64, **changes})


def test_best_of_keeps_the_candidate_the_scorer_prefers_and_reports_its_scores(engine, model):
    seen = []

    def fewest_sevens(candidates):  # a known preference: fewer 7s is better; each candidate scored alone
        seen.append([list(c) for c in candidates])
        return [-sum(token % 7 == 0 for token in candidate) - 0.01 * k for k, candidate in enumerate(candidates)]

    result = best_of(engine, PROMPT, config(), 6, fewest_sevens)
    (candidates,) = seen
    scores = [-sum(t % 7 == 0 for t in c) - 0.01 * k for k, c in enumerate(candidates)]
    assert result.index == max(range(6), key=lambda k: scores[k]) > 0  # not simply the first candidate
    assert result.tokens == candidates[result.index]
    assert result.reward == max(scores) == result.max
    assert result.mean == pytest.approx(sum(scores) / 6)
    assert result.min == min(scores)
    assert result.summary() == {"n": 6, "index": result.index, "reward": max(scores), "mean": pytest.approx(sum(scores) / 6),
                                "min": min(scores), "max": max(scores)}
    # each candidate is what gptlab generate samples alone with seed + k
    for k, candidate in enumerate(candidates):
        assert candidate == generate(model, [PROMPT], config(seed=3 + k))[0]


def test_best_of_is_reproducible_with_a_seed(engine):
    def score(candidates):
        return [float(sum(candidate)) for candidate in candidates]

    first = best_of(engine, PROMPT, config(seed=11), 5, score)
    second = best_of(engine, PROMPT, config(seed=11), 5, score)
    assert (first.candidates, first.index, first.scores) == (second.candidates, second.index, second.scores)
    assert len({tuple(c) for c in first.candidates}) > 1  # the candidates differ: each has its own seed


def test_best_of_one_is_plain_sampling_with_the_same_seed(engine, model):
    result = best_of(engine, PROMPT, config(seed=5), 1, lambda candidates: [0.0])
    assert result.tokens == generate(model, [PROMPT], config(seed=5))[0]
    assert result.summary()["n"] == 1


def test_choose_takes_the_first_of_tied_best_scores_and_ranked_orders_them():
    assert choose([1.0, 3.0, 3.0, 2.0]) == 1
    assert ranked([1.0, 3.0, 3.0, 2.0]) == [1, 2, 3, 0]


def test_candidate_configs_seed_candidate_k_with_seed_plus_k_and_keep_unseeded_unseeded():
    assert [c.seed for c in candidate_configs(config(seed=4), 3)] == [4, 5, 6]
    assert [c.seed for c in candidate_configs(config(seed=None), 2)] == [None, None]


@pytest.mark.parametrize("n", [0, -1, 1.5, True, 10_000])
def test_best_of_n_out_of_range_is_one_error(n):
    with pytest.raises(GptlabError, match="--best-of must be a whole number from 1"):
        check_best_of(n, "--best-of")


@pytest.mark.parametrize("scores, message", [([1.0], "must return 2 numbers"), ("ab", "must return 2 numbers"),
                                             ([1.0, float("nan")], "candidate 1"), ([1.0, "x"], "candidate 1")])
def test_scores_that_are_not_one_finite_number_per_candidate_are_refused(scores, message):
    with pytest.raises(GptlabError, match=message):
        check_scores(scores, 2)


def test_a_scorer_that_returns_too_few_scores_is_refused_after_the_engine_is_free(engine):
    with pytest.raises(GptlabError, match="must return 3 numbers"):
        best_of(engine, PROMPT, config(), 3, lambda candidates: [1.0])
    assert engine.wait_idle(timeout=30)


def test_describe_says_the_reward_against_the_mean():
    line = describe({"n": 4, "index": 2, "reward": 0.9, "mean": 0.4, "min": 0.1, "max": 0.9})
    assert line == "best of 4: reward 0.9 (mean 0.4, min 0.1, max 0.9)"
