"""Dotted command-line overrides of dataclass configs: strict about keys and types."""

import dataclasses
import json

import pytest

from gptlab import GptlabError
from gptlab.pipeline import FIXED_FIELDS, RunConfig
from gptlab.runtime.config import apply_overrides, config_changes, config_to_json, describe_fields, field_comments, field_defaults
from gptlab.train import TrainConfig


def test_config_overrides_set_nested_fields_with_their_types():
    config = apply_overrides(RunConfig(), ["--tokenizer.vocab_size", "8192", "--out=elsewhere", "--tokenizer.special_tokens", "<|a|>,<|b|>"])
    assert config.tokenizer.vocab_size == 8192
    assert config.out == "elsewhere"
    assert config.tokenizer.special_tokens == ("<|a|>", "<|b|>")
    assert RunConfig().tokenizer.vocab_size == 4096  # the default is untouched


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--tokenizer.vocab_sise", "1"], r"unknown option --tokenizer.vocab-sise; did you mean --tokenizer.vocab-size\?"),
        (["--vocab_size", "1"], r"unknown option --vocab-size; did you mean --tokenizer.vocab-size\?"),
        (["--tokenizer.vocab_size", "big"], "--tokenizer.vocab-size expects an integer, got 'big'"),
        (["--train.out", "x"], "cannot be set here: the run trains into OUT/train"),
        (["--tokenizer", "x"], "is a group"),
        (["--out"], "needs a value"),
        (["out", "x"], "unexpected argument"),
        (["--val_every", "1"], "val_every must be at least 2"),
    ],
)
def test_config_overrides_reject_mistakes(overrides, message):
    with pytest.raises(GptlabError, match=message):
        apply_overrides(RunConfig(), overrides, fixed=FIXED_FIELDS)


def test_config_snapshot_is_json_of_every_field():
    data = json.loads(config_to_json(RunConfig()))
    assert data["tokenizer"] == {"style": "bytelevel", "vocab_size": 4096, "pattern": "gpt4", "special_tokens": ["<|endoftext|>"]}


def test_config_overrides_are_checked_once_on_the_final_values_so_order_never_matters():
    """block_size 32 with the default seq_len 128 is invalid alone; with --seq-len 32 it is fine, in either order."""
    one = apply_overrides(RunConfig(), ["--train.model.block_size", "32", "--train.seq_len", "32"])
    two = apply_overrides(RunConfig(), ["--train.seq-len", "32", "--train.model.block-size", "32"])
    assert one == two and one.train.seq_len == 32 and one.train.model.block_size == 32
    with pytest.raises(GptlabError, match=r"--train.seq-len 128 is longer than the model's context \(--train.model.block-size 32\); "
                       r"set --train.model.block-size 128 \(or a shorter --train.seq-len\)"):
        apply_overrides(RunConfig(), ["--train.model.block_size", "32"])


def test_config_help_lists_every_field_with_its_default_and_meaning():
    text = describe_fields(RunConfig())
    lines = {line.split()[0]: line for line in text.splitlines()}
    assert len(lines) == len(text.splitlines())
    assert "--train.model.n-layer" in lines and " 4 " in lines["--train.model.n-layer"]
    assert "transformer blocks" in lines["--train.model.n-layer"]
    from gptlab.train import TrainConfig

    assert all(field_comments(TrainConfig).get(name) for name in TrainConfig.__dataclass_fields__)  # every field documented


def test_config_changes_a_field_the_old_snapshot_lacks_is_no_change_at_its_default():
    """A snapshot saved before `grad_clip` and `optimizer.kind` existed, compared with a TrainConfig at their defaults."""
    new = dataclasses.asdict(TrainConfig())
    old = json.loads(json.dumps(new))
    del old["grad_clip"], old["optimizer"]["kind"]
    defaults = field_defaults(TrainConfig)
    assert config_changes(old, new, defaults=defaults) == []
    assert config_changes(old, new) == ["grad_clip none -> 1.0", "optimizer.kind none -> adamw"]  # without defaults: changes


def test_config_changes_a_field_the_old_snapshot_lacks_is_a_change_away_from_its_default_shown_from_the_default():
    base = TrainConfig()
    old = dataclasses.asdict(base)
    del old["grad_clip"], old["optimizer"]["kind"], old["schedule"]  # a whole group added since, too
    new = dataclasses.asdict(dataclasses.replace(base, grad_clip=0.5, optimizer=dataclasses.replace(base.optimizer, kind="muon"),
                                                 schedule=dataclasses.replace(base.schedule, kind="wsd")))
    assert config_changes(old, new, defaults=field_defaults(TrainConfig)) == [
        "grad_clip 1.0 -> 0.5", "optimizer.kind adamw -> muon", "schedule.kind cosine -> wsd"]
