"""A model as a Hugging Face folder: transformers' own class where one computes it exactly, else our modeling code.

    export_hf(model, "out/hf", eos_token_id=...)  ->  HFExport(architecture="GPT2LMHeadModel", remote_code=False)
    set_eos_token("out/hf", "<|end|>")              a chat model's tokenizer files: its eos is the end of a turn

Two paths, chosen by gptlab.model.hf.native_architecture:

    native   GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, and for mixtures of experts
             Qwen3MoeForCausalLM, MixtralForCausalLM (softmax, dropless, no shared experts or routing bias in use): config.json + model.safetensors in
             their names and layouts (gptlab.model.hf), loaded by plain `AutoModelForCausalLM.from_pretrained`.
    custom   everything else (the default recipe's rotary, RMSNorm, QK-norm and ReLU² on gpt2, a softcap,
             sliding windows, MoE with sigmoid scores, shared experts, a routing bias or capacity, ...): config.json (model_type "gptlab", ModelConfig's fields, an auto_map for
             AutoConfig and AutoModelForCausalLM), model.safetensors (our names, vocab_size rows), and
             configuration_gptlab.py + modeling_gptlab.py from export/remote_code/, which import only torch
             and transformers. Loaded with `from_pretrained(OUT, trust_remote_code=True)`.

Given an eos, generation_config.json says where `model.generate` stops (for a chat model a list: the end of a turn
and the end of text, as chat models on the Hub have it), with bos and pad. Weights first, config last: a folder with
a config is complete. Not here: writing the tokenizer files (gptlab.tokenizer), replacing an earlier export
(gptlab.export.folder), reading folders back (gptlab.model.hf).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from gptlab.model import GPT, ModelConfig
from gptlab.model import hf as model_hf
from gptlab.model.io import save_safetensors
from gptlab.runtime import GptlabError, atomic_write_text, read_json
from gptlab.runtime.config import flag
from gptlab.tokenizer.huggingface import CONFIG_NAME as TOKENIZER_CONFIG_NAME
from gptlab.tokenizer.huggingface import SPECIAL_TOKENS_MAP_NAME

CONFIG_MODULE, MODELING_MODULE = "configuration_gptlab", "modeling_gptlab"
CUSTOM_CODE_FILES = (f"{CONFIG_MODULE}.py", f"{MODELING_MODULE}.py")
CUSTOM_ARCHITECTURE = "GptlabForCausalLM"
GENERATION_CONFIG_NAME = "generation_config.json"
ROLES = ("bos_token", "eos_token", "unk_token", "pad_token")  # a tokenizer config's named special tokens
# Every ModelConfig field the custom modeling code computes, or that changes nothing it must compute
# (zero_init is an initialisation; attention and norm_impl choose kernels for the same numbers). A field
# added to ModelConfig later is refused at a non-default value until modeling_gptlab.py learns it.
COMPUTED_FIELDS = frozenset({
    "arch", "vocab_size", "pad_vocab_to", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd", "mlp_hidden", "bias",
    "qkv_bias", "tie_embeddings", "norm_eps", "rope_theta", "qk_norm", "dropout", "position", "norm", "activation",
    "logit_softcap", "zero_init", "attn_window", "window_pattern", "attention", "norm_impl",
    "moe",  # every MoEConfig field: computed (routing, experts, capacity) or training-only (losses, bias rate, impl)
})


@dataclass(frozen=True)
class HFExport:
    """What `export_hf` wrote: the folder, the transformers class that loads it, and whether that class is our code."""

    directory: Path
    architecture: str
    remote_code: bool

    def describe(self) -> str:
        if self.remote_code:
            return f"as custom code ({self.architecture}: load with trust_remote_code=True)"
        return f"as {self.architecture}"


def check_exportable(config: ModelConfig) -> None:
    """Refuse, before any file is written, a switch that neither a transformers class nor our modeling code computes."""
    defaults = ModelConfig()
    bad = [field.name for field in dataclasses.fields(ModelConfig)
           if field.name not in COMPUTED_FIELDS and getattr(config, field.name) != getattr(defaults, field.name)]
    if bad:
        settings = ", ".join(f"{name}={getattr(config, name)!r}" for name in bad)
        flags = " ".join(f"{flag('model.' + name)} {getattr(defaults, name)}" for name in bad)
        raise GptlabError(f"cannot export this model: {settings} is not computed by the exported modeling code; "
                          f"a model trained with {flags} exports")


def export_hf(model: GPT, directory: str | os.PathLike, *, eos_token_id: int | None = None, bos_token_id: int | None = None,
              stop_token_ids: tuple[int, ...] = (), pad_token_id: int | None = None) -> HFExport:
    """Write `directory` so `transformers.AutoModelForCausalLM` loads it with gptlab's logits and generations.

    The ids are the tokenizer's business: unset unless given. `eos_token_id` is also bos unless `bos_token_id` is
    given (GPT-2's convention); with it, generation_config.json stops `generate` at `stop_token_ids` (default: the eos).
    """
    config = model.config
    check_exportable(config)
    directory = Path(directory)
    architecture = None if model_hf.uses_routing_bias(model) else model_hf.native_architecture(config)
    if eos_token_id is not None:
        directory.mkdir(parents=True, exist_ok=True)
        generation = generation_config(eos_token_id, bos_token_id=bos_token_id, stop_token_ids=stop_token_ids, pad_token_id=pad_token_id)
        atomic_write_text(directory / GENERATION_CONFIG_NAME, json.dumps(generation, indent=2, sort_keys=True) + "\n")
    if architecture is not None:
        model_hf.export_hf(model, directory, eos_token_id=eos_token_id, bos_token_id=bos_token_id)
        return HFExport(directory, architecture, remote_code=False)
    state = {name: tensor.detach().to("cpu").clone(memory_format=torch.contiguous_format)
             for name, tensor in model_hf.gptlab_state_to_hf(model).items()}  # clones: safetensors refuses shared memory
    directory.mkdir(parents=True, exist_ok=True)
    save_safetensors(state, directory / model_hf.SAFETENSORS_NAME)
    code = resources.files("gptlab.export") / "remote_code"
    for name in CUSTOM_CODE_FILES:
        atomic_write_text(directory / name, (code / name).read_text(encoding="utf-8"))
    hf_config = custom_config(config, dtype=next(model.parameters()).dtype, eos_token_id=eos_token_id, bos_token_id=bos_token_id)
    atomic_write_text(directory / model_hf.CONFIG_NAME, json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    return HFExport(directory, CUSTOM_ARCHITECTURE, remote_code=True)


def custom_config(config: ModelConfig, *, dtype: torch.dtype, eos_token_id: int | None, bos_token_id: int | None = None) -> dict:
    """config.json of the custom path: ModelConfig's fields as they are, so the folder reads back as the same model."""
    return {
        **dataclasses.asdict(config),
        "architectures": [CUSTOM_ARCHITECTURE], "model_type": model_hf.GPTLAB_MODEL_TYPE,
        "auto_map": {"AutoConfig": f"{CONFIG_MODULE}.GptlabConfig", "AutoModelForCausalLM": f"{MODELING_MODULE}.{CUSTOM_ARCHITECTURE}"},
        "tie_word_embeddings": config.tie_embeddings, "use_cache": True, "eos_token_id": eos_token_id,
        "bos_token_id": eos_token_id if bos_token_id is None else bos_token_id,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def generation_config(eos_token_id: int, *, bos_token_id: int | None = None, stop_token_ids: tuple[int, ...] = (),
                      pad_token_id: int | None = None) -> dict:
    """generation_config.json: eos_token_id the ids `generate` stops at (one id, or a list of several), bos as in
    config.json, and pad where known (so `generate` pads finished rows without asking for one)."""
    stops = list(dict.fromkeys(stop_token_ids)) or [eos_token_id]
    config = {"bos_token_id": eos_token_id if bos_token_id is None else bos_token_id,
              "eos_token_id": stops[0] if len(stops) == 1 else stops}
    if pad_token_id is not None:
        config["pad_token_id"] = pad_token_id
    return config


def set_eos_token(directory: str | os.PathLike, text: str) -> None:
    """Make `text` the eos_token of a tokenizer folder's tokenizer_config.json and special_tokens_map.json, as
    config.json's eos_token_id is for a chat model (its end of turn); the token it replaces stays special (in
    additional_special_tokens, unless another role still names it)."""
    for name in (TOKENIZER_CONFIG_NAME, SPECIAL_TOKENS_MAP_NAME):
        path = Path(directory) / name
        data = read_json(path)
        previous, data["eos_token"] = data.get("eos_token"), text
        others = list(data.get("additional_special_tokens", []))
        if previous is not None and previous not in others and previous not in [data.get(role) for role in ROLES]:
            data["additional_special_tokens"] = [*others, previous]
        atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
