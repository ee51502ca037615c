"""A model and its tokenizer as one GGUF file, the format llama.cpp and Ollama run, written with llama.cpp's `gguf` package.

    write_gguf(model, tokenizer, "out/model.gguf", type="f16")   ->  Path("out/model.gguf")
    export_gguf(model, tokenizer, "out/model.gguf", modelfile=True) ->  (that, Path("out/model.Modelfile"))

Architectures, as llama.cpp names them (the choice is gptlab.model.hf.native_architecture's, the one the Hugging Face
export makes): GPT2LMHeadModel -> "gpt2"; LlamaForCausalLM -> "llama"; Qwen2ForCausalLM -> "qwen2"; Qwen3ForCausalLM
-> "qwen3"; Qwen3MoeForCausalLM -> "qwen3moe" (every layer sparse); MixtralForCausalLM -> "llama" with experts.
A switch llama.cpp has no key for (rotary or RMSNorm on gpt2, ReLU², a softcap, sliding windows, sigmoid routing,
shared experts, ...) is refused in one line naming the --model options, before anything is written.

Tensors, GGUF name <- gptlab name (GGUF lists shapes innermost first, so a torch Linear (out, in) goes as it is):

    token_embd / position_embd / output_norm / output    transformer.wte / wpe / ln_f / lm_head (vocab_size rows)
    blk.N.attn_norm, blk.N.ffn_norm                        transformer.h.N.ln_1, ln_2
    blk.N.attn_qkv (gpt2) | attn_q, attn_k, attn_v         attn.c_attn (rows [q | k | v])
    blk.N.attn_output, blk.N.attn_q_norm, attn_k_norm      attn.c_proj, attn.q_norm, attn.k_norm
    blk.N.ffn_up (gpt2) | ffn_gate, ffn_up; blk.N.ffn_down  mlp.c_fc (rows [gate | up]), mlp.c_proj
    blk.N.ffn_gate_inp, ffn_{gate,up}_exps, ffn_down_exps   mlp.router, mlp.experts_fc (E, [gate | up], C), experts_proj

llama.cpp's "llama" architecture rotates consecutive pairs of a head's dimensions; gptlab (as transformers) rotates
the two halves, so the q and k rows of a "llama" file are interleaved (`interleave_rotary`); qwen2/qwen3 rotate halves.
Types: f32 keeps every number; f16 and q8_0 (blocks of 32 weights with one f16 scale, `gguf.quants`) store matrices
so, while 1-D tensors, position embeddings and routers stay f32 (as llama.cpp's converter); a q8_0 matrix whose rows
are not a multiple of 32 falls back to f16. The tokenizer, special ids and chat template: gptlab.export.gguf_vocab.

OUT is written beside itself and renamed in: it is the old file or the new one. An existing OUT is replaced only with
force, and only if it is a GGUF file. Not here: reading the file back (gguf.GGUFReader, llama.cpp), the Modelfile
(gptlab.export.gguf_vocab.ollama_modelfile).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path

import numpy as np
import torch

from gptlab.export.gguf_vocab import check_gguf_tokenizer, modelfile_path, write_modelfile, write_tokenizer
from gptlab.export.hf import check_exportable
from gptlab.model import GPT, ModelConfig
from gptlab.model import hf as model_hf
from gptlab.runtime import GptlabError, atomic_path

GGUF_TYPES = ("f32", "f16", "q8_0")
MAGIC = b"GGUF"
# transformers' class (gptlab.model.hf.native_architecture) -> llama.cpp's architecture
LLAMA_CPP_ARCHITECTURES = {"GPT2LMHeadModel": "gpt2", "LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                           "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3moe", "MixtralForCausalLM": "llama"}
KEEP_F32 = ("position_embd.weight", ".ffn_gate_inp.weight")  # llama.cpp's converter keeps these f32 at any type
ARCH_RECIPES = {"gpt2": {"position": "learned", "norm": "layer", "activation": "gelu"},
                "llama": {"position": "rotary", "norm": "rms", "activation": "swiglu"}}


def gguf_problems(config: ModelConfig) -> list[str]:
    """The --model options (with their values) that no llama.cpp architecture computes; [] when one does."""
    bad = [f"--model.{name} {getattr(config, f'{name}_kind')}" for name, value in ARCH_RECIPES[config.arch].items()
           if getattr(config, f"{name}_kind") != value]
    if config.arch == "gpt2":
        bad += ["--model.qk-norm true"] * config.qk_norm
        bad += [f"--model.n-kv-head {config.n_kv_head}"] * (config.kv_heads != config.n_head)
        bad += [f"--model.moe.n-experts {config.moe.n_experts}"] * config.is_moe
    elif config.qk_norm and (config.bias or config.qkv_bias):  # qwen3 has QK-norm and no biases
        bad.append(f"--model.qk-norm true with --model.bias {_value(config.bias)} --model.qkv-bias {_value(config.qkv_bias)}")
    if config.logit_softcap:
        bad.append(f"--model.logit-softcap {config.logit_softcap}")
    if config.bigram_vocab:
        bad.append(f"--model.bigram-vocab {config.bigram_vocab}")
    if any(config.layer_windows):
        bad.append(f"--model.attn-window {config.attn_window} (--model.window-pattern {config.window_pattern})")
    if config.is_moe and config.arch == "llama":
        bad += _moe_problems(config)
    return bad


def _value(value) -> str:
    """A value as the command line takes it: true/false for booleans."""
    return str(value).lower() if isinstance(value, bool) else str(value)


MOE_RECIPE = {"score": "softmax", "n_shared": 0, "capacity_factor": 0.0, "normalize": True, "first_dense": 0, "every": 1}


def _moe_problems(config: ModelConfig) -> list[str]:
    """llama.cpp's qwen3moe and llama (Mixtral) route softmax top-k with renormalised weights, in every layer."""
    moe = config.moe
    bad = [f"--model.moe.{name.replace('_', '-')} {_value(getattr(moe, name))}" for name, wanted in MOE_RECIPE.items()
           if getattr(moe, name) != wanted]
    if config.bias or config.qkv_bias:
        bad.append(f"--model.bias {_value(config.bias)} --model.qkv-bias {_value(config.qkv_bias)} with experts")
    return bad


