"""Hugging Face interop: load GPT-2, Llama, Qwen2, Qwen3 and gptlab-format checkpoints into `GPT`, and write `GPT` in the
formats of transformers' own classes.

A Hugging Face directory is `config.json` plus weights: `model.safetensors`,
`pytorch_model.bin` (read with `torch.load(weights_only=True)`), or either one
sharded behind a `*.index.json`. Two families map onto our one model:

    GPT2LMHeadModel                               GPT (arch="gpt2")
      [transformer.]wte / wpe / ln_f                transformer.wte / wpe / ln_f
      [transformer.]h.N.attn.c_attn  (in, out)      transformer.h.N.attn.c_attn  (out, in): Conv1D is transposed
      h.N.attn.c_proj, h.N.mlp.c_fc, h.N.mlp.c_proj  likewise transposed
      h.N.attn.bias, h.N.attn.masked_bias           causal-mask buffers, skipped
    LlamaForCausalLM (Qwen2ForCausalLM: + qkv_bias,  GPT (arch="llama")
      Qwen3ForCausalLM: + qk_norm)
      model.embed_tokens / model.norm / lm_head     transformer.wte / ln_f / lm_head
      model.layers.N.self_attn.{q,k,v}_proj         transformer.h.N.attn.c_attn rows [q | k | v] (weight, bias)
      model.layers.N.self_attn.o_proj               transformer.h.N.attn.c_proj
      model.layers.N.self_attn.{q,k}_norm           transformer.h.N.attn.{q,k}_norm
      model.layers.N.mlp.{gate,up}_proj             transformer.h.N.mlp.c_fc rows [gate | up]
      model.layers.N.mlp.down_proj                  transformer.h.N.mlp.c_proj
      model.layers.N.{input,post_attention}_layernorm  transformer.h.N.ln_1 / ln_2
    Qwen3MoeForCausalLM, MixtralForCausalLM       GPT (arch="llama", moe): the llama mapping, experts in gptlab.model.hf_moe
    model_type "gptlab" (custom code, GptlabForCausalLM)  GPT, any switches: our own names, config.json
                                                          holding ModelConfig's fields

Of the model switches, GPT-2 also takes activation relu2 (transformers' "relu2")
and untied embeddings; biases on q, k, v alone (qkv_bias) go to Qwen2, QK-norm to Qwen3. Any other switch away from the
family (rotary or RMSNorm on gpt2, learned positions on llama, a softcap, a
sliding window, ...) has no class in transformers: `export_hf` here refuses it
before writing anything, and gptlab.export writes it as the "gptlab" format with
its own modeling code (loaded with trust_remote_code=True). Reading that format
back needs no code from the folder: it is our own model.

Our embedding and logit tables have `padded_vocab_size` rows; Hugging Face's
have `vocab_size`. Loading pads with zero rows (never seen: logits are cut to
vocab_size), exporting cuts them off. Loaded weights take the model's dtype
(float32); a config we cannot compute exactly raises `GptlabError` instead of
loading into a model that would quietly differ.

Not here: gptlab's own format (gptlab.model.io), tokenizer files (gptlab.tokenizer), choosing the export
format and the custom modeling code (gptlab.export), downloads: `from_pretrained` reads the local Hugging
Face cache and never the network.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path

import torch

from gptlab.model.config import ModelConfig
from gptlab.model.gpt import GPT
from gptlab.model.hf_moe import (
    MOE_MODEL_TYPES,
    _require,
    is_moe_name,
    moe_architecture,
    moe_config_from_hf,
    moe_config_to_hf,
    moe_export_problems,
    moe_state_from_hf,
    moe_state_to_hf,
    unfuse_experts,
)
from gptlab.model.io import load_model, load_state, save_safetensors
from gptlab.runtime import GptlabError, atomic_write_text

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "model.safetensors"
PICKLE_NAME = "pytorch_model.bin"
GELU_TANH = ("gelu_new", "gelu_pytorch_tanh")  # both are GELU's tanh approximation, as in our MLP
RELU2 = "relu2"  # transformers' ACT2FN name for relu(x)^2, our activation="relu2"
CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")  # GPT-2's Conv1D stores (in, out)
LLAMA_TOP = {
    "transformer.wte.weight": "model.embed_tokens.weight",
    "transformer.ln_f.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",
}
LLAMA_RENAMES = {
    "ln_1": "input_layernorm",
    "ln_2": "post_attention_layernorm",
    "attn.c_proj": "self_attn.o_proj",
    "attn.q_norm": "self_attn.q_norm",
    "attn.k_norm": "self_attn.k_norm",
    "mlp.c_proj": "mlp.down_proj",
}
LLAMA_FUSED = {  # our fused rows, in order
    "attn.c_attn": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.c_fc": ("mlp.gate_proj", "mlp.up_proj"),
}
GPTLAB_MODEL_TYPE = "gptlab"  # config.json's model_type for our own modeling code (gptlab.export)
LLAMA_MODEL_TYPES = ("llama", "qwen2", "qwen3")  # read by llama_config_from_hf
HF_MODEL_TYPES = ("gpt2", *LLAMA_MODEL_TYPES, *MOE_MODEL_TYPES, GPTLAB_MODEL_TYPE)
MOE_BASE = {"qwen3_moe": "qwen3", "mixtral": "llama"}  # the dense family whose attention each MoE family has

Tensors = dict[str, torch.Tensor]


# ---------------------------------------------------------------- reading a directory


def read_hf_config(directory: str | os.PathLike) -> dict:
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise GptlabError(f"no {CONFIG_NAME} in {directory}: expected a Hugging Face model directory")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise GptlabError(f"{path} is not valid JSON: {error}") from None


def read_hf_weights(directory: str | os.PathLike) -> Tensors:
    """All tensors of the checkpoint, on CPU; safetensors first, as transformers prefers them."""
    directory = Path(directory)
    for name in (SAFETENSORS_NAME, PICKLE_NAME):
        if (directory / name).is_file():
            return _read_weight_file(directory / name)
        index = directory / f"{name}.index.json"
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (json.JSONDecodeError, KeyError, AttributeError) as error:
                raise GptlabError(f"{index} is not a weight index ({error!r})") from None
            state: Tensors = {}
            for shard in shards:
                state.update(_read_weight_file(directory / shard))
            return state
    raise GptlabError(f"no weights in {directory}: expected {SAFETENSORS_NAME} or {PICKLE_NAME} (or a sharded *.index.json)")


def _read_weight_file(path: Path) -> Tensors:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        if path.name.endswith(".safetensors"):
            return load_file(path)
        return torch.load(path, map_location="cpu", weights_only=True)
    except (SafetensorError, OSError, RuntimeError, EOFError) as error:
        raise GptlabError(f"{path} is damaged or not a weight file: {error}") from None


# ---------------------------------------------------------------- configs


def _check_model_type(model_type: str | None, supported: tuple[str, ...]) -> None:
    if model_type not in supported:
        raise GptlabError(f"this checkpoint is a {model_type!r} model, not {' or '.join(supported)}; "
                          f"from_pretrained picks the loader from config.json's model_type")


def gpt2_config_from_hf(hf: dict) -> ModelConfig:
    """ModelConfig for a GPT2LMHeadModel config.json (n_positions -> block_size, layer_norm_epsilon -> norm_eps)."""
    _check_model_type(hf.get("model_type", "gpt2"), ("gpt2",))
    _require({
        "activation_function": (hf.get("activation_function", "gelu_new"), (*GELU_TANH, RELU2)),
        "scale_attn_weights": (hf.get("scale_attn_weights", True), (True,)),
        "scale_attn_by_inverse_layer_idx": (hf.get("scale_attn_by_inverse_layer_idx", False), (False,)),
        "reorder_and_upcast_attn": (hf.get("reorder_and_upcast_attn", False), (False,)),
        "add_cross_attention": (hf.get("add_cross_attention", False), (False,)),
    }, "GPT-2")
    n_embd = hf.get("n_embd", 768)
    n_inner = hf.get("n_inner")
    return ModelConfig(
        arch="gpt2", vocab_size=hf.get("vocab_size", 50257), block_size=hf.get("n_positions", 1024),
        n_layer=hf.get("n_layer", 12), n_head=hf.get("n_head", 12), n_embd=n_embd,
        mlp_hidden=None if n_inner in (None, 4 * n_embd) else n_inner, bias=True,
        tie_embeddings=hf.get("tie_word_embeddings", True), norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        activation=RELU2 if hf.get("activation_function") == RELU2 else "",
    )


def llama_config_from_hf(hf: dict) -> ModelConfig:
    """ModelConfig for a LlamaForCausalLM config.json, or Qwen2ForCausalLM (biases on q, k, v alone: qkv_bias)
    or Qwen3ForCausalLM (QK-norm); Qwen3MoeForCausalLM and MixtralForCausalLM add their experts (gptlab.model.hf_moe)."""
    family = hf.get("model_type", "llama")
    model_type = MOE_BASE.get(family, family)
    heads, hidden = hf.get("num_attention_heads", 32), hf.get("hidden_size", 4096)
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    _check_model_type(family, (*LLAMA_MODEL_TYPES, *MOE_MODEL_TYPES))
    checks = {
        "hidden_act": (hf.get("hidden_act", "silu"), ("silu",)),
        "head_dim (ours is hidden_size / num_attention_heads)": (hf.get("head_dim") or hidden // heads, (hidden // heads,)),
        "rope_type": (rope.get("rope_type", rope.get("type", "default")), ("default",)),
    }
    if model_type == "llama":  # one bias switch covers attention and MLP (Qwen2 reads neither key: its biases are fixed)
        checks["mlp_bias (must equal attention_bias)"] = (hf.get("mlp_bias", False), (hf.get("attention_bias", False),))
    else:  # Qwen2 and Qwen3 slide a window over layers from max_window_layers on: ours would attend to everything
        checks["use_sliding_window"] = (hf.get("use_sliding_window", False), (False,))
        checks["layer_types"] = (sorted(set(hf.get("layer_types") or ["full_attention"])), (["full_attention"],))
    if model_type == "qwen3":
        checks["attention_bias (Qwen3's MLP has none)"] = (hf.get("attention_bias", False), (False,))
    _require(checks, family)
    kv_heads = hf.get("num_key_value_heads") or heads
    config = ModelConfig(
        arch="llama", vocab_size=hf.get("vocab_size", 32000), block_size=hf.get("max_position_embeddings", 2048),
        n_layer=hf.get("num_hidden_layers", 32), n_head=heads, n_kv_head=None if kv_heads == heads else kv_heads,
        n_embd=hidden, bias=model_type == "llama" and hf.get("attention_bias", False), qkv_bias=model_type == "qwen2",
        tie_embeddings=hf.get("tie_word_embeddings", False), norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))), qk_norm=model_type == "qwen3",
    )
    if family in MOE_MODEL_TYPES:
        return moe_config_from_hf(hf, config)
    intermediate = hf.get("intermediate_size", 11008)
    return config if intermediate == config.hidden_dim else replace(config, mlp_hidden=intermediate)


def check_exportable(config: ModelConfig) -> None:
    """Refuse, before any file is written, a switch the Hugging Face class for this arch cannot compute."""
    if config.arch == "gpt2":
        target = "GPT2LMHeadModel"
        supported = {"position": ("learned",), "norm": ("layer",), "activation": ("gelu", RELU2)}
    else:
        target = "LlamaForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM"
        supported = {"position": ("rotary",), "norm": ("rms",), "activation": ("swiglu",)}
    bad = [f"{name}={getattr(config, f'{name}_kind')!r}" for name, allowed in supported.items()
           if getattr(config, f"{name}_kind") not in allowed]
    if config.arch == "gpt2" and config.qk_norm:
        bad.append("qk_norm=True")
    if config.arch == "gpt2" and config.kv_heads != config.n_head:  # GPT-2 has a key/value head per query head
        bad.append(f"n_kv_head={config.n_kv_head}")
    if config.logit_softcap:
        bad.append(f"logit_softcap={config.logit_softcap}")
    if config.bigram_vocab:
        bad.append(f"bigram_vocab={config.bigram_vocab}")
    if any(config.layer_windows):
        bad.append(f"attn_window={config.attn_window} (window_pattern {config.window_pattern!r})")
    if config.is_moe:
        target = "Qwen3MoeForCausalLM or MixtralForCausalLM"
        bad += ([f"arch={config.arch!r}"] if config.arch != "llama" else []) + moe_export_problems(config)
    if bad:
        verb = "has" if len(bad) == 1 else "have"
        raise GptlabError(f"cannot export this {config.arch} model: {', '.join(bad)} {verb} no Hugging Face equivalent "
                          f"({target} cannot compute it); gptlab.export.export_hf (`gptlab export hf`) writes it with "
                          f"its own modeling code")


def native_architecture(config: ModelConfig) -> str | None:
    """The transformers class that computes `config` exactly, or None: gptlab.export then writes our own modeling code."""
    try:
        check_exportable(config)
    except GptlabError:
        return None
    if config.arch == "gpt2":
        return "GPT2LMHeadModel"
    if config.is_moe:
        return moe_architecture(config)
    if config.qk_norm:  # Qwen3's MLP has no biases, and its attention biases are on the output projection too
        return None if config.bias or config.qkv_bias else "Qwen3ForCausalLM"
    if config.qkv_bias and not config.bias:
        return "Qwen2ForCausalLM"
    return "LlamaForCausalLM"  # qkv_bias with bias: every projection is biased, as attention_bias + mlp_bias


def gptlab_config_from_hf(hf: dict) -> ModelConfig:
    """ModelConfig of a "gptlab" config.json: its ModelConfig fields (transformers' own keys beside them are ignored)."""
    _check_model_type(hf.get("model_type"), (GPTLAB_MODEL_TYPE,))
    try:
        return ModelConfig(**{field.name: hf[field.name] for field in fields(ModelConfig) if field.name in hf})
    except TypeError as error:
        raise GptlabError(f"a {GPTLAB_MODEL_TYPE!r} config.json with a field of the wrong type: {error}") from None


def gpt2_config_to_hf(config: ModelConfig) -> dict:
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": config.vocab_size,
        "n_positions": config.block_size, "n_ctx": config.block_size, "n_embd": config.n_embd,
        "n_layer": config.n_layer, "n_head": config.n_head, "n_inner": config.hidden_dim,
        "activation_function": RELU2 if config.activation_kind == RELU2 else "gelu_new", "layer_norm_epsilon": config.norm_eps,
        "resid_pdrop": config.dropout, "embd_pdrop": config.dropout, "attn_pdrop": config.dropout,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "tie_word_embeddings": config.tie_embeddings,
    }


