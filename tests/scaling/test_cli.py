"""`gptlab sweep` then `gptlab fit` as a new user runs them, and their one-line refusals."""

import json
import subprocess

import pytest

from gptlab.cli.main import main
from tests.scaling.test_sweep import _cli_sweep


@pytest.fixture(scope="module")
def swept(prepared, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "sweep"
    subprocess.run(_cli_sweep(prepared, out, budgets=("4e8", "8e8", "1.6e9")), check=True, capture_output=True)
    return out


def test_fit_command_writes_the_fit_its_summary_and_plots(swept, capsys):
    assert main(["fit", str(swept), "--samples", "20", "--target", "1e12"]) == 0
    printed = capsys.readouterr().out
    fit = json.loads((swept / "fit" / "fit.json").read_text())
    assert fit["format"] == "gptlab-fit" and fit["runs"] == 9 and fit["count"] == "total"
    assert [p["budget"] for p in fit["predictions"]] == [1e12] and len(fit["isoflop"]) == 3
    assert (swept / "fit" / "fit.txt").read_text().strip() == printed.split("\nwrote ")[0].strip()
    assert (swept / "fit" / "isoflops.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["fit", str(swept / "results.jsonl"), "--samples", "20", "--target", "1e12", "--out", str(swept / "again")]) == 0
    again = json.loads((swept / "again" / "fit.json").read_text())
    assert {k: v for k, v in again.items() if k != "results"} == {k: v for k, v in fit.items() if k != "results"}


def test_train_from_the_fit_runs(swept, prepared, tmp_path, capsys):
    if main(["fit", str(swept), "--samples", "0", "--out", str(tmp_path / "fit")]) != 0:
        pytest.fail(capsys.readouterr().err)
    if json.loads((tmp_path / "fit" / "fit.json").read_text())["depth_dial"] is None:
        pytest.skip("this tiny sweep found no compute-optimal law")  # the unit tests cover --from-fit with a law
    args = ["train", "--depth", "1", "--from-fit", str(tmp_path / "fit" / "fit.json"), "--data", str(prepared / "data"),
            "--max-steps", "2", "--micro-batch", "4", "--seq-len", "32", "--batch-tokens", "128", "--model.block-size", "32",
            "--eval-batches", "1", "--sample-tokens", "4", "--device", "cpu", "--out", str(tmp_path / "run")]
    assert main(args) == 0
    assert "from the fit" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "message"), [
    (["fit", "{tmp}/missing"], "does not exist"),
    (["fit", "{tmp}"], "neither a sweep folder"),
    (["sweep", "--budgets", "abc", "--sizes", "2", "--out", "{tmp}/s", "--data", "{data}"], "--budgets takes numbers"),
    (["sweep", "--budgets", "1e9", "--sizes", "2", "--out", "{tmp}/s"], "no training data"),
    (["sweep", "--budgets", "1e9", "--sizes", "2x3", "--out", "{tmp}/s", "--data", "{data}"], "multiple of the head size"),
    (["fit", "{swept}", "--samples", "-1", "--out", "{tmp}/f"], "--samples must be 0 or more"),
])
def test_commands_refuse_bad_input_in_one_line(swept, prepared, tmp_path, capsys, args, message):
    values = {"tmp": tmp_path, "data": prepared / "data", "swept": swept}
    assert main([arg.format(**values) for arg in args]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "s").exists() and not (tmp_path / "f").exists()


def test_fit_refuses_an_out_folder_it_did_not_make(swept, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["fit", str(swept), "--out", str(tmp_path)]) == 1
    assert "holds things this command did not make (notes.txt)" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_sweep_dry_run_prints_the_grid_and_makes_nothing(prepared, tmp_path, capsys):
    assert main(_cli_sweep(prepared, tmp_path / "s")[3:] + ["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "c4e8-1x16" in out and "c8e8-2x32" in out and "epochs" in out and not (tmp_path / "s").exists()
