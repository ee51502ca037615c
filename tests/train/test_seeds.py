"""`gptlab train --seeds N`: N ordinary runs at seeds S..S+N-1 into OUT-seedS, then their figures over seeds."""

import json

import pytest

from gptlab.cli.main import main
from gptlab.load.checkpoints import list_checkpoints
from tests.train.test_ctrl_c_step import ctrl_c_inside_step, keep_sigint  # noqa: F401 - the fixture restores SIGINT
from tests.train.test_train_command import tiny, weights


def test_train_seeds_trains_a_run_per_seed_and_prints_their_spread(prepared, tmp_path, capsys):
    out = tmp_path / "base"
    assert main(tiny(prepared, out, "--max-steps", "2", "--eval-every", "0", "--seed", "5", "--seeds", "2")) == 0
    folders = [tmp_path / "base-seed5", tmp_path / "base-seed6"]
    assert [json.loads((folder / "train_config.json").read_text())["seed"] for folder in folders] == [5, 6]
    assert not out.exists()
    first, second = (weights(list_checkpoints(folder)[-1]) for folder in folders)
    assert any(not first[name].equal(second[name]) for name in first)  # other seeds, other weights
    text = capsys.readouterr().out
    summary = text[text.index("base over 2 seeds:"):]
    assert "warning: group base has 2 runs: fewer than 3 seeds, intervals and p-values are unreliable" in summary
    assert "base (n=2)" in summary and "val bpb" in summary and "±" in summary
    assert summary.rstrip().endswith(f"gptlab runs compare --group base='{out}-seed*' --group NAME='OUT-seed*'")

    assert main(tiny(prepared, out, "--max-steps", "2", "--eval-every", "0", "--seed", "5", "--seeds", "2")) == 0
    again = capsys.readouterr().out  # the same command: each seed's run is already done
    assert again.count("already finished its 2 steps") == 2 and "base (n=2)" in again


def test_train_seeds_one_run_goes_into_out_seed_s_of_the_presets_seed(prepared, tmp_path, capsys):
    assert main(tiny(prepared, tmp_path / "one", "--max-steps", "1", "--eval-every", "0", "--seeds", "1")) == 0
    assert list_checkpoints(tmp_path / "one-seed1337") and "(n=1: no std)" in capsys.readouterr().out


def test_train_seeds_without_out_names_a_new_run_folder_per_seed(prepared, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = tiny(prepared, tmp_path / "unused", "--max-steps", "1", "--eval-every", "0", "--seeds", "2")
    i = args.index("--out")
    assert main(args[:i] + args[i + 2:]) == 0
    folders = sorted(path.name for path in (tmp_path / "runs").iterdir())
    assert len(folders) == 2 and folders[0].startswith("train-") and [name[-9:] for name in folders] == ["-seed1337", "-seed1338"]
    assert folders[1] == folders[0].replace("-seed1337", "-seed1338")
    assert f"no --out given: training into runs/{folders[0]}..." in capsys.readouterr().out


@pytest.mark.parametrize("seeds", ["0", "-2"])
def test_train_seeds_refuses_no_runs_in_one_line(prepared, tmp_path, capsys, seeds):
    assert main(tiny(prepared, tmp_path / "none", "--seeds", seeds)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--seeds {seeds} trains no run; pass --seeds 1 or more" in err
    assert not list(tmp_path.iterdir())


def test_train_seeds_ctrl_c_saves_the_current_run_and_starts_no_later_seed(prepared, tmp_path, monkeypatch, capsys):
    ctrl_c_inside_step(monkeypatch, step=2, presses=1)
    assert main(tiny(prepared, tmp_path / "base", "--max-steps", "4", "--eval-every", "0", "--seeds", "2")) == 130
    assert list_checkpoints(tmp_path / "base-seed1337")[-1].name == "step_000002"
    assert not (tmp_path / "base-seed1338").exists()
    out = capsys.readouterr().out
    assert "interrupted: seed 1338 not started; rerun the same command to go on" in out and "over 2 seeds" not in out
