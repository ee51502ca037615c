"""The Trainer hands every step's time to the busy-machine watch (gptlab.runtime.threads) and prints what it says, once."""

import pytest

import gptlab.train.trainer as trainer_module
from gptlab.train import Trainer
from tests.train.conftest import tiny_config


class ScriptedWatch:
    """Stands in for BusyWatch: records the step times, says its line at the third step."""

    made: list = []

    def __init__(self, threads: int, adapt: bool = False) -> None:
        self.threads, self.adapt, self.seconds = threads, adapt, []
        ScriptedWatch.made.append(self)

    def step(self, seconds: float) -> str | None:
        self.seconds.append(seconds)
        return "warning: the machine looks busy" if len(self.seconds) == 3 else None


@pytest.mark.parametrize("log_every", [1, 100])
def test_trainer_prints_the_busy_warning_once_whatever_the_log_interval(prepared, tmp_path, monkeypatch, log_every):
    monkeypatch.setattr(trainer_module, "BusyWatch", ScriptedWatch)
    ScriptedWatch.made.clear()
    lines = []
    config = tiny_config(prepared, tmp_path / "run", max_steps=5, log_every=log_every, eval_every=0, checkpoint_every=0)
    Trainer(config, log=lines.append).fit()
    (watch,) = ScriptedWatch.made
    assert len(watch.seconds) == 5 and all(seconds > 0 for seconds in watch.seconds)  # every step, not only logged ones
    assert [line for line in lines if "machine looks busy" in line] == ["warning: the machine looks busy"]
