"""The alignment trainers on 2 gloo ranks, all in one torchrun launch.

Each trainer's test file keeps its 2-rank script (DPO_DDP_SCRIPT, ...) and checks what the ranks made against its
single-process run; the scripts share one launch (tests/eval/two_ranks.py), because each launch starts three Pythons
that import torch, which costs more than the tiny runs themselves.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.eval.two_ranks import ranks_stdout, run_scripts_on_two_ranks

__all__ = ["TWO_RANKS", "ranks_stdout"]

# the tests that read the shared launch run on one xdist worker, which launches it once
TWO_RANKS = pytest.mark.xdist_group("align_two_ranks")


@pytest.fixture(scope="session")
def align_two_ranks(chat_model, tmp_path_factory) -> Path:
    """The folder holding dpo/, rm/, ppo/, grpo/ and learnable/: each script's run (ddp/) and what each rank printed
    (stdout.rank0, stdout.rank1); argv[1] is the tiny chat model."""
    from tests.align import test_dpo, test_grpo, test_grpo_learnable, test_ppo, test_rm

    scripts = {"dpo": test_dpo.DPO_DDP_SCRIPT, "rm": test_rm.RM_DDP_SCRIPT, "ppo": test_ppo.PPO_DDP_SCRIPT,
               "grpo": test_grpo.GRPO_DDP_SCRIPT, "learnable": test_grpo_learnable.LEARNABLE_DDP_SCRIPT}
    return run_scripts_on_two_ranks(scripts, chat_model, tmp_path_factory.mktemp("align_two_ranks"))
