"""Evaluation tasks: multiple choice scored by log-likelihood (base), and the tasks themselves.

    TASKS["hellaswag"](path=None).evaluate(model, encode)  ->  {"acc": ..., "acc_norm": ..., "n": ..., ...}
"""

from gptlab.eval.tasks.base import Example, MultipleChoiceTask, encode_example
from gptlab.eval.tasks.hellaswag import HellaSwag

TASKS = {"hellaswag": HellaSwag}

__all__ = ["TASKS", "Example", "HellaSwag", "MultipleChoiceTask", "encode_example"]
