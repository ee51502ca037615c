"""How a fine-tuning run starts (`gptlab sft`, `dpo`, `grpo`): a preset, the user's dotted overrides and the --init
model become one checked config, which then runs on its device.

    config = sft_config("sft-cpu", ["--max-steps", "300"], init="runs/shakespeare")
    result = fine_tune("sft", "sft-cpu", ["--max-steps", "300"], init="runs/shakespeare")   # resolve, then run

The model's settings always come from --init, so --model.* (except --model.dropout) is refused; SFT and DPO shorten
seq_len to the base model's context when the preset's is longer. The fields a command has no use for are refused
naming what to pass instead (the same tables give their --help its epilog).

Not here: the loops (gptlab.align.finetune.sft, dpo, grpo), what the --init model holds (gptlab.align.start), parsing the
command line (gptlab.cli).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from gptlab.align.finetune.sft import SFT_PRESETS, run_sft
from gptlab.align.preference.dpo import DPO_PRESETS, run_dpo
from gptlab.align.rl.grpo import GRPO_PRESETS, run_grpo
from gptlab.align.rl.ppo import PPO_PRESETS, run_ppo
from gptlab.align.rl.rm import RM_PRESETS, run_rm
from gptlab.align.start import find_init
from gptlab.model.hf import read_pretrained_config
from gptlab.runtime import GptlabError
from gptlab.runtime.config import apply_overrides, parse_overrides
from gptlab.runtime.device import init_runtime, shutdown_runtime

# set by --init, or meaningless for conversations: left out of sft's and dpo's --help (dpo: eval_batches counts pair batches)
SFT_IGNORED = ("init_from", "model", "loader_mode", "hellaswag_every", "hellaswag_path", "hellaswag_limit")
# set by --init or by the prompts, or meaningless without a val split: left out of grpo's --help and refused
GRPO_IGNORED = ("init_from", "model", "data", "tokenizer", "batch_tokens", "loader_mode", "eval_every", "eval_batches",
                "hellaswag_every", "hellaswag_path", "hellaswag_limit")
# why, for the flags sft and dpo take that grpo does not: each names what to pass instead
GRPO_REASONS = {
    "init_from": "the model is the one --init names", "model": "the model is the one --init names",
    "data": "GRPO's prompts come from --task", "tokenizer": "GRPO uses the tokenizer saved with the --init chat model",
    "batch_tokens": "GRPO does not use it (a step is --prompts-per-step x --group-size completions)",
    "eval_every": "GRPO has no val loss (no val split); --task-every sets the steps between held-out task evaluations",
    "eval_batches": "GRPO has no val loss (no val split); --eval-examples sets the held-out prompts per evaluation",
}


def _refuse_model_overrides(overrides: list[str], *, init_from_too: bool) -> dict:
    """The overrides as a dict, after refusing the ones that would change the --init model's shape."""
    given = dict(parse_overrides(overrides))
    for key in given:
        if (init_from_too and key == "init_from") or (key.startswith("model.") and key != "model.dropout"):
            raise GptlabError(f"--{key.replace('_', '-')}: the model is the one --init names; drop it")
    return given


def sft_config(preset: str, overrides: list[str], init: str, *, presets: dict | None = None,
               ignored: tuple[str, ...] = SFT_IGNORED):
    """The preset with the overrides and the --init model's settings; seq_len shortened to the model's context when the
    preset's is longer (micro_batch grown to keep batch_tokens unless either is given). `presets`: SFT's unless given."""
    given = _refuse_model_overrides(overrides, init_from_too=True)
    base = (presets or SFT_PRESETS)[preset]()
    model = read_pretrained_config(find_init(init))
    defaults = {"init_from": init, **{f"model.{key}": value for key, value in dataclasses.asdict(model).items()}}
    if "seq_len" not in given and base.seq_len > model.block_size:
        defaults["seq_len"] = model.block_size
        if "batch_tokens" not in given and "micro_batch" not in given:
            defaults["micro_batch"] = base.batch_tokens // model.block_size
    unused = {key: "this command does not use it" for key in ignored if key not in ("init_from", "model")}
    return apply_overrides(base, overrides, defaults=defaults, fixed=unused)


