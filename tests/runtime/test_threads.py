"""Threads: --threads on every computing command, auto's arithmetic, the busy-machine warning.

No test depends on this host's cores or load: both are passed in or faked.
"""

import os
import re

import pytest
import torch

from gptlab.cli.main import THREADED, build_parser, main
from gptlab.runtime import GptlabError
from gptlab.runtime import threads as threads_module
from gptlab.runtime.threads import BusyWatch, auto_threads, busy_cores, free_cores, parse_threads, set_threads, threads_are_automatic


@pytest.fixture
def restore_threads(monkeypatch):
    """set_threads changes torch and the environment: put both back."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, os.environ.get(name, "")) if name in os.environ else monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(("text", "expected"), [("auto", "auto"), ("AUTO", "auto"), ("1", 1), ("16", 16)])
def test_parse_threads_takes_auto_or_a_positive_count(text, expected):
    assert parse_threads(text) == expected


@pytest.mark.parametrize("text", ["0", "-2", "two", "1.5", ""])
def test_parse_threads_refuses_anything_else_naming_the_value(text):
    with pytest.raises(GptlabError, match=f"got {text!r}"):
        parse_threads(text)


@pytest.mark.parametrize(("cores", "load", "expected"), [(2, 0.0, 2), (2, 0.3, 2), (2, 0.6, 1), (2, 1.6, 1), (2, 7.0, 1),
                                                          (8, 2.2, 6), (1, 0.0, 1)])
def test_auto_threads_leaves_the_cores_other_work_keeps_busy(cores, load, expected):
    assert auto_threads(cores=cores, load=load) == expected


def test_busy_cores_counts_other_work_on_our_cores_and_not_our_own(monkeypatch):
    """/proc/stat's per-CPU lines: 2 of our cores, one 75% busy over the window, one idle; a third core not ours."""
    samples = iter([
        "cpu  0 0 0 0 0 0 0 0\ncpu0 100 0 0 900 0 0 0 0\ncpu1 0 0 0 1000 0 0 0 0\ncpu2 0 0 0 0 0 0 0 0\n",
        "cpu  0 0 0 0 0 0 0 0\ncpu0 175 0 0 925 0 0 0 0\ncpu1 0 0 0 1100 0 0 0 0\ncpu2 500 0 0 0 0 0 0 0\n",
    ])
    monkeypatch.setattr(threads_module.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(threads_module, "_read_stat", lambda: next(samples))
    monkeypatch.setattr(threads_module.time, "sleep", lambda seconds: None)
    clock = iter([10.0, 10.0])  # this process used no CPU in the window
    monkeypatch.setattr(threads_module.time, "process_time", lambda: next(clock))
    assert busy_cores() == pytest.approx(2 * 75 / 200)


def test_set_threads_sets_torch_and_the_environment_children_inherit(restore_threads):
    assert set_threads(1) == 1
    assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1" and os.environ["MKL_NUM_THREADS"] == "1"


def test_set_threads_auto_keeps_an_omp_num_threads_the_user_set(restore_threads, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(threads_module, "auto_threads", lambda: pytest.fail("auto must not override the user's setting"))
    assert set_threads("auto") == 1


def test_set_threads_auto_without_a_setting_takes_auto_threads(restore_threads, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads_module, "auto_threads", lambda: 1)
    assert set_threads("auto") == 1 and torch.get_num_threads() == 1


def _leaves(parser):
    subs = [action for action in parser._actions if action.__class__.__name__ == "_SubParsersAction"]
    if not subs:
        return [parser]
    return [leaf for action in subs for sub in action.choices.values() for leaf in _leaves(sub)]


def test_every_computing_command_takes_threads():
    stages = next(action for action in build_parser()._actions if action.__class__.__name__ == "_SubParsersAction")
    leaves = [leaf for name in THREADED for leaf in _leaves(stages.choices[name])]
    assert len(leaves) >= len(THREADED)
    for leaf in leaves:
        assert "--threads" in {option for action in leaf._actions for option in action.option_strings}, leaf.prog


def test_cli_threads_runs_the_command_on_that_many_threads(restore_threads, capsys):
    assert main(["model", "info", "--preset", "gpt2-tiny", "--threads", "1"]) == 0
    assert torch.get_num_threads() == 1 and "params" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["0", "many"])
def test_cli_threads_refuses_a_bad_count_in_one_line(value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["model", "info", "--preset", "gpt2-tiny", "--threads", value])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and f"got {value!r}" in err


class FakeSampler:
    """Stands in for CoreSampler: the busy cores of other work are what the test sets in `OTHERS`."""

    OTHERS = [0.0]

    def others(self) -> float:
        return FakeSampler.OTHERS[0]


@pytest.fixture
def others(monkeypatch):
    monkeypatch.setattr(threads_module, "CoreSampler", FakeSampler)
    FakeSampler.OTHERS[0] = 0.0
    return FakeSampler.OTHERS


def test_busy_watch_warns_once_when_steps_slow_down_while_others_take_the_cores(others):
    others[0] = 1.4
    watch = BusyWatch(threads=2, window=4)
    said = [watch.step(seconds) for seconds in [0.1] * 12 + [0.35] * 12]
    warnings = [text for text in said if text]
    assert len(warnings) == 1 and said.index(warnings[0]) >= 12
    slowdown = float(re.search(r"steps are ([\d.]+)x slower", warnings[0]).group(1))
    assert slowdown == pytest.approx(3.5) and "1.4 of" in warnings[0] and "--threads 1" in warnings[0]
    assert watch.current == 2  # a count the user chose is kept


def test_busy_watch_says_nothing_when_the_cores_are_free_or_steps_keep_pace(others):
    others[0] = 0.1  # slower steps, but nothing else runs: the run's own doing (a longer rollout)
    watch = BusyWatch(threads=2, window=4, adapt=True)
    assert not any(watch.step(seconds) for seconds in [0.1] * 8 + [0.5] * 16) and watch.current == 2
    others[0] = 1.9
    steady = BusyWatch(threads=2, window=4, adapt=True)
    assert not any(steady.step(0.1 + 0.01 * (index % 3)) for index in range(40)) and steady.current == 2


def test_busy_watch_on_auto_moves_to_the_free_cores_and_back_saying_so_once_each_way(others):
    counts = []
    watch = BusyWatch(threads=2, window=4, adapt=True, set_count=counts.append)
    said = [watch.step(0.1) for _ in range(8)]
    others[0] = 1.0
    said += [watch.step(0.4) for _ in range(4)]  # busy: down to 1 thread
    assert counts == [1] and watch.current == 1 and "going on with 1 thread" in said[-1] and "--threads 2 keeps 2" in said[-1]
    said += [watch.step(0.2) for _ in range(8)]  # still busy: stays on 1
    assert counts == [1]
    others[0] = 0.0
    said += [watch.step(0.2) for _ in range(4)]  # the other work ended: back to 2, the reference taken afresh
    assert counts == [1, 2] and watch.current == 2 and said[-1] == "note: the cores are free again: back to 2 threads"
    said += [watch.step(0.1) for _ in range(4)]
    others[0] = 1.0
    said += [watch.step(0.4) for _ in range(4)]  # busy again: down again, without a second note
    assert counts == [1, 2, 1] and said[-1] is None
    assert len([text for text in said if text]) == 2


def test_busy_watch_on_one_thread_says_to_stop_the_other_work(others):
    others[0] = 1.0
    watch = BusyWatch(threads=1, window=2, adapt=True)
    text = next(filter(None, (watch.step(seconds) for seconds in [0.1] * 4 + [0.3] * 4)))
    assert "stop the other work" in text and "--threads" not in text.split(";")[1]


@pytest.mark.parametrize(("cores", "others", "expected"), [(2, 0.0, 2), (2, 0.3, 2), (2, 0.6, 1), (2, 7.0, 1), (8, 2.2, 6)])
def test_free_cores_leaves_the_busy_ones(cores, others, expected):
    assert free_cores(cores, others) == expected


def test_set_threads_says_whether_it_chose_the_count(restore_threads, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads_module, "auto_threads", lambda: 1)
    set_threads("auto")
    assert threads_are_automatic()
    set_threads(1)
    assert not threads_are_automatic()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    set_threads("auto")
    assert not threads_are_automatic()  # the user's OMP_NUM_THREADS: theirs to keep
