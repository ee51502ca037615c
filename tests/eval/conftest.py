"""The chat evaluations on 2 gloo ranks, in one torchrun launch (tests/eval/two_ranks.py says why).

test_chat_eval.py and test_chat_suite.py keep their 2-rank scripts and compare what each rank returned with their
single-process run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .two_ranks import run_scripts_on_two_ranks

# the tests that read the shared launch run on one xdist worker, which launches it once
CHAT_TWO_RANKS = pytest.mark.xdist_group("eval_chat_two_ranks")


@pytest.fixture(scope="session")
def chat_two_ranks(chat_model, tmp_path_factory) -> Path:
    """The folder holding task/ (evaluate_task) and suite/ (evaluate_chat_suite): what each rank printed
    (stdout.rank0, stdout.rank1); argv[1] is the tiny chat model."""
    from tests.eval import test_chat_eval, test_chat_suite

    scripts = {"task": test_chat_eval.TWO_RANKS, "suite": test_chat_suite.SUITE_ON_TWO_RANKS}
    return run_scripts_on_two_ranks(scripts, chat_model, tmp_path_factory.mktemp("chat_two_ranks"))