def llama_config_to_hf(config: ModelConfig) -> dict:
    """LlamaForCausalLM; Qwen2ForCausalLM for qkv_bias (biases on q, k, v alone); Qwen3ForCausalLM for QK-norm
    (RMSNorm per head before RoPE, as ours)."""
    if config.qk_norm and (config.bias or config.qkv_bias):
        raise GptlabError(f"cannot export a llama model with qk_norm=True and bias={config.bias}, qkv_bias={config.qkv_bias}: "
                          f"Qwen3 (the Hugging Face class with QK-norm) has no MLP biases and biases its output projection "
                          f"with its q, k, v, and LlamaForCausalLM has no QK-norm")
    architecture = native_architecture(config) or "LlamaForCausalLM"
    model_type = {"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}.get(architecture, "llama")
    hf = {
        "architectures": [architecture], "model_type": model_type, "vocab_size": config.vocab_size,
        "hidden_size": config.n_embd, "intermediate_size": config.hidden_dim, "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head, "num_key_value_heads": config.kv_heads, "head_dim": config.head_dim,
        "hidden_act": "silu", "max_position_embeddings": config.block_size, "rms_norm_eps": config.norm_eps,
        # rope_theta for transformers 4.x, rope_parameters for 5.x
        "rope_theta": config.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "attention_bias": config.bias, "mlp_bias": config.bias, "attention_dropout": 0.0,
        "tie_word_embeddings": config.tie_embeddings,
    }
    if model_type != "llama":  # Qwen2 and Qwen3 would slide a window over layers from max_window_layers on
        hf.update(use_sliding_window=False, sliding_window=None, max_window_layers=config.n_layer,
                  layer_types=["full_attention"] * config.n_layer)
    return hf


# ---------------------------------------------------------------- weights: ours <-> theirs


def _layer_name(name: str) -> tuple[str, str, str]:
    """"transformer.h.3.attn.c_attn.weight" -> ("3", "attn.c_attn", "weight")."""
    layer, rest = name.removeprefix("transformer.h.").split(".", 1)
    module, param = rest.rsplit(".", 1)
    return layer, module, param


def _pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])])


