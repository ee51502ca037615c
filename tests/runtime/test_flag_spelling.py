"""Errors and hints name flags as the user types them: hyphens (`--batch-tokens`), never `--batch_tokens`, and with
the prefix the command takes (`gptlab run`: `--train.seq-len`)."""

import re

import pytest

from gptlab.model import preset
from gptlab.pipeline import FIXED_FIELDS, RunConfig
from gptlab.runtime import GptlabError
from gptlab.runtime.config import apply_overrides, config_fields, flag
from gptlab.train import TrainConfig

UNDERSCORE_FLAG = re.compile(r"--[A-Za-z0-9.-]*_")
TRIES = ("-1", "0", "-0.5", "x", "none", "SSL", "")


def config_errors(config, fixed=None) -> dict[str, str]:
    """Every error an override of one field to a bad value gives: {"--key value": message}."""
    errors = {}
    for info in config_fields(config):
        for value in TRIES:
            try:
                apply_overrides(config, [info.flag, value], fixed=fixed)
            except GptlabError as error:
                errors[f"{info.flag} {value}"] = str(error)
    return errors


@pytest.mark.parametrize("command", ["run", "train"])
def test_no_config_error_names_a_flag_with_underscores(command):
    config, fixed = (RunConfig(), FIXED_FIELDS) if command == "run" else (TrainConfig(), None)
    errors = config_errors(config, fixed)
    assert len(errors) > 100  # the walk reached the fields' checks, not just the parser
    wrong = {given: message for given, message in errors.items() if UNDERSCORE_FLAG.search(message)}
    assert wrong == {}


def test_a_nested_configs_error_names_the_flag_with_the_commands_prefix():
    with pytest.raises(GptlabError) as raised:
        apply_overrides(RunConfig(), ["--train.model.block-size", "32"])
    assert "--train.seq-len 128 is longer than the model's context (--train.model.block-size 32)" in str(raised.value)
    with pytest.raises(GptlabError, match=r"^--train.batch-tokens must be at least 1, got 0$"):
        apply_overrides(RunConfig(), ["--train.batch-tokens", "0"])
    with pytest.raises(GptlabError, match=r"^--batch-tokens must be at least 1, got 0$"):  # gptlab train: no prefix
        apply_overrides(TrainConfig(), ["--batch-tokens", "0"])
    with pytest.raises(GptlabError, match=r"--train.model.attn-window to the positions"):
        apply_overrides(RunConfig(), ["--train.model.window-pattern", "SL"])


def test_runtime_and_export_errors_name_hyphenated_flags():
    from gptlab.export.gguf import gguf_problems

    with pytest.raises(GptlabError) as raised:
        TrainConfig(batch_tokens=1000, micro_batch=4, seq_len=64, model=preset("gpt2-tiny", block_size=64)).accumulation_steps(1)
    assert "change --batch-tokens or --micro-batch" in str(raised.value)
    configs = [preset("gpt2-tiny", position="rotary", qk_norm=True, n_kv_head=2, logit_softcap=3.0, attn_window=4, window_pattern="SL"),
               preset("llama-tiny", qk_norm=True, bias=True, qkv_bias=True)]
    problems = [problem for config in configs for problem in gguf_problems(config)]
    assert len(problems) == 5 and not any(UNDERSCORE_FLAG.search(problem) for problem in problems)
    assert flag("model.n_kv_head") == "--model.n-kv-head"
