"""A Ctrl-C lands inside a training step (after its batch is drawn, before the update): the step finishes first, so the
checkpoint saved then resumes exactly; a second Ctrl-C in the same step stops at once and saves nothing half done."""

import dataclasses
import os
import signal

import pytest

from gptlab.load.checkpoints import list_checkpoints
from gptlab.train import Trainer
from tests.train.conftest import tiny_config
from tests.train.test_trainer import assert_same_weights, quiet


def ctrl_c_inside_step(monkeypatch, step: int, presses: int) -> None:
    """Send this process `presses` SIGINTs while step `step` computes, as a terminal's Ctrl-C would."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a test runner may have its own; a terminal has this
    original = Trainer._accumulate

    def accumulate(self):
        loss = original(self)
        if self.state.step == step - 1:
            for _ in range(presses):
                os.kill(os.getpid(), signal.SIGINT)
        return loss

    monkeypatch.setattr(Trainer, "_accumulate", accumulate)


def test_ctrl_c_inside_a_step_finishes_it_then_saves_and_resumes_exactly(prepared, tmp_path, monkeypatch):
    config = tiny_config(prepared, tmp_path / "interrupted", checkpoint_every=0, eval_every=0)
    straight = quiet(dataclasses.replace(config, out=str(tmp_path / "straight"))).fit()
    ctrl_c_inside_step(monkeypatch, step=3, presses=1)
    first = quiet(config).fit()
    assert first.status == "interrupted" and first.steps == 3 and list_checkpoints(config.out)[-1].name == "step_000003"
    monkeypatch.undo()
    second = quiet(config).fit()
    assert first.losses + second.losses == straight.losses
    assert_same_weights(tmp_path / "straight", tmp_path / "interrupted")


def test_a_second_ctrl_c_inside_a_step_stops_at_once_saving_nothing_half_done(prepared, tmp_path, monkeypatch):
    config = tiny_config(prepared, tmp_path / "run", checkpoint_every=2, eval_every=0)
    ctrl_c_inside_step(monkeypatch, step=4, presses=2)
    lines = []
    result = Trainer(config, log=lines.append).fit()
    assert result.status == "interrupted" and [path.name for path in list_checkpoints(config.out)] == ["step_000002"]
    assert any("interrupted twice, inside step 4: not saved; the last checkpoint is" in line for line in lines)


@pytest.fixture(autouse=True)
def keep_sigint():
    before = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, before)