def gpt2_state_to_hf(model: GPT) -> Tensors:
    """Our GPT-2 weights under GPT2LMHeadModel names (views, not copies). bias=False is exported as zero biases."""
    config = model.config
    state: Tensors = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_embeddings:
            continue
        if name in ("transformer.wte.weight", "lm_head.weight"):
            tensor = tensor[: config.vocab_size]
        elif name.startswith("transformer.h.") and _layer_name(name)[1] in CONV1D and name.endswith(".weight"):
            tensor = tensor.t()
        state[name] = tensor
    if not config.bias:  # a LayerNorm or Linear without bias is one with bias 0, which GPT2LMHeadModel always has
        for module_name, module in model.named_modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.LayerNorm)) and module_name != "lm_head" and module.bias is None:
                state[f"{module_name}.bias"] = module.weight.new_zeros(module.weight.shape[0])
    return state


def gpt2_state_from_hf(model: GPT, hf: Tensors) -> Tensors:
    state: Tensors = {}
    for name, tensor in hf.items():
        if name in ("transformer.wte.weight", "lm_head.weight"):
            tensor = _pad_rows(tensor, model.config.padded_vocab_size)
        elif name.startswith("transformer.h.") and _layer_name(name)[1] in CONV1D and name.endswith(".weight"):
            tensor = tensor.t()
        state[name] = tensor
    return state


