"""`gptlab sweep` then `gptlab fit` as a new user runs them, and their one-line refusals."""

import json
import subprocess

import pytest

from gptlab.cli.main import main
from tests.scaling.test_fit import sweep_rows
from tests.scaling.test_sweep import ONE_THREAD, _cli_sweep

pytestmark = pytest.mark.xdist_group("scaling_cli")  # one worker builds the module fixtures once, not each worker


@pytest.fixture(scope="module")
def swept(prepared, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "sweep"
    subprocess.run(_cli_sweep(prepared, out), check=True, capture_output=True, env=ONE_THREAD)  # 2 budgets x 3 sizes
    return out


def test_fit_command_writes_the_fit_its_summary_and_plots(swept, capsys):
    assert main(["fit", str(swept), "--samples", "5", "--target", "1e12"]) == 0
    printed = capsys.readouterr().out
    fit = json.loads((swept / "fit" / "fit.json").read_text())
    assert fit["format"] == "gptlab-fit" and fit["runs"] == 6 and fit["count"] == "total" and fit["power_laws"]["bootstrap_samples"] == 5
    assert [p["budget"] for p in fit["predictions"]] == [1e12] and len(fit["isoflop"]) == 2
    assert (swept / "fit" / "fit.txt").read_text().strip() == printed.split("\nwrote ")[0].strip()
    assert (swept / "fit" / "isoflops.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["fit", str(swept / "results.jsonl"), "--samples", "5", "--target", "1e12", "--out", str(swept / "again")]) == 0
    again = json.loads((swept / "again" / "fit.json").read_text())
    assert {k: v for k, v in again.items() if k != "results"} == {k: v for k, v in fit.items() if k != "results"}


def test_fit_command_shows_progress_on_stderr_and_quiet_leaves_it_out(swept, tmp_path, capsys):
    assert main(["fit", str(swept), "--samples", "4", "--out", str(tmp_path / "loud")]) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert lines[0].startswith("fit: 6 finished runs, 6 (budget, size) points over 2 budgets;")
    assert "fit: parametric bootstrap 4/4 refits" in captured.err and lines[-1] == "fit: drawing the plots"
    assert all(line.startswith("fit: ") for line in lines) and not any(line.startswith("fit: ") for line in captured.out.splitlines())
    assert main(["fit", str(swept), "--samples", "4", "--out", str(tmp_path / "quiet"), "--quiet"]) == 0
    quiet = capsys.readouterr()
    assert quiet.err == "" and quiet.out.replace(str(tmp_path / "quiet"), "") == captured.out.replace(str(tmp_path / "loud"), "")


def test_train_from_a_fit_of_a_known_law_trains_its_compute_optimal_tokens(prepared, tmp_path, capsys):
    """A sweep simulated from Epoch AI's law (budgets around the tiny models' sizes), fitted by `gptlab fit`, then
    `gptlab train --depth 1 --from-fit`: the run trains the law's own compute-optimal tokens for its N."""
    from gptlab.cli.train import resolve_config
    from gptlab.model.accounting import count_params
    from gptlab.scaling.laws import EPOCH

    rows = sweep_rows(EPOCH, budgets=(1e12, 1e13, 1e14))
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["fit", str(tmp_path / "results.jsonl"), "--samples", "0"]) == 0
    fit = tmp_path / "fit" / "fit.json"
    config = resolve_config("shakespeare-cpu", ["--data", str(prepared / "data")], depth=1, from_fit=str(fit))
    params = count_params(config.model, "total")
    budget = 6 * params * config.max_steps * config.batch_tokens
    assert EPOCH.compute_optimal(budget)[0] == pytest.approx(params, rel=0.01)  # within the last step's rounding
    args = ["train", "--depth", "1", "--from-fit", str(fit), "--data", str(prepared / "data"), "--max-steps", "2",
            "--micro-batch", "4", "--seq-len", "32", "--batch-tokens", "128", "--model.block-size", "32",
            "--eval-batches", "1", "--sample-tokens", "4", "--device", "cpu", "--out", str(tmp_path / "run")]
    capsys.readouterr()
    assert main(args) == 0
    assert f"from the fit {fit}: depth 1 trains 256 tokens in 2 steps" in capsys.readouterr().out  # explicit flags still win


@pytest.mark.parametrize(("args", "message"), [
    (["fit", "{tmp}/missing"], "does not exist"),
    (["fit", "{tmp}"], "neither a sweep folder"),
    (["sweep", "--budgets", "abc", "--sizes", "2", "--out", "{tmp}/s", "--data", "{data}"], "--budgets takes numbers"),
    (["sweep", "--budgets", "1e9", "--sizes", "2", "--out", "{tmp}/s"], "no training data"),
    (["sweep", "--budgets", "1e9", "--sizes", "2x3", "--out", "{tmp}/s", "--data", "{data}"], "multiple of the head size"),
    (["fit", "{swept}", "--samples", "-1", "--out", "{tmp}/f"], "--samples must be 0 or more"),
    # argparse alone reads -1e14 as a flag: "expected at least one argument"
    (["sweep", "--budgets", "-1e14", "--sizes", "2", "--out", "{tmp}/s", "--data", "{data}"],
     "--budgets takes positive numbers (FLOP budgets), got -1e14"),
    (["sweep", "--budgets", "1e12,-3e12", "--sizes", "2", "--out", "{tmp}/s", "--data", "{data}"], "got -3e12"),
    (["sweep", "--budgets", "1e12", "--lr-scales", "-inf", "--sizes", "2", "--out", "{tmp}/s", "--data", "{data}"],
     "--lr-scales takes positive numbers (multiples of each size's lr), got -inf"),
    (["fit", "{swept}", "--target", "1e15", "-1e14", "--out", "{tmp}/f"], "--target takes positive numbers (FLOP budgets), got -1e14"),
    (["fit", "{swept}", "--target", "0", "--out", "{tmp}/f"], "--target takes positive numbers (FLOP budgets), got 0"),
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


@pytest.mark.parametrize("content, message", [
    (b'{"run": "a"}\n{"run": "b"}\n\n{"run": "c"}\n{"run": "d"}\n{"run": "e", "budget": }\n', "line 6 is not JSON"),
    (b'{"run": "a"}\n{"run": "b", "size": "caf\xe9"}\n', "line 2 is not UTF-8 text (byte 0xe9)"),  # latin-1
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff", "line 1 is not UTF-8 text (byte 0x89)"),  # binary
])
def test_fit_names_the_file_and_line_of_a_damaged_results_file(tmp_path, capsys, content, message):
    (tmp_path / "results.jsonl").write_bytes(content)
    assert main(["fit", str(tmp_path / "results.jsonl")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"gptlab: error: {tmp_path / 'results.jsonl'} {message}") and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl"]


def test_fit_names_the_run_whose_figures_are_not_numbers(tmp_path, capsys):
    from gptlab.scaling.laws import EPOCH

    rows = sweep_rows(EPOCH, budgets=(1e12, 1e13))
    rows[3]["tokens"] = "many"
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["fit", str(tmp_path / "results.jsonl"), "--samples", "0"]) == 1
    err = capsys.readouterr().err
    assert f"run {rows[3]['run']} is marked finished but its tokens is 'many', not a number" in err and err.count("\n") == 1


def test_sweep_dry_run_shows_the_whole_grid_marks_short_points_then_refuses_in_one_line(prepared, tmp_path, capsys):
    """4e8 at 1x32 and 2x32, and 8e8 at 2x32, spend their budgets in 9 to 18 steps of 128 tokens: under --min-steps 20."""
    assert main(_cli_sweep(prepared, tmp_path / "s")[3:] + ["--min-steps", "20", "--dry-run"]) == 1
    captured = capsys.readouterr()
    table = {line.split()[0]: line for line in captured.out.splitlines()[1:]}
    assert sorted(table) == sorted(f"c{b}-{s}" for b in ("4e8", "8e8") for s in ("1x16", "1x32", "2x32"))  # every point shown
    marked = sorted(name for name, line in table.items() if line.endswith("< --min-steps 20"))
    assert marked == ["c4e8-1x32", "c4e8-2x32", "c8e8-2x32"]
    assert all(int(table[name].split()[4]) < 20 for name in marked) and all(int(line.split()[4]) >= 20
                                                                            for name, line in table.items() if name not in marked)
    assert captured.err.count("\n") == 1 and captured.err.startswith("gptlab: error: 3 of 6 grid points train fewer than "
                                                                    "--min-steps 20 steps of 128 tokens: c4e8-1x32 (11 steps")
    assert "lower --min-steps" in captured.err and not (tmp_path / "s").exists()
    assert main(_cli_sweep(prepared, tmp_path / "s")[3:] + ["--min-steps", "20"]) == 1  # a real run: refused before any work
    assert "3 of 6 grid points" in capsys.readouterr().err and not (tmp_path / "s").exists()
