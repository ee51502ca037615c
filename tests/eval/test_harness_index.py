"""Which lm-eval task index `evaluate_harness` builds: the local folder alone when it holds every task asked for
(indexing lm-eval's built-in YAMLs takes ~10 s), the built-in tasks too as soon as one task is not a local plain task."""

from pathlib import Path

import lm_eval.tasks

from gptlab.eval.harness import task_manager

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "my_tasks"


class FakeIndex:
    """Stands in for lm_eval's TaskManager: records how it was built; the local folder holds one task and one group."""

    built: list[bool] = []

    def __init__(self, include_path=None, include_defaults=True):
        FakeIndex.built.append(include_defaults)
        self.all_subtasks = ["my_task"] + (["hellaswag"] if include_defaults else [])
        self.all_groups = ["my_group"]


def test_a_local_task_is_found_without_indexing_the_built_in_ones():
    manager = task_manager(["my_task"], EXAMPLES, True)  # the real TaskManager on the real folder
    assert "my_task" in manager.all_tasks and "hellaswag" not in manager.all_tasks


def test_a_built_in_task_or_a_local_group_indexes_the_built_in_tasks_too(monkeypatch):
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", FakeIndex)
    cases = [(["my_task"], True, [False]), (["my_task", "hellaswag"], True, [False, True]),
             (["my_group"], True, [False, True]), (["hellaswag"], False, [False])]
    for tasks, defaults, built in cases:
        FakeIndex.built = []
        task_manager(tasks, EXAMPLES, defaults)
        assert FakeIndex.built == built, tasks
    FakeIndex.built = []
    task_manager(["hellaswag"], None, True)
    assert FakeIndex.built == [True]
