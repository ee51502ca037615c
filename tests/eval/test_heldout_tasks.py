"""Benchmarks cut from held-out text: deterministic, well-formed, and the right answer really is the text's."""

import pytest

from gptlab.eval.tasks.heldout import last_word_records, next_line_records
from gptlab.runtime import GptlabError

PLAY = "\n".join(f"Line number {i} of the play, where someone speaks at length {'x' * (i % 7 + 1)}" for i in range(60))
OTHER = "ROMEO:\n" + "\n".join(f"Another work's verse {i}, said softly by the fountain" for i in range(40))


def test_next_line_records_hold_the_true_next_line_among_distinct_choices():
    records = next_line_records([PLAY, OTHER], 30, context_lines=4, choices=4, seed=3)
    assert len(records) == 30 and len({r["id"] for r in records}) == 30
    for record in records:
        lines = record["query"].split("\n")
        assert len(lines) == 4
        answer = record["choices"][record["gold"]]
        text = PLAY if lines[0] in PLAY.split("\n") else OTHER
        source = text.split("\n")
        assert source[source.index(lines[-1]) + 1] == answer  # the gold choice is the line after the passage
        assert len(set(record["choices"])) == 4


def test_held_out_records_are_the_same_for_a_seed_and_differ_across_seeds():
    assert next_line_records([PLAY], 10, seed=1) == next_line_records([PLAY], 10, seed=1)
    assert next_line_records([PLAY], 10, seed=1) != next_line_records([PLAY], 10, seed=2)
    assert last_word_records([PLAY], 10, seed=1) == last_word_records([PLAY], 10, seed=1)


def test_last_word_records_split_a_passage_at_its_last_space():
    for record in last_word_records([PLAY], 20, context_lines=3):
        assert " " not in record["continuation"]
        assert f"{record['context']} {record['continuation']}" in PLAY
        assert record["context"].count("\n") == 2


def test_held_out_tasks_take_all_passages_when_fewer_than_asked_and_refuse_text_without_lines():
    assert len(next_line_records([PLAY], 10_000)) == 60 - 4
    with pytest.raises(GptlabError, match="too few lines"):
        next_line_records(["ABC\nDEF"], 5)
    with pytest.raises(GptlabError, match="no passages"):
        last_word_records(["short"], 5)
