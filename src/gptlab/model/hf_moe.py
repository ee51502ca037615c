"""Hugging Face interop for mixture-of-experts models: Qwen3-MoE and Mixtral <-> GPT with MoEConfig (gptlab.model.moe).

Attention, norms and embeddings are the llama mapping (gptlab.model.hf); the sparse layers map as

    Qwen3MoeForCausalLM (model_type "qwen3_moe")         GPT (arch="llama", qk_norm, moe)
      model.layers.N.mlp.gate                               transformer.h.N.mlp.router
      model.layers.N.mlp.experts.E.{gate,up}_proj           transformer.h.N.mlp.experts_fc[E] rows [gate | up]
      model.layers.N.mlp.experts.E.down_proj                transformer.h.N.mlp.experts_proj[E]
      dense layers (mlp_only_layers, decoder_sparse_step)   the llama MLP (intermediate_size = mlp_hidden)
    MixtralForCausalLM (model_type "mixtral")            GPT (arch="llama", moe, every layer sparse)
      model.layers.N.block_sparse_moe.gate                  transformer.h.N.mlp.router
      ...block_sparse_moe.experts.E.{w1, w3, w2}            experts_fc[E] [gate (w1) | up (w3)], experts_proj[E] (w2)

transformers 5 holds the experts fused in memory (`mlp.experts.gate_up_proj` (E, 2I, H) with gate rows first,
`mlp.experts.down_proj` (E, H, I), Mixtral's router as `mlp.gate`) but save_pretrained writes the per-expert keys
above; both are read, the per-expert keys are written. Both families route with a softmax over experts, top-k,
optional renormalisation (Mixtral always), dropless, with no shared experts and no routing bias: a model with any
of those (or sigmoid scores, capacity) has no class here and gptlab.export writes it with its own modeling code.
The balance-loss coefficient travels as router_aux_loss_coef; it and the z-loss, bias rate and impl are training
choices that change no logits.
"""

from __future__ import annotations

import re
from dataclasses import replace

import torch

from gptlab.model.config import ModelConfig, MoEConfig
from gptlab.runtime import GptlabError

QWEN3_MOE, MIXTRAL = "qwen3_moe", "mixtral"
MOE_MODEL_TYPES = (QWEN3_MOE, MIXTRAL)
ARCHITECTURES = {QWEN3_MOE: "Qwen3MoeForCausalLM", MIXTRAL: "MixtralForCausalLM"}
# per family: the sparse block's module name in saved files, and the expert's gate, up and down projections
EXPERT_NAMES = {QWEN3_MOE: ("mlp", "gate_proj", "up_proj", "down_proj"), MIXTRAL: ("block_sparse_moe", "w1", "w3", "w2")}
FUSED = re.compile(r"model\.layers\.(\d+)\.mlp\.(experts\.gate_up_proj|experts\.down_proj|gate\.weight)")

Tensors = dict[str, torch.Tensor]


# ---------------------------------------------------------------- configs


# used by gptlab.model.hf too, which imports this file (never the reverse)
def _require(checks: dict[str, tuple[object, tuple]], family: str) -> None:
    """One error listing every setting we cannot compute exactly: {key: (actual, supported values)}."""
    bad = [f"{key}={actual!r} (supported: {', '.join(map(repr, allowed))})"
           for key, (actual, allowed) in checks.items() if actual not in allowed]
    if bad:
        raise GptlabError(f"unsupported {family} config: {'; '.join(bad)}. gptlab's model cannot compute this exactly")


def sparse_pattern(hf: dict, n_layer: int) -> list[bool]:
    """Which layers transformers makes sparse: Qwen3-MoE skips mlp_only_layers and keeps every decoder_sparse_step-th."""
    if hf.get("model_type") == MIXTRAL:
        return [True] * n_layer
    dense, step = set(hf.get("mlp_only_layers") or []), hf.get("decoder_sparse_step", 1) or 1
    return [layer not in dense and (layer + 1) % step == 0 for layer in range(n_layer)]


