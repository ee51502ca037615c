"""`--count active`: dense and mixture-of-experts sizes in one sweep spend the same FLOPs per budget, and a fit
states its laws in the active count (= matmul for a dense model)."""

import pytest

from gptlab.cli.main import main
from gptlab.model import GPT
from gptlab.model.accounting import scaling_params
from gptlab.scaling.fit import finished_runs
from gptlab.scaling.sweep import SweepConfig, plan
from tests.scaling.test_fit import sweep_rows
from tests.train.conftest import tiny_config

SIZES = ("1x32", "moe-tiny")


def base_config(prepared):
    return tiny_config(prepared, "", eval_every=0, checkpoint_every=0, log_every=2)


@pytest.mark.parametrize("count", ["active", "total"])
def test_plan_gives_moe_and_dense_sizes_steps_from_their_active_count(prepared, tmp_path, count):
    base = base_config(prepared)
    points = plan(base, SweepConfig(budgets=(4e8, 8e8), sizes=SIZES, head_dim=16, min_steps=1, count=count), tmp_path,
                  allow_short=True)
    assert [p.size for p in points] == list(SIZES) * 2
    for point in points:
        model = GPT(point.config.model)
        touched = point.params["active" if point.config.model.is_moe else count]  # dense: the convention, as before
        assert point.params["total"] == model.num_params()  # every expert stored
        assert point.config.max_steps == round(point.budget / (6 * touched) / base.batch_tokens)  # MoE: what a token uses
    dense, moe = points[0].params, points[1].params
    assert dense["active"] == dense["matmul"] and moe["active"] < moe["matmul"]
    assert points[1].config.model.is_moe and points[1].params == scaling_params(points[1].config.model)


def test_sweep_count_active_dry_run_prints_active_n_for_a_mixed_grid(prepared, tmp_path, capsys):
    args = ["sweep", "--budgets", "4e8", "--sizes", *SIZES, "--count", "active", "--head-dim", "16", "--min-steps", "1",
            "--out", str(tmp_path / "s"), "--data", str(prepared / "data"), "--model.block-size", "32", "--seq-len", "32",
            "--micro-batch", "4", "--batch-tokens", "128", "--precision", "fp32", "--device", "cpu", "--dry-run"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "active N" in out and "c4e8-moe-tiny" in out and "c4e8-1x32" in out and not (tmp_path / "s").exists()


def test_finished_runs_read_the_active_count_and_refuse_rows_without_it():
    rows = sweep_rows()
    for row in rows:
        row["params"]["active"] = 0.7 * row["params"]["total"]
    runs, _ = finished_runs(rows, count="active")
    assert list(runs.params) == pytest.approx([row["params"]["active"] for row in rows])
    for row in rows:
        del row["params"]["active"]
    with pytest.raises(ValueError, match=r"no params\['active'\]"):
        finished_runs(rows, count="active")


def test_fit_command_states_the_laws_in_the_active_count(tmp_path, capsys):
    import json

    from gptlab.scaling.laws import EPOCH

    rows = sweep_rows(EPOCH, budgets=(1e12, 1e13))
    (tmp_path / "old.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["fit", str(tmp_path / "old.jsonl"), "--count", "active", "--samples", "0", "--out", str(tmp_path / "no")]) == 1
    assert "has no params['active']" in capsys.readouterr().err and not (tmp_path / "no").exists()
    for row in rows:
        row["params"]["active"] = 0.9 * row["params"]["total"]  # a dense sweep's: = matmul
        row["count"] = "active"
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["fit", str(tmp_path / "results.jsonl"), "--samples", "0"]) == 0  # the sweep's count by default
    fit = json.loads((tmp_path / "fit" / "fit.json").read_text())
    assert fit["count"] == "active" and fit["runs"] == len(rows)
