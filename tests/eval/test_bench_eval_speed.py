"""bench/eval_speed.py's functions on a tiny model and an MMLU folder written here: both sides (gptlab's
evaluate_task and lm-eval's HFLM) give the same answers and log-likelihoods on both forms, and the token counts
the bench reports follow from the request lengths (the cloze form's context once for gptlab, once per choice for
lm-eval; the letters form's one-token continuations once for both)."""

import csv
import importlib
from pathlib import Path

import pytest

from gptlab.tokenizer.pretrained import load_pretrained

DEV = {
    "astronomy": [("What is the Sun?", "A planet", "A star", "A moon", "A comet", "B"),
                  ("Which planet is largest?", "Mars", "Earth", "Jupiter", "Venus", "C"),
                  ("Which planet has rings?", "Saturn", "Mercury", "Mars", "Venus", "A"),
                  ("What is a light year?", "A time", "A mass", "A speed", "A distance", "D"),
                  ("Which is nearest the Sun?", "Earth", "Mercury", "Mars", "Pluto", "B")],
    "biology": [("What do plants take in?", "Carbon dioxide", "Helium", "Neon", "Argon", "A"),
                ("Where is DNA kept?", "In the skin", "In the nucleus", "In the hair", "In the blood only", "B")],
    "chemistry": [("What is H2O?", "Salt", "Air", "Gold", "Water", "D"),
                  ("What is NaCl?", "Table salt", "Sugar", "Sand", "Iron", "A"),
                  ("What is the pH of pure water?", "1", "7", "14", "0", "B"),
                  ("Which is a noble gas?", "Oxygen", "Nitrogen", "Argon", "Hydrogen", "C"),
                  ("What is CO2?", "Carbon dioxide", "Water", "Salt", "Ozone", "A")],
}  # 5 dev questions for each tested subject: MMLU's shots come from the question's own subject
TEST = {
    "astronomy": [("How many moons has Earth?", "None", "One", "Two", "Three", "B"),
                  ("What orbits the Earth?", "The Sun", "Mars", "The Moon", "Venus", "C")],
    "chemistry": [("What is the symbol of gold?", "Au", "Ag", "Fe", "Cu", "A"),
                  ("Which gas do we breathe to live?", "Helium", "Neon", "Argon", "Oxygen", "D")],
}


@pytest.fixture(scope="module")
def bench():
    """The bench module (bench/ is not a package: its scripts import machine.py from their own folder)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
        return importlib.import_module("eval_speed")


@pytest.fixture(scope="module")
def mmlu(tmp_path_factory):
    """MMLU's CSV layout: dev/SUBJECT_dev.csv and test/SUBJECT_test.csv, no header."""
    folder = tmp_path_factory.mktemp("mmlu")
    for split, subjects in (("dev", DEV), ("test", TEST)):
        (folder / split).mkdir()
        for subject, rows in subjects.items():
            with open(folder / split / f"{subject}_{split}.csv", "w", newline="") as handle:
                csv.writer(handle).writerows(rows)
    return folder


@pytest.fixture(scope="module")
def sides(bench, tmp_path_factory):
    directory = bench.build_model_folder(tmp_path_factory.mktemp("hf_gpt2"), bench.QUICK)
    return bench.load_sides(directory, batch_size=3)


def test_bench_eval_speed_sides_give_the_same_answers_and_log_likelihoods_on_both_forms(bench, mmlu, sides):
    model, lm = sides
    records, pool = bench.mmlu_sample(mmlu, 4)
    assert {record["id"] for record in records} == {f"mmlu/{s}/test/{i}" for s in TEST for i in (1, 2)}
    encode = load_pretrained("gpt2").encode_ordinary
    for spec, form, shots in ((bench.LETTERS, records, pool),
                              (bench.CLOZE, [bench.as_cloze(r) for r in records], [bench.as_cloze(r) for r in pool])):
        result = bench.measure_form(spec, form, shots, model, lm, encode, batch_size=3, rounds=1)
        assert result.questions == 4 and result.same_answers == 4
        assert result.largest_difference < 1e-4
        assert [len(result.seconds[side]) for side in ("gptlab", "lm-eval")] == [1, 1]
        # the per-question log-likelihoods themselves, outside the timed loop
        ours, our_answers = bench.run_gptlab(model, spec, form, shots, encode, 3)
        theirs, their_answers = bench.run_lm_eval(lm, bench.render_questions(spec, form, shots))
        assert our_answers == their_answers == [bench.answer(q) for q in theirs]
        for mine, other in zip(ours, theirs, strict=True):
            assert mine == pytest.approx(other, abs=1e-4)


def test_bench_eval_speed_cloze_prompts_carry_the_choice_texts_and_the_letters_prompts_the_letters(bench, mmlu):
    records, pool = bench.mmlu_sample(mmlu, 4)
    cloze = bench.render_questions(bench.CLOZE, [bench.as_cloze(r) for r in records], [bench.as_cloze(r) for r in pool])
    letters = bench.render_questions(bench.LETTERS, records, pool)
    for record, texts, lettered in zip(records, cloze, letters):
        assert [continuation for _, continuation in texts] == [" " + text for text in record["choice_texts"]]
        assert [continuation for _, continuation in lettered] == [" A", " B", " C", " D"]
        assert texts[0][0].endswith(f"Question: {record['question']}\nAnswer:")
        assert texts[0][0].count("\n\n") == 5  # five shots, each followed by the example delimiter
        subject = record["subject"]
        assert lettered[0][0].startswith(f"The following are multiple choice questions (with answers) about {subject}.\n\n")
        assert lettered[0][0].count("\n\n") == 6  # the subject's description, then its five dev questions
        assert [line for line in lettered[0][0].split("\n") if line.endswith("?")][:5] == [row[0] for row in DEV[subject]]


def test_bench_eval_speed_token_counts_follow_from_the_request_lengths(bench):
    encode = load_pretrained("gpt2").encode_ordinary
    context = "Question: Which planet is the largest in our solar system?\nAnswer:"
    cloze = [(context, " Jupiter, the gas giant"), (context, " Mars"), (context, " the Moon and the Sun")]
    letters = [(context, " A"), (context, " B")]
    c, conts = len(encode(context)), [len(encode(context + text)) - len(encode(context)) for _, text in cloze]
    counts = bench.tokens_per_question([cloze], encode, block_size=1024, batch_size=8, lm_eval_batch_size=8)
    # gptlab: the context once, then each continuation but its last token; lm-eval: each request's input whole
    assert counts["gptlab"]["tokens"] == c + sum(n - 1 for n in conts)
    assert counts["gptlab"]["head"] == sum(conts)
    assert counts["lm-eval"]["tokens"] == sum(c + n - 1 for n in conts)
    assert counts["lm-eval"]["head"] == counts["lm-eval"]["padded"] == 3 * (c + max(conts) - 1)  # one batch, padded to its longest
    one_by_one = bench.tokens_per_question([cloze], encode, block_size=1024, batch_size=8, lm_eval_batch_size=1)
    assert one_by_one["lm-eval"]["padded"] == one_by_one["lm-eval"]["tokens"]
    # one-token continuations: lm-eval runs the shared input once, as gptlab does; its head still sees every position
    counts = bench.tokens_per_question([letters], encode, block_size=1024, batch_size=8, lm_eval_batch_size=8)
    assert counts["gptlab"]["tokens"] == counts["lm-eval"]["tokens"] == c
    assert counts["gptlab"]["head"] == 2 and counts["lm-eval"]["head"] == c