def _normalize_gpt2_names(hf: Tensors, tied: bool) -> Tensors:
    """Add the `transformer.` prefix older checkpoints lack; drop the attention-mask buffers and a tied lm_head."""
    state: Tensors = {}
    for name, tensor in hf.items():
        if name.split(".")[-2:] in (["attn", "bias"], ["attn", "masked_bias"]) or (name == "lm_head.weight" and tied):
            continue
        state[name if name.startswith("transformer.") or name == "lm_head.weight" else f"transformer.{name}"] = tensor
    return state


def _fused_sizes(config: ModelConfig) -> dict[str, list[int]]:
    q, kv = config.n_head * config.head_dim, config.kv_heads * config.head_dim
    return {"attn.c_attn": [q, kv, kv], "mlp.c_fc": [config.hidden_dim, config.hidden_dim]}


def llama_state_to_hf(model: GPT) -> Tensors:
    """Our llama weights under LlamaForCausalLM (Qwen3ForCausalLM) names: fused c_attn / c_fc split by rows."""
    config, sizes = model.config, _fused_sizes(model.config)
    state: Tensors = {}
    for name, tensor in model.state_dict().items():
        if (name == "lm_head.weight" and config.tie_embeddings) or is_moe_name(name):
            continue
        if name in LLAMA_TOP:
            state[LLAMA_TOP[name]] = tensor[: config.vocab_size] if name != "transformer.ln_f.weight" else tensor
            continue
        layer, module, param = _layer_name(name)
        prefix = f"model.layers.{layer}."
        if module in LLAMA_FUSED:
            for part, piece in zip(LLAMA_FUSED[module], tensor.split(sizes[module]), strict=True):
                state[f"{prefix}{part}.{param}"] = piece
        else:
            state[f"{prefix}{LLAMA_RENAMES[module]}.{param}"] = tensor
    return {**state, **moe_state_to_hf(model, moe_model_type(config))} if config.is_moe else state


