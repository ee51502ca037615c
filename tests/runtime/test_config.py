"""Dotted command-line overrides of dataclass configs: strict about keys and types."""

import json

import pytest

from gptlab import GptlabError
from gptlab.pipeline import RunConfig
from gptlab.runtime.config import apply_overrides, config_to_json


def test_config_overrides_set_nested_fields_with_their_types():
    config = apply_overrides(RunConfig(), ["--tokenizer.vocab_size", "8192", "--out=elsewhere", "--tokenizer.special_tokens", "<|a|>,<|b|>"])
    assert config.tokenizer.vocab_size == 8192
    assert config.out == "elsewhere"
    assert config.tokenizer.special_tokens == ("<|a|>", "<|b|>")
    assert RunConfig().tokenizer.vocab_size == 4096  # the default is untouched


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--tokenizer.vocab_sise", "1"], "unknown option --tokenizer.vocab_sise"),
        (["--tokenizer.vocab_size", "big"], "expects int, got 'big'"),
        (["--tokenizer", "x"], "is a group"),
        (["--out"], "needs a value"),
        (["out", "x"], "unexpected argument"),
        (["--val_every", "1"], "val_every must be at least 2"),
    ],
)
def test_config_overrides_reject_mistakes(overrides, message):
    with pytest.raises(GptlabError, match=message):
        apply_overrides(RunConfig(), overrides)


def test_config_snapshot_is_json_of_every_field():
    data = json.loads(config_to_json(RunConfig()))
    assert data["tokenizer"] == {"vocab_size": 4096, "pattern": "gpt4", "special_tokens": ["<|endoftext|>"]}