def dpo_config(preset: str, overrides: list[str], init: str):
    """As sft_config, from DPO's presets: the same flags, the same model rules."""
    return sft_config(preset, overrides, init, presets=DPO_PRESETS, ignored=SFT_IGNORED)


def grpo_config(preset: str, overrides: list[str], init: str):
    """GRPO's preset with the overrides; the model is read at the run's start, from --init (a chat model)."""
    find_init(init)  # a missing --init is named before anything else
    _refuse_model_overrides(overrides, init_from_too=False)
    unused = {key: GRPO_REASONS.get(key, "GRPO does not use it") for key in GRPO_IGNORED}
    return apply_overrides(GRPO_PRESETS[preset](), overrides, defaults={"init_from": init}, fixed=unused)


def rm_config(preset: str, overrides: list[str], init: str):
    """As sft_config, from the reward model's presets: the same flags, the same model rules."""
    return sft_config(preset, overrides, init, presets=RM_PRESETS, ignored=SFT_IGNORED)


# why, for the flags sft and dpo take that ppo does not (its ignored fields are grpo's)
PPO_REASONS = {**GRPO_REASONS, "data": "PPO's prompts come from --task or --prompts", "tokenizer": "PPO uses the tokenizer saved with the --init chat model",
               "batch_tokens": "PPO does not use it (a step is one minibatch: --rollout-prompts / --minibatches completions)",
               "eval_every": "PPO has no val loss (no val split); --task-every sets the steps between held-out evaluations",
               "eval_batches": "PPO has no val loss (no val split); --eval-examples sets the held-out prompts per evaluation"}


def ppo_config(preset: str, overrides: list[str], init: str):
    """PPO's preset with the overrides; as grpo_config, the model is read at the run's start from --init (a chat model)."""
    find_init(init)  # a missing --init is named before anything else
    _refuse_model_overrides(overrides, init_from_too=False)
    unused = {key: PPO_REASONS.get(key, "PPO does not use it") for key in GRPO_IGNORED}
    return apply_overrides(PPO_PRESETS[preset](), overrides, defaults={"init_from": init}, fixed=unused)


@dataclass(frozen=True)
class FineTuning:
    """One fine-tuning command: its presets, the fields it refuses, how its config resolves and the loop that runs it."""

    presets: dict
    default: str
    ignored: tuple[str, ...]
    resolve: Callable
    run: Callable


FINE_TUNINGS = {
    "sft": FineTuning(SFT_PRESETS, "sft-cpu", SFT_IGNORED, sft_config, run_sft),
    "dpo": FineTuning(DPO_PRESETS, "dpo-cpu", SFT_IGNORED, dpo_config, run_dpo),
    "grpo": FineTuning(GRPO_PRESETS, "grpo-cpu", GRPO_IGNORED, grpo_config, run_grpo),
    "ppo": FineTuning(PPO_PRESETS, "ppo-cpu", GRPO_IGNORED, ppo_config, run_ppo),
    "rm": FineTuning(RM_PRESETS, "rm-cpu", SFT_IGNORED, rm_config, run_rm),
}


def fine_tune(command: str, preset: str, overrides: list[str], init: str, *, resume: bool = True, force: bool = False):
    """Resolve `command`'s config (one-line errors before any compute) and run it on the config's device; the loop's
    result (its status "interrupted" when the run was stopped early, e.g. by Ctrl-C)."""
    tuning = FINE_TUNINGS[command]
    config = tuning.resolve(preset, overrides, init)
    runtime = init_runtime(config.device)
    try:
        return tuning.run(config, runtime=runtime, resume=resume, force=force)
    finally:
        shutdown_runtime(runtime)