def llama_state_from_hf(model: GPT, hf: Tensors) -> Tensors:
    config = model.config
    state: Tensors = {}
    for name in model.state_dict():
        if (name == "lm_head.weight" and config.tie_embeddings) or is_moe_name(name):
            continue
        if name in LLAMA_TOP:
            tensor = hf[LLAMA_TOP[name]]
            state[name] = tensor if name == "transformer.ln_f.weight" else _pad_rows(tensor, config.padded_vocab_size)
            continue
        layer, module, param = _layer_name(name)
        prefix = f"model.layers.{layer}."
        if module in LLAMA_FUSED:
            state[name] = torch.cat([hf[f"{prefix}{part}.{param}"] for part in LLAMA_FUSED[module]])
        else:
            state[name] = hf[f"{prefix}{LLAMA_RENAMES[module]}.{param}"]
    return {**state, **moe_state_from_hf(model, hf, moe_model_type(config))} if config.is_moe else state


def uses_routing_bias(model: GPT) -> bool:
    """Whether a sparse layer's DeepSeek-V3 routing bias moves its choice of experts (no transformers class has one)."""
    return any(bool(layer.route_bias.any()) for layer in model.moe_layers())


def moe_model_type(config: ModelConfig) -> str:
    """The MoE family whose weight names a sparse llama model uses: Qwen3-MoE has QK-norm, Mixtral has not."""
    return "qwen3_moe" if config.qk_norm else "mixtral"


