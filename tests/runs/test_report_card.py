"""A run's report cards (RUN/eval-*/eval.json, gptlab.eval.card's format) in its report.html and in `gptlab runs compare`."""

import shutil

from gptlab.eval.card import Card, proportion_row
from gptlab.runs import compare_runs, load_run, write_report

from .page import Page


def with_card(two_runs, tmp_path, name, right):
    folder = tmp_path / name
    shutil.copytree(two_runs[name][0], folder)
    card = Card(str(folder), [proportion_row("next_line", shots=0, metric="acc_per_token", right=right, n=200, chance=0.25),
                              proportion_row("last_word", shots=0, metric="exact", right=3, n=200)], settings={"seed": 1234})
    card.add_aggregate("CORE", card.rows)
    card.save(folder / "eval-core" / "eval.json")
    return folder, card


def test_report_shows_the_runs_report_card_row_by_row(two_runs, tmp_path):
    folder, card = with_card(two_runs, tmp_path, "short", 71)
    page = Page(write_report(folder).read_text())
    rows = page.tables["Report card (eval-core)"]
    assert rows[0] == ["task", "shots", "metric", "score", "95% interval", "chance", "n", "note"]
    assert [row[:4] for row in rows[1:]] == [["next_line", "0", "acc_per_token", "0.3550"], ["last_word", "0", "exact", "0.0150"]]
    assert rows[1][4] == f"{card.rows[0].low:.4f} to {card.rows[0].high:.4f}"
    assert page.tables["Aggregates (eval-core)"][1][:2] == ["CORE", f"{card.aggregates[0].score:.4f}"]


def test_report_says_how_to_make_a_card_when_the_run_has_none(two_runs, tmp_path):
    folder = tmp_path / "plain"
    shutil.copytree(two_runs["short"][0], folder)
    text = "".join(Page(write_report(folder).read_text()).text)
    assert f"gptlab eval {folder} --suite core" in text


def test_compare_puts_the_runs_cards_side_by_side(two_runs, tmp_path):
    short, _ = with_card(two_runs, tmp_path, "short", 71)
    long, _ = with_card(two_runs, tmp_path, "long", 90)
    table = compare_runs([short, long]).split("report cards (score and 95% interval):\n")[1].splitlines()
    assert table[0].split()[1:] == [str(short), str(long)]
    assert table[1].startswith("next_line (acc_per_token, 0-shot)") and "0.3550 (0.29-0.42)" in table[1] and "0.4500" in table[1]
    assert table[3].startswith("CORE")
    assert load_run(short).cards["eval-core"]["rows"][0]["task"] == "next_line"
    assert "report cards" not in compare_runs([two_runs["short"][0]])
