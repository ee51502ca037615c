"""`gptlab runs report` and `gptlab runs compare` (of runs, and of groups over seeds): what they write, and the one-line refusals."""

import shutil

import pytest

from gptlab.cli.main import main
from gptlab.runs.report import REPORT_FILE

from .seeds import fake_group


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gptlab: error:") and "Traceback" not in err
    return err


def test_runs_report_rewrites_the_runs_page(two_runs, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(two_runs["short"][0], folder)
    (folder / REPORT_FILE).unlink()
    assert main(["runs", "report", str(folder)]) == 0
    assert f"report -> {folder / REPORT_FILE}" in capsys.readouterr().out
    assert (folder / REPORT_FILE).read_text().startswith("<!DOCTYPE html>")


def test_runs_compare_writes_its_png_and_replaces_only_its_own(two_runs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    runs = [str(two_runs["short"][0]), str(two_runs["long"][0])]
    assert main(["runs", "compare", *runs, "--x", "time"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("run ") and "curves against time -> runs-compare.png" in out
    first = (tmp_path / "runs-compare.png").read_bytes()
    assert main(["runs", "compare", *runs, "--x", "flops"]) == 0  # its own file: replaced without --force
    assert (tmp_path / "runs-compare.png").read_bytes() != first

    (tmp_path / "mine.png").write_bytes(first[:8] + b"not a comparison")
    assert main(["runs", "compare", *runs, "--out", "mine.png"]) == 1
    assert "mine.png exists and was not made by `gptlab runs compare`; pass --force" in error_line(capsys)
    assert (tmp_path / "mine.png").read_bytes() == first[:8] + b"not a comparison"
    assert main(["runs", "compare", *runs, "--out", "mine.png", "--force"]) == 0
    assert (tmp_path / "mine.png").read_bytes()[:8] == first[:8]


@pytest.mark.parametrize("args, message", [
    (["runs", "report", "{tmp}/missing"], "missing does not exist; pass a run folder"),
    (["runs", "compare", "{short}", "{tmp}/missing"], "missing does not exist"),
    (["runs", "report", "{tmp}/empty"], "empty has no metrics.jsonl, so it is not a training run"),
    (["runs", "report", "{tmp}/pipeline"], "pipeline has no metrics.jsonl, so it is not a training run; its runs are {tmp}/pipeline/train"),
    (["runs", "compare", "{short}", "--out", "{tmp}/table.txt"], "--out {tmp}/table.txt is not a .png file name"),
    (["runs", "compare", "{short}", "--out", "{tmp}/empty.png"], "--out {tmp}/empty.png is a folder"),
])
def test_runs_commands_refuse_bad_input_in_one_line(two_runs, tmp_path, capsys, args, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty.png").mkdir()
    shutil.copytree(two_runs["short"][0], tmp_path / "pipeline" / "train")
    names = {"tmp": tmp_path, "short": two_runs["short"][0]}
    assert main([arg.format(**names) for arg in args]) == 1
    assert message.format(**names) in error_line(capsys)
    assert not (tmp_path / "table.txt").exists()


def test_runs_report_never_replaces_a_page_it_did_not_write(two_runs, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(two_runs["short"][0], folder)
    (folder / REPORT_FILE).write_text("<html>my own notes</html>")
    assert main(["runs", "report", str(folder)]) == 1
    assert f"{folder / REPORT_FILE} exists and was not written by gptlab" in error_line(capsys)
    assert (folder / REPORT_FILE).read_text() == "<html>my own notes</html>"


def test_runs_compare_rejects_an_unknown_axis_as_usage(two_runs, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["runs", "compare", str(two_runs["short"][0]), "--x", "epochs"])
    assert exit_.value.code == 2 and "invalid choice: 'epochs'" in capsys.readouterr().err


def test_runs_compare_groups_prints_each_groups_spread_and_the_difference_and_draws_every_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    fake_group(tmp_path / "runs", "base", [2.50, 2.52, 2.49])
    fake_group(tmp_path / "runs", "new", [2.45, 2.47])
    assert main(["runs", "compare", "--group", "base=runs/base-seed*", "--group", "new=runs/new-*", "--out", "seeds.png"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == "warning: group new has 2 runs: fewer than 3 seeds, intervals and p-values are unreliable"
    assert lines[3].split() == ["metric", "base", "(n=3)", "new", "(n=2)"]
    assert lines[4].split() == ["val", "bpb", "2.5033", "±", "0.0153", "2.4600", "±", "0.0141"]
    assert "new - base: difference of means, 95% interval and two-sided p of Welch's t-test" in out
    assert out.rstrip().endswith("curves against step -> seeds.png") and err == ""
    (tmp_path / "mine.png").write_bytes(b"\x89PNG\r\n\x1a\nmine")
    assert main(["runs", "compare", "--group", "base=runs/base-seed*", "--out", "mine.png"]) == 1
    assert "mine.png exists and was not made by `gptlab runs compare`; pass --force" in error_line(capsys)


@pytest.mark.parametrize("args, message", [
    (["--group", "base"], "--group 'base' is not NAME=PATTERN; pass e.g. --group base='runs/base-seed*'"),
    (["--group", "base={tmp}/runs/base-*", "--group", "base={tmp}/runs/new-*"], "--group base is given twice"),
    (["--group", "base={tmp}/runs/old-*"], "--group base={tmp}/runs/old-* matches nothing"),
    (["--group", "base={tmp}/runs/*"], "{tmp}/runs/empty has no metrics.jsonl, so it is not a training run"),
    (["--group", "all={tmp}/runs/*-seed*", "--group", "base={tmp}/runs/base-*"],
     "{tmp}/runs/base-seed1337 is in both group all and group base; a run belongs to one group"),
    (["{tmp}/runs/new-seed1337", "--group", "base={tmp}/runs/base-*"], "pass run folders or --group NAME=PATTERN, not both"),
    ([], "no runs to compare: pass one or more run folders, or --group NAME=PATTERN"),
])
def test_runs_compare_groups_refuse_bad_input_in_one_line(tmp_path, capsys, args, message):
    fake_group(tmp_path / "runs", "base", [2.50, 2.52, 2.49])
    fake_group(tmp_path / "runs", "new", [2.45])
    (tmp_path / "runs" / "empty").mkdir()
    out = tmp_path / "seeds.png"
    assert main(["runs", "compare", *(arg.format(tmp=tmp_path) for arg in args), "--out", str(out)]) == 1
    assert message.format(tmp=tmp_path) in error_line(capsys)
    assert not out.exists()