def gguf_recipe(config: ModelConfig, routing_bias: bool = False) -> list[tuple[str, object]]:
    """The fewest --model settings ([("arch", "llama"), ...]) that would make a model like this one exportable
    as GGUF, [] when none is found: llama's recipe (rotary, RMSNorm, SwiGLU) or gpt2's, each pared down to the
    settings that matter, and the shorter one kept. Each is checked with gguf_problems."""
    common = {"logit_softcap": 0.0, "attn_window": 0, "window_pattern": "L", "bigram_vocab": 0}
    candidates = [
        {"arch": "llama", "position": "rotary", "norm": "rms", "activation": "swiglu", **common,
         **({"bias": False, "qkv_bias": False} if config.qk_norm or config.is_moe else {}),
         **{f"moe.{name}": value for name, value in MOE_RECIPE.items()},
         **({"moe.bias_update": 0.0} if routing_bias else {})},
        {"arch": "gpt2", "position": "learned", "norm": "layer", "activation": "gelu", "qk_norm": False, "n_kv_head": None,
         "moe.n_experts": 0, **common},
    ]
    recipes = []
    for candidate in candidates:
        changes = {key: value for key, value in candidate.items() if _get(config, key) != value}
        if not _exportable(config, changes, routing_bias):
            continue
        for key in list(changes):  # drop what the export does not need
            fewer = {name: value for name, value in changes.items() if name != key}
            if _exportable(config, fewer, routing_bias):
                changes = fewer
        recipes.append(list(changes.items()))
    return min(recipes, key=len) if recipes else []


def _get(config: ModelConfig, key: str):
    head, _, tail = key.partition(".")
    return getattr(config.moe, tail) if tail else getattr(config, head)