def _layout(pattern: list[bool]) -> tuple[int, int]:
    """(first_dense, every) giving this per-layer pattern in gptlab, or a GptlabError naming the keys."""
    n, first_sparse = len(pattern), pattern.index(True)
    for every in range(1, first_sparse + 2):  # gptlab's first sparse layer is first_dense + every - 1
        first_dense = first_sparse - every + 1
        if [layer >= first_dense and (layer - first_dense + 1) % every == 0 for layer in range(n)] == pattern:
            return first_dense, every
    sparse = [layer for layer, is_sparse in enumerate(pattern) if is_sparse]
    raise GptlabError(f"unsupported qwen3_moe config: mlp_only_layers and decoder_sparse_step make layers {sparse} sparse, "
                      f"which gptlab's moe.first_dense / moe.every cannot express (the first layers dense, then every k-th sparse)")


def moe_config_from_hf(hf: dict, config: ModelConfig) -> ModelConfig:
    """Add MoEConfig to `config` (the attention part, read by llama_config_from_hf) from a qwen3_moe / mixtral config.json."""
    model_type = hf["model_type"]
    checks: dict = {"router_jitter_noise": (hf.get("router_jitter_noise", 0.0), (0.0, 0))}
    if model_type == MIXTRAL:
        checks["sliding_window"] = (hf.get("sliding_window"), (None,))
    _require(checks, model_type)
    n_experts = hf.get("num_experts", hf.get("num_local_experts", 8 if model_type == MIXTRAL else 128))
    pattern = sparse_pattern(hf, config.n_layer)
    if not any(pattern):  # before _layout, which needs a sparse layer
        raise GptlabError(f"this {model_type} config has no sparse layer (mlp_only_layers={hf.get('mlp_only_layers')}, "
                          f"decoder_sparse_step={hf.get('decoder_sparse_step')}): load it as a dense qwen3 model")
    first_dense, every = _layout(pattern)
    intermediate = hf.get("intermediate_size", 14336 if model_type == MIXTRAL else 6144)
    expert_hidden = intermediate if model_type == MIXTRAL else hf.get("moe_intermediate_size", 768)
    moe = MoEConfig(n_experts=n_experts, top_k=hf.get("num_experts_per_tok", 2 if model_type == MIXTRAL else 8),
                    expert_hidden=expert_hidden, first_dense=first_dense, every=every, score="softmax",
                    normalize=True if model_type == MIXTRAL else bool(hf.get("norm_topk_prob", False)),
                    aux_loss=float(hf.get("router_aux_loss_coef", 0.001)))
    # the dense layers' width: Qwen3-MoE's intermediate_size (None where it is our default); Mixtral has no dense layer
    dense = None if model_type == MIXTRAL or intermediate == config.hidden_dim else intermediate
    return replace(config, mlp_hidden=dense, moe=moe)


def moe_export_problems(config: ModelConfig) -> list[str]:
    """What keeps both MoE classes from computing `config` exactly; [] when one does (see moe_architecture)."""
    moe, bad = config.moe, []
    if moe.n_shared:
        bad.append(f"moe.n_shared={moe.n_shared}")
    if moe.score != "softmax":
        bad.append(f"moe.score={moe.score!r}")
    if moe.capacity_factor:
        bad.append(f"moe.capacity_factor={moe.capacity_factor}")
    if moe.bias_update:
        bad.append(f"moe.bias_update={moe.bias_update} (a routing bias)")
    if config.bias or config.qkv_bias:
        bad.append(f"bias={config.bias}, qkv_bias={config.qkv_bias}")
    if not config.qk_norm and not (all(config.sparse_layers) and moe.normalize):  # then Mixtral is the only candidate
        bad.append(f"qk_norm=False with moe.first_dense={moe.first_dense}, moe.every={moe.every}, moe.normalize={moe.normalize} "
                   f"(Mixtral: every layer sparse, weights renormalised; Qwen3-MoE: qk_norm)")
    return bad


def moe_architecture(config: ModelConfig) -> str | None:
    """Qwen3MoeForCausalLM (QK-norm), MixtralForCausalLM (no QK-norm), or None where neither computes `config`."""
    if moe_export_problems(config):
        return None
    return ARCHITECTURES[QWEN3_MOE if config.qk_norm else MIXTRAL]


