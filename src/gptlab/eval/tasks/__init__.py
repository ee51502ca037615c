"""Evaluation tasks: multiple choice scored by log-likelihood (base), and the tasks themselves.

For example:

    TASKS["hellaswag"](path=None).evaluate(model, encode)  ->  {"acc": ..., "acc_norm": ..., "n": ..., ...}
    evaluate_suite(model, {"arc_easy": records, "lambada": records}, encode)  ->  rows, CORE aggregate, per-example records
"""

from gptlab.eval.tasks.base import Example, MultipleChoiceTask, encode_example
from gptlab.eval.tasks.core import (
    CORE_TASKS,
    SuiteResult,
    TaskSpec,
    core_task,
    evaluate_suite,
    evaluate_task,
    render_requests,
    spec_from_bundle,
)
from gptlab.eval.tasks.hellaswag import HellaSwag

TASKS = {"hellaswag": HellaSwag}

__all__ = [
    "CORE_TASKS",
    "TASKS",
    "Example",
    "HellaSwag",
    "MultipleChoiceTask",
    "SuiteResult",
    "TaskSpec",
    "core_task",
    "encode_example",
    "evaluate_suite",
    "evaluate_task",
    "render_requests",
    "spec_from_bundle",
]
