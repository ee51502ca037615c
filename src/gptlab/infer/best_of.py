"""Best-of-n sampling: n candidates for one prompt, scored by the caller's reward, the highest kept. Ids in, ids out.

    result = best_of(engine, prompt_ids, SamplingConfig(max_new_tokens=64, seed=7), n=8, score=score)
    result.tokens      the chosen candidate's new ids (its stop token excluded)
    result.reward      its score;  result.mean / result.min / result.max over all n candidates

All n candidates go to the engine at once, so they decode together. Candidate k is
seeded with seed + k (the convention of `gptlab sample --num-samples` and of the
API's `n`), and each request draws from its own generator: the result does not
depend on the batch, and n = 1 is plain sampling with the same seed. Ties go to
the lowest k, so a seeded run picks the same candidate every time.

`score(candidates)` gets the n candidates' ids and returns one finite number each;
what it measures (a reward model, a verifier, an LM judge) is the caller's business
(gptlab.align.rl.best_of builds one from a reward spec). Not here: text, rewards,
the HTTP API (gptlab.serve.best_of).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from gptlab.infer.engine import Engine
from gptlab.infer.generate import SamplingConfig
from gptlab.runtime import GptlabError

Scorer = Callable[[list[list[int]]], Sequence[float]]  # the candidates' new ids -> one score each
MAX_BEST_OF = 64  # candidates a single call may ask for: each holds a KV-cache slot


@dataclass(frozen=True)
class BestOf:
    """The chosen candidate, and the scores of all n for comparison."""

    index: int  # which candidate won (its seed is seed + index)
    candidates: list[list[int]]  # every candidate's new ids, stop token excluded
    finish_reasons: list[str]  # per candidate: "stop" or "length"
    scores: list[float]  # per candidate, as the scorer returned them

    @property
    def tokens(self) -> list[int]:
        return self.candidates[self.index]

    @property
    def finish_reason(self) -> str:
        return self.finish_reasons[self.index]

    @property
    def reward(self) -> float:
        return self.scores[self.index]

    @property
    def mean(self) -> float:
        return sum(self.scores) / len(self.scores)

    @property
    def min(self) -> float:
        return min(self.scores)

    @property
    def max(self) -> float:
        return max(self.scores)

    def summary(self) -> dict:
        """What a report shows: {"n": 8, "index": 3, "reward": 0.9, "mean": 0.4, "min": 0.1, "max": 0.9}."""
        return summarise(self.scores, self.index)


def check_best_of(n: object, what: str = "best-of n") -> int:
    """n itself, or one error naming the value and the range."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_BEST_OF:
        raise GptlabError(f"{what} must be a whole number from 1 to {MAX_BEST_OF}, got {n!r}")
    return n


def candidate_configs(config: SamplingConfig, n: int) -> list[SamplingConfig]:
    """n copies of `config`, candidate k seeded with seed + k (all unseeded when seed is None)."""
    check_best_of(n)
    return [replace(config, seed=None if config.seed is None else config.seed + k) for k in range(n)]


def sample_candidates(engine: Engine, prompt: list[int], config: SamplingConfig, n: int) -> tuple[list[list[int]], list[str]]:
    """(ids, finish reason) of n candidates, submitted together; any that fails cancels the rest and raises."""
    requests = []
    try:
        for candidate in candidate_configs(config, n):
            requests.append(engine.submit(prompt, candidate))
        tokens = [list(request) for request in requests]  # each blocks until its request finishes
    except BaseException:  # a bad prompt, or Ctrl-C while waiting: free the slots already taken
        for request in requests:
            engine.cancel(request)
        raise
    reasons = [request.finish_reason for request in requests]
    if any(reason not in ("stop", "length") for reason in reasons):
        raise GptlabError(f"a candidate ended with {next(r for r in reasons if r not in ('stop', 'length'))!r}; see the engine's log")
    return tokens, reasons


def check_scores(scores: object, n: int) -> list[float]:
    """The scores as floats, or one error saying what the scorer returned instead of n finite numbers."""
    if not isinstance(scores, Sequence) or isinstance(scores, (str, bytes)) or len(scores) != n:
        raise GptlabError(f"the best-of scorer must return {n} numbers, one per candidate; got {scores!r:.120}")
    for index, value in enumerate(scores):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise GptlabError(f"the best-of scorer returned {value!r:.60} for candidate {index}; scores must be finite numbers")
    return [float(value) for value in scores]


def choose(scores: Sequence[float]) -> int:
    """The index of the highest score; the first one on a tie (reproducible)."""
    return max(range(len(scores)), key=lambda k: (scores[k], -k))


def ranked(scores: Sequence[float]) -> list[int]:
    """Indices from the best score down, ties in candidate order: the n best of best_of are ranked[:n]."""
    return sorted(range(len(scores)), key=lambda k: (-scores[k], k))


def summarise(scores: Sequence[float], index: int) -> dict:
    """The chosen candidate's score against all of them."""
    return {"n": len(scores), "index": index, "reward": scores[index], "mean": sum(scores) / len(scores),
            "min": min(scores), "max": max(scores)}


def describe(summary: dict) -> str:
    """One line for a person: "best of 8: reward 0.930 (mean 0.410, min 0.100, max 0.930)"."""
    return (f"best of {summary['n']}: reward {summary['reward']:.4g} (mean {summary['mean']:.4g}, "
            f"min {summary['min']:.4g}, max {summary['max']:.4g})")


def best_of(engine: Engine, prompt: list[int], config: SamplingConfig, n: int, score: Scorer) -> BestOf:
    """Sample n candidates of `prompt` (candidate k seeded seed + k), score them all, keep the best."""
    candidates, reasons = sample_candidates(engine, prompt, config, n)
    scores = check_scores(score(candidates), n)
    return BestOf(choose(scores), candidates, reasons, scores)