def moe_config_to_hf(config: ModelConfig, hf: dict) -> dict:
    """Turn the llama config.json `hf` (gptlab.model.hf.llama_config_to_hf) into Qwen3-MoE's or Mixtral's."""
    moe, model_type = config.moe, QWEN3_MOE if config.qk_norm else MIXTRAL
    hf = {**hf, "architectures": [ARCHITECTURES[model_type]], "model_type": model_type, "num_experts_per_tok": moe.top_k,
          "router_aux_loss_coef": moe.aux_loss, "output_router_logits": False}
    if model_type == QWEN3_MOE:  # every dense layer listed, so any first_dense / every is written exactly
        hf.update(num_experts=moe.n_experts, moe_intermediate_size=config.expert_hidden, norm_topk_prob=moe.normalize,
                  decoder_sparse_step=1, mlp_only_layers=[layer for layer, sparse in enumerate(config.sparse_layers) if not sparse],
                  use_sliding_window=False, sliding_window=None)
    else:
        for key in ("use_sliding_window", "max_window_layers", "layer_types", "mlp_bias", "attention_bias"):
            hf.pop(key, None)
        hf.update(num_local_experts=moe.n_experts, intermediate_size=config.expert_hidden, sliding_window=None,
                  router_jitter_noise=0.0)
    return hf


# ---------------------------------------------------------------- weights


def is_moe_name(name: str) -> bool:
    """A parameter or buffer of a sparse layer ("transformer.h.1.mlp.experts_fc"), which the llama mapping skips."""
    return ".mlp.router." in name or ".mlp.shared." in name or name.endswith((".mlp.experts_fc", ".mlp.experts_proj", ".mlp.route_bias"))


def unfuse_experts(hf: Tensors, model_type: str) -> Tensors:
    """transformers' in-memory names (fused experts, Mixtral's router under mlp) as the per-expert names it saves."""
    block, gate, up, down = EXPERT_NAMES[model_type]
    state: Tensors = {}
    for name, tensor in hf.items():
        match = FUSED.fullmatch(name)
        if match is None:
            state[name] = tensor
            continue
        prefix, part = f"model.layers.{match[1]}.{block}.", match[2]
        if part == "gate.weight":
            state[f"{prefix}gate.weight"] = tensor
        elif part == "experts.down_proj":
            state.update({f"{prefix}experts.{e}.{down}.weight": piece for e, piece in enumerate(tensor)})
        else:  # gate rows first, then up: transformers' experts compute act(gate) * up from .chunk(2)
            for e, piece in enumerate(tensor):
                state[f"{prefix}experts.{e}.{gate}.weight"], state[f"{prefix}experts.{e}.{up}.weight"] = piece.chunk(2)
    return state


def _sparse_layers(model):
    """(block number, MoE layer) for each sparse layer of `model`."""
    return [(layer, block.mlp) for layer, block in enumerate(model.transformer["h"]) if hasattr(block.mlp, "experts_fc")]


def moe_state_to_hf(model, model_type: str) -> Tensors:
    """The sparse layers' weights under the family's per-expert names (the llama mapping does the rest)."""
    block, gate, up, down = EXPERT_NAMES[model_type]
    state: Tensors = {}
    for layer, moe in _sparse_layers(model):
        prefix = f"model.layers.{layer}.{block}."
        state[f"{prefix}gate.weight"] = moe.router.weight
        for e in range(moe.experts_fc.shape[0]):
            state[f"{prefix}experts.{e}.{gate}.weight"], state[f"{prefix}experts.{e}.{up}.weight"] = moe.experts_fc[e].chunk(2)
            state[f"{prefix}experts.{e}.{down}.weight"] = moe.experts_proj[e]
    return state


def moe_state_from_hf(model, hf: Tensors, model_type: str) -> Tensors:
    """Our sparse layers' tensors from the per-expert names; route_bias zero (neither family has one)."""
    block, gate, up, down = EXPERT_NAMES[model_type]
    state: Tensors = {}
    for layer, moe in _sparse_layers(model):
        prefix, ours = f"model.layers.{layer}.{block}.", f"transformer.h.{layer}.mlp."
        experts = range(moe.experts_fc.shape[0])
        state[f"{ours}router.weight"] = hf[f"{prefix}gate.weight"]
        state[f"{ours}experts_fc"] = torch.stack([torch.cat([hf[f"{prefix}experts.{e}.{gate}.weight"],
                                                             hf[f"{prefix}experts.{e}.{up}.weight"]]) for e in experts])
        state[f"{ours}experts_proj"] = torch.stack([hf[f"{prefix}experts.{e}.{down}.weight"] for e in experts])
        state[f"{ours}route_bias"] = torch.zeros_like(moe.route_bias)
    return state