def gptlab_state_to_hf(model: GPT) -> Tensors:
    """Our weights under our own names for the "gptlab" format: the pad rows cut off, a tied lm_head left out."""
    config = model.config
    state: Tensors = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_embeddings:
            continue
        state[name] = tensor[: config.vocab_size] if name in ("transformer.wte.weight", "lm_head.weight") else tensor
    return state


def gptlab_state_from_hf(model: GPT, hf: Tensors) -> Tensors:
    return {name: _pad_rows(tensor, model.config.padded_vocab_size) if name in ("transformer.wte.weight", "lm_head.weight")
            else tensor for name, tensor in hf.items()}


def _check_names(hf: Tensors, expected: Tensors, source: str) -> None:
    """Compare in Hugging Face names, so the error names what is (or isn't) in the user's file."""
    missing = sorted(set(expected) - set(hf))
    unexpected = sorted(set(hf) - set(expected))
    shapes = [f"{key} {tuple(hf[key].shape)} != {tuple(expected[key].shape)}"
              for key in sorted(set(hf) & set(expected)) if hf[key].shape != expected[key].shape]
    found = (("missing keys", ", ", missing), ("unexpected keys", ", ", unexpected), ("shape mismatches", "; ", shapes))
    parts = [f"{label}: {separator.join(keys)}" for label, separator, keys in found if keys]
    if parts:
        raise GptlabError(f"{source} does not match its config.json: " + "; ".join(parts))


def _load_converted(config: ModelConfig, hf: Tensors, to_hf: Callable, from_hf: Callable, source: str, device) -> GPT:
    model = GPT(config)
    _check_names(hf, to_hf(model), source)
    with torch.no_grad():
        load_state(model, from_hf(model, hf), source)
    return model.to(device).eval()


# ---------------------------------------------------------------- public API


