"""A run folder belongs to the command that made it: --force starts that command's own run over, never another's."""

import pytest

from gptlab.runtime import GptlabError
from gptlab.runtime.rundir import MARKER, claim_run_folder


@pytest.mark.parametrize("maker, claimer", [("train", "eval"), ("eval", "train"), ("run", "sft"), ("sweep", "run")])
@pytest.mark.parametrize("force", [False, True])
def test_claiming_another_commands_run_folder_is_refused_even_with_force(tmp_path, maker, claimer, force):
    out = tmp_path / "out"
    claim_run_folder(out, command=maker, config={"steps": 3}, ours=("metrics.jsonl", "eval.json"))
    (out / "metrics.jsonl").write_text("the run's own file\n")
    record = (out / MARKER).read_text()
    with pytest.raises(GptlabError) as refused:
        claim_run_folder(out, command=claimer, config={"steps": 3}, ours=("metrics.jsonl", "eval.json"), force=force)
    assert str(refused.value) == (f"--out {out} holds a `gptlab {maker}` run, not a `gptlab {claimer}` one, and --force never "
                                  "replaces another command's folder; pass another --out")
    assert (out / MARKER).read_text() == record and (out / "metrics.jsonl").read_text() == "the run's own file\n"


def test_force_starts_the_same_commands_run_over_clearing_only_its_files(tmp_path):
    out = tmp_path / "out"
    claim_run_folder(out, command="eval", config={"limit": 3}, ours=("eval.json",))
    (out / "eval.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(GptlabError, match="other settings"):
        claim_run_folder(out, command="eval", config={"limit": 2}, ours=("eval.json",))
    folder = claim_run_folder(out, command="eval", config={"limit": 2}, ours=("eval.json",), force=True)
    assert folder.status == "new" and sorted(p.name for p in out.iterdir()) == [MARKER, "notes.txt"]
