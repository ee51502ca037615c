"""Record tracks (gptlab.tracks): each record its changes applied in order, the demo's latest the default run, a track
run that pretrains, scores on the held-out works and stops, and the selection split clear of the test set."""

import contextlib
import dataclasses
import io

import pytest

from gptlab.cli.main import main
from gptlab.data.corpus import shakespeare_files
from gptlab.data.documents import load_run_corpus
from gptlab.pipeline import RunConfig
from gptlab.runtime import GptlabError
from gptlab.runtime.config import apply_overrides
from gptlab.tracks import TRACKS, get_track, selection_split, track_base

TINY_TRACK = [
    "--tokenizer.vocab-size", "300", "--train.max-steps", "4", "--train.model.n-layer", "1", "--train.model.n-embd", "32",
    "--train.model.n-head", "2", "--train.batch-tokens", "512", "--train.micro-batch", "8", "--train.seq-len", "64",
    "--train.precision", "fp32", "--train.compile", "false",  # compiling would take most of the test's time
]


@pytest.mark.parametrize("name", TRACKS)
def test_each_record_is_the_one_before_with_its_change_applied(name):
    track = get_track(name)
    assert track.config(0) == dataclasses.replace(track_base(track), out=track.config(0).out)
    for record, change in enumerate(track.changes, 1):
        assert change.summary and change.flags
        assert track.config(record) == apply_overrides(track.config(record - 1), list(change.flags))
    assert track.config() == track.config(track.latest)
    assert track.config().train.time_limit == track.budget


def test_the_cpu_tracks_spend_their_budget_training_and_stop_after_the_score():
    for name in ("cpu-100s", "cpu-600s"):
        config = get_track(name).config()
        assert config.pretrain_only and config.out == f"runs/{name}"
        assert (config.train.eval_every, config.train.checkpoint_every) == (0, 0)


def test_the_demo_tracks_latest_record_is_the_default_run():
    """make demo trains the demo track's latest record: a record that lands must become RunConfig's defaults."""
    assert get_track("demo").config() == RunConfig()


def test_a_track_run_pretrains_scores_on_the_held_out_works_and_stops(tmp_path):
    out = tmp_path / "track"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["run", "--track", "cpu-100s", "--out", str(out), *TINY_TRACK]) == 0
    log = printed.getvalue()
    assert "val bits per byte" in log and "the held-out works" in log
    assert (out / "train").is_dir() and not (out / "sft").exists()
    assert "[7/" not in log  # no sample, fine-tuning or cards


@pytest.mark.parametrize("args, message", [
    (["--track", "cpu-1s"], "unknown --track 'cpu-1s'; tracks: cpu-100s, cpu-600s, demo"),
    (["--track", "cpu-100s", "--record", "99"], "--record 99"),
    (["--record", "0"], "--record 0 picks a record of a track; pass --track NAME too"),
])
def test_a_wrong_track_or_record_is_one_line(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    assert main(["run", *args]) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_a_record_out_of_range_names_the_range():
    track = get_track("cpu-100s")
    with pytest.raises(GptlabError, match=f"records 0 to {track.latest}"):
        track.config(track.latest + 1)


def test_the_selection_split_holds_none_of_the_held_out_works():
    files = shakespeare_files()
    held_out = {text for text in load_run_corpus("shakespeare", 10).held_out}
    train, validation = selection_split(files)
    texts = lambda paths: {path.read_text(encoding="utf-8") for path in paths}  # noqa: E731
    assert not texts(train) & held_out and not texts(validation) & held_out
    assert not set(train) & set(validation) and len(validation) == 4
    assert len(train) + len(validation) + len(held_out) == len(files)
