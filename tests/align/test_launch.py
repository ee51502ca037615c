"""The fine-tuning start-up (gptlab.align.launch): a preset, dotted overrides and the --init model resolved into one
config, the same one `gptlab sft|dpo|grpo` runs."""

import dataclasses

import pytest
import torch

from gptlab.align import launch
from gptlab.align.launch import dpo_config, grpo_config, sft_config
from gptlab.cli.main import main
from gptlab.model import GPT, preset
from gptlab.model.hf import read_pretrained_config
from gptlab.model.io import save_model
from gptlab.runtime import GptlabError


@pytest.fixture
def short_model(tmp_path):
    """A model folder whose context (64) is shorter than the sft-cpu preset's seq_len (128)."""
    torch.manual_seed(0)
    save_model(GPT(preset("gpt2-tiny", vocab_size=520, block_size=64)), tmp_path / "short")
    return tmp_path / "short"


def test_sft_config_takes_the_init_models_settings_and_fits_seq_len_to_its_context(short_model):
    config = sft_config("sft-cpu", ["--max-steps", "3"], str(short_model))
    assert dataclasses.asdict(config.model) == dataclasses.asdict(read_pretrained_config(short_model))
    assert (config.init_from, config.max_steps, config.seq_len) == (str(short_model), 3, 64)
    assert config.micro_batch == config.batch_tokens // 64  # the preset's batch of tokens is kept
    given = sft_config("sft-cpu", ["--seq-len", "32", "--micro-batch", "4"], str(short_model))
    assert (given.seq_len, given.micro_batch) == (32, 4)  # explicit flags win


def test_dpo_config_follows_sfts_rules_from_dpos_preset(short_model):
    config = dpo_config("dpo-cpu", [], str(short_model))
    assert type(config).__name__ == "DPOConfig" and config.seq_len == 64 and config.model.block_size == 64


@pytest.mark.parametrize("resolve, preset_name", [(sft_config, "sft-cpu"), (dpo_config, "dpo-cpu"), (grpo_config, "grpo-cpu")])
def test_every_fine_tuning_refuses_a_model_override_in_one_line(resolve, preset_name, short_model):
    with pytest.raises(GptlabError, match=r"^--model.n-layer: the model is the one --init names; drop it$"):
        resolve(preset_name, ["--model.n-layer", "4"], str(short_model))
    resolve(preset_name, ["--model.dropout", "0.1"], str(short_model))  # dropout is a training choice, not the model's shape


def test_grpo_config_refuses_a_field_it_has_no_use_for_naming_what_to_pass(short_model):
    with pytest.raises(GptlabError, match="GRPO's prompts come from --task"):
        grpo_config("grpo-cpu", ["--data", "x"], str(short_model))


def test_the_sft_command_runs_the_config_sft_config_resolves_and_exits_130_when_interrupted(short_model, tmp_path, monkeypatch):
    ran = {}

    def record(config, *, runtime, resume, force):
        ran.update(config=config, resume=resume, force=force)
        return type("Result", (), {"status": "interrupted"})()

    monkeypatch.setitem(launch.FINE_TUNINGS, "sft", dataclasses.replace(launch.FINE_TUNINGS["sft"], run=record))
    flags = ["--max-steps", "2", "--out", str(tmp_path / "out"), "--device", "cpu"]
    assert main(["sft", "--init", str(short_model), "--no-resume", *flags]) == 130
    assert ran["config"] == sft_config("sft-cpu", flags, str(short_model))
    assert (ran["resume"], ran["force"]) == (False, False)
