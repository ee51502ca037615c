"""Groups of runs over seeds: means and spreads, Welch's interval and p-value against scipy and the formula written out."""

import math
import statistics

import pytest
import scipy.stats

from gptlab.runs import compare_groups, group_figures, load_groups, parse_groups
from gptlab.runs.compare import made_by_us
from gptlab.runs.groups import welch_interval
from gptlab.runtime import GptlabError

from .seeds import fake_group, fake_run

BASE = [2.5012, 2.5231, 2.4897, 2.5104]
NEW = [2.4571, 2.4702, 2.4489]


def figures_of(tmp_path, **groups):
    folders = {name: fake_group(tmp_path, name, bpbs) for name, bpbs in groups.items()}
    return group_figures(load_groups(folders))


def test_group_spreads_are_the_mean_and_sample_std_of_each_runs_final_figures(tmp_path):
    figures = figures_of(tmp_path, base=BASE, new=NEW)
    spreads = {(s.group, s.metric): s for s in figures.spreads}
    for name, bpbs in (("base", BASE), ("new", NEW)):
        bpb = spreads[(name, "val_bpb")]
        assert (bpb.n, bpb.mean, bpb.std) == (len(bpbs), pytest.approx(sum(bpbs) / len(bpbs)), pytest.approx(
            math.sqrt(sum((b - sum(bpbs) / len(bpbs)) ** 2 for b in bpbs) / (len(bpbs) - 1))))
        assert spreads[(name, "final_val_loss")].mean == pytest.approx(1.5 * sum(bpbs) / len(bpbs))
        assert spreads[(name, "best_val_loss")].mean == spreads[(name, "final_val_loss")].mean
        assert spreads[(name, "final_loss")].std == pytest.approx(1.4 * statistics.stdev(bpbs))
        assert spreads[(name, "steps")].mean == 6 and spreads[(name, "steps")].std == 0
    assert {metric for _, metric in spreads} == {"val_bpb", "final_val_loss", "best_val_loss", "final_loss", "tokens_per_s", "steps"}


def test_group_difference_is_welchs_against_scipy_and_the_interval_written_out(tmp_path):
    figures = figures_of(tmp_path, base=BASE, new=NEW)
    row = next(d for d in figures.differences if d.metric == "val_bpb")
    assert (row.group, row.baseline) == ("new", "base")
    assert row.difference == pytest.approx(statistics.fmean(NEW) - statistics.fmean(BASE))
    assert row.p == pytest.approx(scipy.stats.ttest_ind(NEW, BASE, equal_var=False).pvalue, rel=1e-12)
    # Welch-Satterthwaite by hand: se² = s1²/n1 + s2²/n2, df = se⁴ / ((s1²/n1)²/(n1-1) + (s2²/n2)²/(n2-1))
    a = statistics.variance(NEW) / len(NEW)
    b = statistics.variance(BASE) / len(BASE)
    df = (a + b) ** 2 / (a * a / (len(NEW) - 1) + b * b / (len(BASE) - 1))
    half = scipy.stats.t.ppf(0.975, df) * math.sqrt(a + b)
    assert row.df == pytest.approx(df, rel=1e-12)
    assert (row.low, row.high) == (pytest.approx(row.difference - half, rel=1e-10), pytest.approx(row.difference + half, rel=1e-10))
    assert row.p < 0.05 and row.high < 0  # the new recipe is better, over its seeds


def test_welch_interval_by_hand_equals_scipys_confidence_interval():
    """The path for a scipy without TtestResult.confidence_interval() gives the same ends and df."""
    result = scipy.stats.ttest_ind(NEW, BASE, equal_var=False)
    low, high, df = welch_interval(NEW, BASE)
    assert (low, high) == pytest.approx(tuple(result.confidence_interval(0.95)), rel=1e-10)
    assert df == pytest.approx(result.df, rel=1e-12)


def test_a_group_of_one_run_has_no_std_and_no_interval_and_says_why(tmp_path):
    figures = figures_of(tmp_path, base=BASE, one=[2.4])
    one = next(s for s in figures.spreads if s.group == "one" and s.metric == "val_bpb")
    assert (one.n, one.mean, one.std) == (1, 2.4, None)
    row = next(d for d in figures.differences if d.metric == "val_bpb")
    assert row.difference == pytest.approx(2.4 - statistics.fmean(BASE))
    assert (row.low, row.high, row.p, row.missing) == (None, None, None, "n=1")
    text = compare_groups({name: [run.path for run in runs] for name, runs in figures.runs.items()})
    assert "2.4000 (n=1: no std)" in text and "- (n=1)" in text


