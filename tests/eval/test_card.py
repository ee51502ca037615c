"""The report card: rows, intervals, CORE's centred mean, and eval.json round trips."""

import json
import math

import pytest
from scipy import stats

from gptlab.eval.card import Card, CardRow, centred_mean, mean_row, proportion_row
from gptlab.runtime import GptlabError


def test_card_centred_score_is_zero_at_chance_and_one_when_perfect():
    assert proportion_row("copa", shots=0, metric="acc", right=50, n=100, chance=0.5).centred == 0
    assert proportion_row("copa", shots=0, metric="acc", right=100, n=100, chance=0.5).centred == 1
    assert proportion_row("copa", shots=0, metric="acc", right=40, n=100, chance=0.5).centred == pytest.approx(-0.2)


def test_card_core_aggregate_is_the_mean_centred_accuracy_as_dclm_defines_it():
    # DCLM (Li et al. 2024), appendix G: centered = (acc - baseline) / (1 - baseline), CORE = their mean
    rows = [proportion_row("arc_easy", shots=10, metric="acc", right=600, n=1000, chance=0.25),
            proportion_row("piqa", shots=10, metric="acc", right=700, n=1000, chance=0.5),
            proportion_row("lambada", shots=0, metric="exact", right=300, n=1000, chance=0.0)]
    aggregate = centred_mean("CORE", rows)
    expected = ((0.6 - 0.25) / 0.75 + (0.7 - 0.5) / 0.5 + 0.3) / 3
    assert aggregate.score == pytest.approx(expected)
    # each task's standard error read off its own (Wilson) interval, so 0 right of n still has a spread
    half = 1.959964 * math.sqrt(sum(((r.high - r.low) / (2 * 1.959964) / (1 - r.chance)) ** 2 for r in rows)) / 3
    assert (aggregate.low, aggregate.high) == pytest.approx((expected - half, expected + half), abs=1e-6)
    none_right = centred_mean("ChatCORE", [proportion_row("gsm8k", shots=0, metric="acc", right=0, n=12)])
    assert none_right.score == 0 and none_right.high > 0.1
    assert aggregate.tasks == ("arc_easy", "piqa", "lambada")


def test_card_proportion_interval_is_wilson_and_mean_interval_is_student_t():
    row = proportion_row("boolq", shots=10, metric="acc", right=81, n=100, chance=0.62)
    low, high = stats.binomtest(81, 100).proportion_ci(method="wilson")
    assert (row.low, row.high) == pytest.approx((low, high), abs=1e-9)
    values = [7, 5, 9, 6, 8]
    graded = mean_row("single", shots=0, metric="grade", values=values)
    low, high = stats.t.interval(0.95, len(values) - 1, loc=7, scale=stats.sem(values))
    assert graded.score == 7 and (graded.low, graded.high) == pytest.approx((low, high))


def test_card_saves_atomically_and_loads_back_equal(tmp_path):
    card = Card("runs/demo/train", [proportion_row("lambada", shots=0, metric="exact", right=3, n=50, note="tiny")])
    card.add_aggregate("CORE", card.rows)
    card.settings["seed"] = 1234
    path = card.save(tmp_path / "eval.json")
    assert Card.load(path) == card
    assert json.loads(path.read_text())["rows"][0]["centred"] == pytest.approx(0.06)
    assert [p.name for p in tmp_path.iterdir()] == ["eval.json"]


def test_card_text_has_one_row_per_task_and_the_aggregate():
    card = Card("m", [proportion_row("arc_easy", shots=10, metric="acc_per_token", right=30, n=100, chance=0.25)])
    card.add_aggregate("CORE", card.rows)
    lines = card.text().splitlines()
    assert lines[0].split() == ["task", "shots", "metric", "score", "95%", "interval", "chance", "n"]
    assert lines[2].split()[:4] == ["arc_easy", "10", "acc_per_token", "0.3000"]
    assert lines[3].startswith("CORE 0.0667 (95% ")


def test_card_refuses_files_that_are_not_cards(tmp_path):
    with pytest.raises(GptlabError, match="no report card"):
        Card.load(tmp_path / "eval.json")
    (tmp_path / "eval.json").write_text('{"format_version": 1, "rows": [{"task": 1}]}')
    with pytest.raises(GptlabError, match="not a readable report card"):
        Card.load(tmp_path / "eval.json")
    (tmp_path / "eval.json").write_text("[]")
    with pytest.raises(GptlabError, match="not a gptlab report card"):
        Card.load(tmp_path / "eval.json")
    with pytest.raises(GptlabError, match="no scores"):
        mean_row("x", shots=0, metric="grade", values=[])
    with pytest.raises(GptlabError, match="nothing to centre"):
        _ = CardRow("x", 0, "acc", 1.0, 1.0, 1.0, chance=1.0).centred