def load_hf_gpt2(path: str | os.PathLike, *, device: str | torch.device = "cpu") -> GPT:
    """A GPT2LMHeadModel directory (the hub's gpt2, gpt2-medium, ..., or any save_pretrained output) as a GPT."""
    config = gpt2_config_from_hf(read_hf_config(path))
    hf = _normalize_gpt2_names(read_hf_weights(path), config.tie_embeddings)
    return _load_converted(config, hf, gpt2_state_to_hf, gpt2_state_from_hf, f"weights in {path}", device)


def load_hf_llama(path: str | os.PathLike, *, device: str | torch.device = "cpu") -> GPT:
    """A LlamaForCausalLM (or Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM) directory as a
    GPT; the inverse of `export_hf` for llama."""
    config = llama_config_from_hf(read_hf_config(path))
    hf = {name: tensor for name, tensor in read_hf_weights(path).items() if not name.endswith("rotary_emb.inv_freq")}
    if config.is_moe:
        hf = unfuse_experts(hf, moe_model_type(config))
    if config.tie_embeddings:
        hf.pop("lm_head.weight", None)
    return _load_converted(config, hf, llama_state_to_hf, llama_state_from_hf, f"weights in {path}", device)


def load_hf_gptlab(path: str | os.PathLike, *, device: str | torch.device = "cpu") -> GPT:
    """A folder `gptlab export hf` wrote with custom modeling code (model_type "gptlab") as a GPT; its code is not run."""
    config = gptlab_config_from_hf(read_hf_config(path))
    return _load_converted(config, read_hf_weights(path), gptlab_state_to_hf, gptlab_state_from_hf, f"weights in {path}", device)