def test_identical_figures_have_no_spread_to_test(tmp_path):
    figures = figures_of(tmp_path, base=BASE, new=NEW)
    steps = next(d for d in figures.differences if d.metric == "steps")
    assert (steps.difference, steps.low, steps.p, steps.missing) == (0, None, None, "no spread")


def test_a_metric_no_run_logged_is_left_out_and_one_some_runs_lack_counts_those_that_have_it(tmp_path):
    fake_run(tmp_path / "a1", loss=3.0)
    fake_run(tmp_path / "a2", loss=3.2)
    fake_run(tmp_path / "b1", loss=2.9, val_loss=3.1)
    fake_run(tmp_path / "b2", loss=2.8)
    figures = group_figures(load_groups({"a": [tmp_path / "a1", tmp_path / "a2"], "b": [tmp_path / "b1", tmp_path / "b2"]}))
    assert {s.metric for s in figures.spreads} == {"final_loss", "tokens_per_s", "steps", "final_val_loss", "best_val_loss"}
    val = next(d for d in figures.differences if d.metric == "final_val_loss")
    assert (val.difference, val.missing) == (None, "not logged")
    text = compare_groups({"a": [tmp_path / "a1", tmp_path / "a2"], "b": [tmp_path / "b1", tmp_path / "b2"]})
    assert "val bpb" not in text and "- (not logged)" in text


def test_compare_groups_warns_of_few_seeds_and_draws_every_run_labelled_group_and_run(tmp_path):
    from gptlab.runs.compare import comparison_figure
    from gptlab.runs.plots import pyplot

    groups = {"base": fake_group(tmp_path, "base", BASE), "new": fake_group(tmp_path, "new", NEW[:2])}
    text = compare_groups(groups, out_png=tmp_path / "seeds.png")
    assert text.splitlines()[0] == "warning: group new has 2 runs: fewer than 3 seeds, intervals and p-values are unreliable"
    assert "group base" not in text and "base (n=4)" in text and "new (n=2)" in text
    assert "new - base: difference of means, 95% interval" in text
    assert made_by_us(tmp_path / "seeds.png")
    figure = comparison_figure([run for runs in load_groups(groups).values() for run in runs], "step")
    try:
        labels = [line.get_label() for line in figure.axes[0].get_lines()]
    finally:
        pyplot().close(figure)
    assert labels == [f"base/base-seed{1337 + i}" for i in range(4)] + ["new/new-seed1337", "new/new-seed1338"]


def test_parse_groups_expands_globs_in_natural_order_and_takes_folders(tmp_path):
    runs = [fake_run(tmp_path / "sweep" / f"base-seed{seed}") for seed in (9, 10, 11)]
    fake_run(tmp_path / "alone")
    (tmp_path / "sweep" / "notes").mkdir()
    groups = parse_groups([f"glob={tmp_path}/sweep/base-seed*", f"folder={tmp_path}/sweep", f"run={tmp_path}/alone"])
    assert groups == {"glob": runs, "folder": runs, "run": [tmp_path / "alone"]}


@pytest.mark.parametrize("specs, message", [
    (["base"], "--group 'base' is not NAME=PATTERN; pass e.g. --group base='runs/base-seed*'"),
    (["=runs/*"], "--group '=runs/*' is not NAME=PATTERN"),
    (["base="], "--group 'base=' is not NAME=PATTERN"),
    (["a={tmp}/a*", "a={tmp}/b*"], "--group a is given twice; give each group its own name"),
    (["a={tmp}/zz-*"], "--group a={tmp}/zz-* matches nothing"),
])
def test_parse_groups_refuses_bad_specs(tmp_path, specs, message):
    fake_group(tmp_path, "a", [2.5])
    fake_group(tmp_path, "b", [2.5])
    with pytest.raises(GptlabError) as error:
        parse_groups([spec.format(tmp=tmp_path) for spec in specs])
    assert message.format(tmp=tmp_path) in str(error.value)


def test_load_groups_refuses_a_run_in_two_groups_and_an_empty_group(tmp_path):
    [run] = fake_group(tmp_path, "a", [2.5])
    with pytest.raises(GptlabError, match="is in both group a and group b; a run belongs to one group"):
        load_groups({"a": [run], "b": [tmp_path / "." / run.name]})
    with pytest.raises(GptlabError, match="group b has no runs"):
        load_groups({"a": [run], "b": []})
    with pytest.raises(GptlabError, match="no groups to compare"):
        compare_groups({})