def _exportable(config: ModelConfig, changes: dict, routing_bias: bool) -> bool:
    """Whether a model with `changes` applied to `config` would export (a trained routing bias: unless not trained)."""
    moe = {key[len("moe."):]: value for key, value in changes.items() if key.startswith("moe.")}
    top = {key: value for key, value in changes.items() if not key.startswith("moe.")}
    try:
        changed = dataclasses.replace(config, **top, moe=dataclasses.replace(config.moe, **moe))
        check_exportable(changed)
    except (GptlabError, TypeError, ValueError):
        return False
    trained_bias = routing_bias and changed.is_moe and changed.moe.bias_update != 0
    return not gguf_problems(changed) and not trained_bias


def recipe_flags(recipe: list[tuple[str, object]], prefix: str = "--model.") -> str:
    """[("arch", "llama"), ("bias", False)] -> "--model.arch llama --model.bias false"."""
    return " ".join(f"{prefix}{key.replace('_', '-')} {_value(value)}" for key, value in recipe)


def gguf_architecture(model: GPT) -> str:
    """llama.cpp's architecture for `model`, or one GptlabError naming the options that have no GGUF equivalent
    and the training flags that would make such a model exportable."""
    config = model.config
    check_exportable(config)
    bad = gguf_problems(config)
    routing_bias = config.is_moe and model_hf.uses_routing_bias(model)
    if routing_bias:
        bad.append(f"--model.moe.bias-update {config.moe.bias_update} (a trained routing bias)")
    if bad:
        verb = "has" if len(bad) == 1 else "have"
        recipe = gguf_recipe(config, routing_bias)
        fix = (f"; a model trained with {recipe_flags(recipe)} exports (gptlab run: {recipe_flags(recipe, '--train.model.')})"
               if recipe else "")
        raise GptlabError(f"cannot export this {config.arch} model as GGUF: {', '.join(bad)} {verb} no GGUF/llama.cpp equivalent "
                          f"(llama.cpp runs gpt2 with learned positions, LayerNorm and GELU, and llama with rotary, RMSNorm and "
                          f"SwiGLU){fix}; `gptlab export hf` writes any model")
    architecture = model_hf.native_architecture(config)
    if architecture not in LLAMA_CPP_ARCHITECTURES:  # gguf_problems covers what native_architecture refuses
        raise GptlabError(f"cannot export this {config.arch} model as GGUF: no llama.cpp architecture computes it")
    return LLAMA_CPP_ARCHITECTURES[architecture]