def export_hf(model: GPT, directory: str | os.PathLike, *, eos_token_id: int | None = None, bos_token_id: int | None = None) -> Path:
    """Write `directory` (config.json + model.safetensors) so `transformers.AutoModelForCausalLM` loads it.

    gpt2 -> GPT2LMHeadModel; llama -> LlamaForCausalLM, Qwen2ForCausalLM with qkv_bias (and bias False), or
    Qwen3ForCausalLM with qk_norm; a mixture of experts -> Qwen3MoeForCausalLM (qk_norm) or MixtralForCausalLM
    (gptlab.model.hf_moe), written with transformers' per-expert keys. Only models a
    transformers class computes (`native_architecture`); gptlab.export.export_hf writes any model.
    `eos_token_id` (also written as bos unless `bos_token_id` is given, GPT-2's convention) is the tokenizer's
    business, so it is left unset unless given. Weights first, config last: a directory with a config is complete.
    """
    config = model.config
    check_exportable(config)
    if uses_routing_bias(model):
        raise GptlabError("cannot export this model as Qwen3MoeForCausalLM or MixtralForCausalLM: its experts' routing bias "
                          "(moe.bias_update, DeepSeek-V3) is not zero and neither class has one; gptlab.export.export_hf "
                          "(`gptlab export hf`) writes it with its own modeling code")
    if config.arch == "gpt2":
        hf_config, state = gpt2_config_to_hf(config), gpt2_state_to_hf(model)
    else:
        hf_config, state = llama_config_to_hf(config), llama_state_to_hf(model)
        if config.is_moe:
            hf_config = moe_config_to_hf(config, hf_config)
    dtype = next(model.parameters()).dtype
    hf_config.update(bos_token_id=eos_token_id if bos_token_id is None else bos_token_id, eos_token_id=eos_token_id,
                     torch_dtype=str(dtype).removeprefix("torch."))
    # clones: safetensors refuses tensors that share memory (split views, the tied table)
    state = {name: tensor.detach().to("cpu").clone(memory_format=torch.contiguous_format) for name, tensor in state.items()}
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_safetensors(state, directory / SAFETENSORS_NAME)
    atomic_write_text(directory / CONFIG_NAME, json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    return directory


def read_pretrained_config(directory: str | os.PathLike) -> ModelConfig:
    """The ModelConfig of a model folder (gptlab's own, or Hugging Face gpt2 / llama / qwen2 / qwen3 / qwen3_moe / mixtral /
    gptlab), without the weights."""
    from gptlab.model.io import config_from_dict

    data = read_hf_config(directory)
    if "arch" in data and "model_type" not in data:
        return config_from_dict(data)
    model_type = data.get("model_type")
    if model_type == "gpt2":
        return gpt2_config_from_hf(data)
    if model_type in (*LLAMA_MODEL_TYPES, *MOE_MODEL_TYPES):
        return llama_config_from_hf(data)
    if model_type == GPTLAB_MODEL_TYPE:
        return gptlab_config_from_hf(data)
    raise GptlabError(f"{directory} holds a {model_type!r} model; gptlab reads {', '.join(HF_MODEL_TYPES)} and its own format")


def load_pretrained_directory(directory: str | os.PathLike, *, device: str | torch.device = "cpu") -> GPT:
    """Any model directory we read: gptlab's own (config has "arch"), or Hugging Face gpt2 / llama / qwen2 / qwen3 /
    qwen3_moe / mixtral / gptlab."""
    data = read_hf_config(directory)
    if "arch" in data and "model_type" not in data:
        return load_model(directory, device=device)
    model_type = data.get("model_type")
    if model_type == "gpt2":
        return load_hf_gpt2(directory, device=device)
    if model_type in (*LLAMA_MODEL_TYPES, *MOE_MODEL_TYPES):
        return load_hf_llama(directory, device=device)
    if model_type == GPTLAB_MODEL_TYPE:
        return load_hf_gptlab(directory, device=device)
    raise GptlabError(f"{directory} holds a {model_type!r} model; gptlab reads {', '.join(HF_MODEL_TYPES)} and its own format")


def pretrained_path(name_or_path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None) -> Path:
    """The local folder of a model: the directory given, or a hub name's snapshot in the local Hugging Face cache."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    name = str(name_or_path)
    if name.startswith((".", "/", "~")) or name.count("/") > 1:  # a path, not "name" or "org/name"
        raise GptlabError(f"no model at {name}: no such folder (pass a model or run folder, or a Hugging Face hub name such as gpt2)")
    return _cached_snapshot(name, cache_dir)


def from_pretrained(
    name_or_path: str | os.PathLike, *, device: str | torch.device = "cpu", cache_dir: str | os.PathLike | None = None
) -> GPT:
    """A local directory, or a hub name ("gpt2", "gpt2-medium", "org/name") already in the local Hugging Face cache.

    Never downloads: a name missing from the cache raises with the command that fetches it.
    """
    return load_pretrained_directory(pretrained_path(name_or_path, cache_dir=cache_dir), device=device)


def _hub_cache(cache_dir: str | os.PathLike | None) -> str | None:
    """Read the cache location now: huggingface_hub reads HF_HUB_CACHE / HF_HOME once, when first imported."""
    if cache_dir is not None:
        return str(cache_dir)
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None  # huggingface_hub's default (~/.cache/huggingface/hub)


def _cached_snapshot(repo_id: str, cache_dir: str | os.PathLike | None) -> Path:
    how = (f"gptlab never downloads. On a machine with internet run `huggingface-cli download {repo_id}` "
           f"(or `hf download {repo_id}`) into this cache, or pass a local directory holding "
           f"{CONFIG_NAME} and {SAFETENSORS_NAME}")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
    except ImportError:
        raise GptlabError(f"reading {repo_id!r} from the Hugging Face cache needs huggingface_hub "
                          f"(pip install huggingface_hub), or pass a local directory") from None
    cache = _hub_cache(cache_dir)
    try:
        snapshot = Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError:
        raise GptlabError(f"no model at {repo_id}: no such folder here, and no such model in the local Hugging Face cache "
                          f"({cache or 'default location'}); {how}") from None
    except HFValidationError as error:
        raise GptlabError(f"{repo_id!r} is neither a directory nor a Hugging Face hub name: {error}") from None
    if not (snapshot / CONFIG_NAME).is_file():
        raise GptlabError(f"the cached snapshot of {repo_id!r} at {snapshot} has no {CONFIG_NAME}; {how}")
    return snapshot
