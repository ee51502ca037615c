"""`gptlab runs report` and `gptlab runs compare`: what they write, and the one-line refusals."""

import shutil

import pytest

from gptlab.cli.main import main
from gptlab.runs.report import REPORT_FILE


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
