"""Two tiny finished training runs (the suite's `prepared` data), made once, for the report and comparison tests."""

import pytest

from gptlab.pipeline import text_sampler
from gptlab.train import Trainer

from ..train.conftest import tiny_config

MARKUP = "<b>Romeo & Juliet</b> "  # a sample text that is HTML: the report must show it, not render it


@pytest.fixture(scope="session")
def two_runs(prepared, tmp_path_factory):
    """{"short": (folder, samples printed), "long": ...}: 6 and 9 steps, evaluated every 3, sampled every 3."""
    root = tmp_path_factory.mktemp("two_runs")
    runs = {}
    for name, changes in (("short", {"max_steps": 6}), ("long", {"max_steps": 9, "log_every": 2, "seed": 7})):
        printed = []
        sampler = text_sampler(8)

        def sample(model, tokenizer, printed=printed, sampler=sampler):
            printed.append(MARKUP + sampler(model, tokenizer))
            return printed[-1]

        config = tiny_config(prepared, root / name, sample_every=3, sample_tokens=8, **changes)
        Trainer(config, sample_fn=sample, log=lambda *_: None).fit()
        runs[name] = (root / name, printed)
    return runs