def interleave_rotary(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of q or k (weight or bias) from rotate-half order to llama.cpp's pairs: per head, rows
    [a0 .. a(d/2-1), b0 .. b(d/2-1)] -> [a0, b0, a1, b1, ...]; a_i and b_i rotate together at frequency i either way."""
    rows = weight.shape[0]
    return weight.reshape(n_heads, 2, rows // n_heads // 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def gguf_tensors(model: GPT, architecture: str) -> dict[str, torch.Tensor]:
    """Every tensor of the file under its GGUF name, float32 on the CPU, in gptlab's row order but for `interleave_rotary`."""
    if architecture == "gpt2":
        return _gpt2_tensors(model)
    config = model.config
    state = {name: tensor.detach().float().cpu() for name, tensor in model.state_dict().items()}
    tensors = _top_tensors(state, config)
    q, kv = config.n_head * config.head_dim, config.kv_heads * config.head_dim
    for layer in range(config.n_layer):
        ours, blk = f"transformer.h.{layer}.", f"blk.{layer}."
        tensors[f"{blk}attn_norm.weight"] = state[f"{ours}ln_1.weight"]
        tensors[f"{blk}ffn_norm.weight"] = state[f"{ours}ln_2.weight"]
        for param in ("weight", "bias"):
            if f"{ours}attn.c_attn.{param}" in state:
                parts = dict(zip("qkv", state[f"{ours}attn.c_attn.{param}"].split([q, kv, kv]), strict=True))
                if architecture == "llama":
                    parts["q"], parts["k"] = interleave_rotary(parts["q"], config.n_head), interleave_rotary(parts["k"], config.kv_heads)
                tensors.update({f"{blk}attn_{part}.{param}": tensor for part, tensor in parts.items()})
            for ours_name, gguf_name in (("attn.c_proj", "attn_output"), ("attn.q_norm", "attn_q_norm"),
                                         ("attn.k_norm", "attn_k_norm"), ("mlp.c_proj", "ffn_down")):
                if f"{ours}{ours_name}.{param}" in state:
                    tensors[f"{blk}{gguf_name}.{param}"] = state[f"{ours}{ours_name}.{param}"]
            if f"{ours}mlp.c_fc.{param}" in state:
                gate, up = state[f"{ours}mlp.c_fc.{param}"].chunk(2)
                tensors[f"{blk}ffn_gate.{param}"], tensors[f"{blk}ffn_up.{param}"] = gate, up
        if f"{ours}mlp.experts_fc" in state:
            tensors[f"{blk}ffn_gate_inp.weight"] = state[f"{ours}mlp.router.weight"]  # (E, C)
            tensors[f"{blk}ffn_gate_exps.weight"], tensors[f"{blk}ffn_up_exps.weight"] = state[f"{ours}mlp.experts_fc"].chunk(2, dim=1)
            tensors[f"{blk}ffn_down_exps.weight"] = state[f"{ours}mlp.experts_proj"]  # (E, C, I)
    return tensors


def _top_tensors(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Embeddings, final norm and output layer (left out when tied: llama.cpp then reuses token_embd)."""
    tensors = {"token_embd.weight": state["transformer.wte.weight"][: config.vocab_size]}
    if "transformer.wpe.weight" in state:
        tensors["position_embd.weight"] = state["transformer.wpe.weight"]
    tensors.update({f"output_norm.{param}": state[f"transformer.ln_f.{param}"] for param in ("weight", "bias")
                    if f"transformer.ln_f.{param}" in state})
    if not config.tie_embeddings:
        tensors["output.weight"] = state["lm_head.weight"][: config.vocab_size]
    return tensors


def _gpt2_tensors(model: GPT) -> dict[str, torch.Tensor]:
    """GPT-2 via gptlab.model.hf's GPT2LMHeadModel state (zero biases where bias=False: llama.cpp's gpt2 needs them),
    with its Conv1D transposition undone: llama.cpp stores GPT-2's matrices as Linear (out, in)."""
    config, hf = model.config, model_hf.gpt2_state_to_hf(model)
    state = {}
    for name, tensor in hf.items():
        conv1d = name.startswith("transformer.h.") and name.split(".", 3)[3].removesuffix(".weight") in model_hf.CONV1D
        state[name] = (tensor.t() if conv1d else tensor).detach().float().cpu()
    tensors = _top_tensors(state, config)
    names = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
             "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    for layer in range(config.n_layer):
        for ours, theirs in names.items():
            for param in ("weight", "bias"):
                tensors[f"blk.{layer}.{theirs}.{param}"] = state[f"transformer.h.{layer}.{ours}.{param}"]
    return tensors


def gguf_package():
    """llama.cpp's `gguf` package, imported when a file is written (a dependency; only this writer needs it)."""
    try:
        import gguf
    except ImportError:
        raise GptlabError("writing GGUF needs llama.cpp's gguf package: pip install gguf") from None
    return gguf


def encode_tensor(name: str, tensor: torch.Tensor, type: str):
    """(array, raw GGML type or None) for GGUFWriter.add_tensor: f32, f16 or q8_0 as `type` and the tensor allow."""
    gguf = gguf_package()
    array = tensor.contiguous().numpy().astype(np.float32)
    if type == "f32" or array.ndim == 1 or name.endswith(KEEP_F32):
        return array, None
    if type == "q8_0":
        with contextlib.suppress(gguf.QuantError):  # rows not a multiple of 32: f16, as llama.cpp's converter
            return gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
    return array.astype(np.float16), None


def check_gguf_out(path: str | os.PathLike, *, force: bool = False) -> Path:
    """OUT as a Path if a GGUF file may be written there: new, or (with force) an earlier GGUF file."""
    path = Path(path)
    if path.is_dir():
        raise GptlabError(f"OUT {path} is a folder; pass the path of the .gguf file to write, e.g. {path / 'model.gguf'}")
    if path.exists() or path.is_symlink():
        with open(path, "rb") as handle:
            is_gguf = handle.read(4) == MAGIC
        if not is_gguf:
            raise GptlabError(f"OUT {path} exists and is not a GGUF file; pass a new path (it is never overwritten)")
        if not force:
            raise GptlabError(f"OUT {path} holds an earlier GGUF file; pass --force to replace it")
    return path


def _model_metadata(writer, config: ModelConfig, architecture: str) -> None:
    writer.add_context_length(config.block_size)
    writer.add_embedding_length(config.n_embd)
    writer.add_block_count(config.n_layer)
    writer.add_head_count(config.n_head)
    writer.add_head_count_kv(config.kv_heads)
    writer.add_vocab_size(config.vocab_size)
    if architecture == "gpt2":
        writer.add_feed_forward_length(config.hidden_dim)
        writer.add_layer_norm_eps(config.norm_eps)
        return
    writer.add_layer_norm_rms_eps(config.norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    # a Mixtral-style llama reads its experts' width from feed_forward_length; qwen3moe has its own key
    writer.add_feed_forward_length(config.expert_hidden if config.is_moe and architecture == "llama" else config.hidden_dim)
    if config.is_moe:
        writer.add_expert_count(config.moe.n_experts)
        writer.add_expert_used_count(config.moe.top_k)
        if architecture == "qwen3moe":
            writer.add_expert_feed_forward_length(config.expert_hidden)


def write_gguf(model: GPT, tokenizer, path: str | os.PathLike, *, type: str = "f16", force: bool = False) -> Path:
    """Write `model` and `tokenizer` as one GGUF file that llama.cpp (llama-cli, llama-cpp-python) and Ollama load."""
    gguf = gguf_package()
    if type not in GGUF_TYPES:
        raise GptlabError(f"unknown GGUF type {type!r}; use one of {', '.join(GGUF_TYPES)}")
    path = check_gguf_out(path, force=force)
    architecture = gguf_architecture(model)  # every refusal before a byte is written
    check_gguf_tokenizer(tokenizer, model.config.vocab_size)
    tensors = gguf_tensors(model, architecture)
    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[type]
    made_parent = not path.parent.exists()
    try:
        with atomic_path(path) as tmp:
            writer = gguf.GGUFWriter(tmp, architecture)
            try:
                writer.add_name(path.stem)
                writer.add_file_type(file_type)
                writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
                _model_metadata(writer, model.config, architecture)
                write_tokenizer(writer, tokenizer, model.config.vocab_size)
                for name, tensor in tensors.items():
                    array, raw_dtype = encode_tensor(name, tensor, type)
                    writer.add_tensor(name, array, raw_dtype=raw_dtype)
                writer.write_header_to_file()
                writer.write_kv_data_to_file()
                writer.write_tensors_to_file()
            finally:
                writer.close()
    except BaseException:
        if made_parent:  # a folder made for OUT goes too: nothing is left behind
            with contextlib.suppress(OSError):
                path.parent.rmdir()
        raise
    return path


def export_gguf(model: GPT, tokenizer, path: str | os.PathLike, *, type: str = "f16", force: bool = False,
                modelfile: bool = False) -> tuple[Path, Path | None]:
    """write_gguf, and with `modelfile` OUT.Modelfile beside it: both paths are checked before either is written, and a
    GGUF file this call made goes again if the Modelfile cannot be written (a failed export leaves nothing behind)."""
    check_gguf_out(path, force=force)
    if modelfile:
        modelfile_path(path, force=force)
    path = Path(path)
    existed, made_parent = path.exists(), not path.parent.exists()
    out = write_gguf(model, tokenizer, path, type=type, force=force)
    if not modelfile:
        return out, None
    try:
        return out, write_modelfile(out, tokenizer, force=force)
    except BaseException:
        if not existed:
            out.unlink(missing_ok=True)
        if made_parent:
            with contextlib.suppress(OSError):
                out.parent.rmdir()
        raise
