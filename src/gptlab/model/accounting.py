"""Counting a model on paper: parameters, FLOPs per token, MFU, training memory, all from a ModelConfig.

Nothing is built: every figure is a formula of the config (the tests check the
parameter counts against a built `GPT`). Symbols: d = n_embd, L = n_layer,
a = n_head, k = kv heads, h_d = head_dim, F = MLP hidden width, V = vocab_size,
V' = padded vocab, T = seq_len, B = batch size.

    params     wte V'd (+ wpe T_max d for learned positions) + L * block + final norm (+ lm_head V'd if untied)
    FLOPs      6N + 12 L d T per trained token (PaLM, Chowdhery et al. 2022, appendix B; nanoGPT estimate_mfu),
               a sliding-window layer counting min(T, window) keys per query instead of T
    memory     parameters + gradients + optimizer moments + activations (Korthikanti et al. 2022;
               with activation checkpointing, the blocks' inputs + one block's)
               + autocast weight copies + logits + the loss's gradients (the fused loss: one chunk's
               logits + the input and head gradients it makes in its forward)

A mixture of experts (config.moe) is counted twice: total, every expert stored (what memory, gradients and
AdamW state pay for: parameter_memory), and active, what one token multiplies (router + top_k routed experts +
shared experts + everything dense: what the FLOPs, MFU and `--count active` use).

Not here: measuring anything (gptlab.train.metrics reports measured throughput; gptlab.train.profile
puts these figures beside measured ones).
"""

from __future__ import annotations

import torch

from gptlab.model.config import ModelConfig
from gptlab.model.loss import chunk_rows
from gptlab.runtime import GptlabError

# Peak dense matmul throughput, FLOP/s, in the precision training uses (bf16 on GPUs).
PEAK_FLOPS = {
    "a100": 312e12,  # A100 SXM/PCIe, bf16 tensor cores, dense (NVIDIA A100 datasheet)
    "h100": 989e12,  # H100 SXM, bf16 tensor cores, dense (NVIDIA H100 datasheet: 1979 with sparsity)
    "h200": 989e12,  # H200 SXM: the H100's compute with more memory (NVIDIA H200 datasheet)
    # A rough order of magnitude for a desktop CPU in fp32: 16 cores x 32 FLOP/cycle (two AVX2 FMA units)
    # x 2 GHz. A laptop gets less; pass a measured peak (a number) for an MFU that means something.
    "cpu": 1e12,
}

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
OPTIMIZER_STATES = {"adamw": 2, "sgd": 1, "none": 0}  # tensors of the parameters' size: AdamW m and v, SGD momentum


def param_counts(config: ModelConfig) -> dict[str, int]:
    """Parameters by formula: total (tied weights once), embeddings (wte with its padded rows, wpe), non-embedding,
    and for a mixture of experts what one token uses (active) beside what is stored (total).

    Per block: two norms (LayerNorm d weights + d biases where `config.bias`, RMSNorm d), c_attn d(a + 2k)h_d,
    c_proj d^2, c_fc dF (2dF for SwiGLU: gate and up), c_proj Fd, with biases where `config.bias` (c_attn's also where `qkv_bias`);
    QK-norm adds 2 h_d. Rotary positions have no table, learned ones wpe; a bigram table is bigram_vocab d.
    Non-embedding = total - wte - wpe - bigram - (lm_head if untied),
    the same split as `GPT.num_params(embeddings=False)`. Example: gpt2 -> 124,475,904 total,
    85,056,000 non-embedding.

    A sparse layer (config.sparse_layers) has, instead of the MLP, a router dE, E routed experts of
    d x 2H + H x d each (SwiGLU; dH + Hd otherwise; no biases) and n_shared experts as one bias-free MLP
    n_shared H wide. A token runs the router, top_k experts and the shared ones: active = total - (E - top_k)
    experts per sparse layer. `experts` counts every routed expert; `per_block` is a dense block's size.
    """
    d = config.n_embd
    norm = d + (d if config.norm_kind == "layer" and config.bias else 0)  # LayerNorm weight (+ bias); RMSNorm weight only
    attention = _attention_params(config)
    dense_block = 2 * norm + attention + _mlp_params(config, config.hidden_dim, config.bias)
    sparse = sum(config.sparse_layers)
    moe = config.moe
    expert = _mlp_params(config, config.expert_hidden, False) if sparse else 0
    shared = _mlp_params(config, moe.n_shared * config.expert_hidden, False) if sparse and moe.n_shared else 0
    sparse_block = 2 * norm + attention + d * moe.n_experts + moe.n_experts * expert + shared
    wte = config.padded_vocab_size * d
    wpe = config.block_size * d if config.position_kind == "learned" else 0
    lm_head = 0 if config.tie_embeddings else config.padded_vocab_size * d
    bigram = config.bigram_vocab * d  # a lookup table, as wte
    non_embedding = (config.n_layer - sparse) * dense_block + sparse * sparse_block + norm
    idle = sparse * (moe.n_experts - moe.top_k) * expert  # routed experts a token does not visit
    return {
        "total": non_embedding + wte + wpe + lm_head + bigram,
        "embeddings": wte + wpe + lm_head + bigram,
        "non_embedding": non_embedding,
        "wte": wte,
        "wpe": wpe,
        "lm_head": lm_head,
        "bigram": bigram,
        "per_block": dense_block,
        "active": non_embedding + wte + wpe + lm_head + bigram - idle,
        "active_non_embedding": non_embedding - idle,
        "experts": sparse * moe.n_experts * expert,
        "routers": sparse * d * moe.n_experts,
        "shared_experts": sparse * shared,
    }


def _attention_params(config: ModelConfig) -> int:
    """c_attn (with q, k, v biases where `bias` or `qkv_bias`) + c_proj (+ bias) + QK-norm's two weights."""
    d, bias = config.n_embd, 1 if config.bias else 0
    qkv_out = (config.n_head + 2 * config.kv_heads) * config.head_dim
    qkv_bias = 1 if config.bias or config.qkv_bias else 0  # Qwen2: biases on q, k, v alone
    return d * qkv_out + qkv_bias * qkv_out + d * d + bias * d + (2 * config.head_dim if config.qk_norm else 0)


def _mlp_params(config: ModelConfig, hidden: int, bias: bool) -> int:
    """One MLP `hidden` wide: c_fc d x F (2F for SwiGLU: gate and up; gelu and relu2 are not gated), c_proj F x d."""
    fc_out = 2 * hidden if config.gated else hidden
    return config.n_embd * fc_out + hidden * config.n_embd + (fc_out + config.n_embd if bias else 0)


def flops_per_token(config: ModelConfig, seq_len: int | None = None) -> dict[str, int]:
    """Training and forward FLOPs per token at context `seq_len` (default: block_size).

    The PaLM convention (Chowdhery et al. 2022, appendix B), as nanoGPT's `estimate_mfu` uses it:

        training = 6 N + 12 L a h_d T     (= 6N + 12 L d T: a h_d = d also with GQA)
        forward  = 2 N + 4 L a h_d T      (one third: the backward pass costs two forwards)

    with L T summed over the layers as sum_l min(T, window_l): a sliding-window layer's queries see
    at most `attn_window` keys, a full layer's T.

    N counts the parameters used in matmuls: non-embedding + the lm_head matrix V'd (computed over
    the padded rows; tied or not). Embedding lookups (wte, wpe) are not matmuls. For tied GPT-2 that is
    nanoGPT's `get_num_params()` (total - wpe). For a mixture of experts N is the active count (param_counts'
    active_non_embedding: the router, top_k routed experts and the shared ones per sparse layer), so 6N is
    what one token costs, not what is stored (`stored_matmul_params`: every matrix). 12 L d T is QK^T and AV over the full T x T square,
    forward and backward, without halving for the causal mask; norms, softmax and the loss are left out.
    """
    seq_len = config.block_size if seq_len is None else seq_len
    if seq_len < 1:
        raise GptlabError(f"seq_len must be at least 1, got {seq_len}")
    counts = param_counts(config)
    matmul_params = counts["active_non_embedding"] + config.padded_vocab_size * config.n_embd
    keys = sum(min(seq_len, window) if window else seq_len for window in config.layer_windows)  # sum_l T_l
    attention = config.n_head * config.head_dim * keys
    return {
        "seq_len": seq_len,
        "matmul_params": matmul_params,
        "dense": 6 * matmul_params,
        "attention": 12 * attention,
        "training": 6 * matmul_params + 12 * attention,
        "forward": 2 * matmul_params + 4 * attention,
    }


# The parameter count N a scaling law is stated in: Chinchilla counts every parameter (total), Kaplan et al. (2020)
# leave out the embeddings (non_embedding), matmul counts every matrix multiplied, and active the matrices one token
# multiplies (6N FLOPs per token): for a mixture of experts top_k of the experts, for a dense model the same as matmul.
# Fitting dense and MoE runs together under the same FLOP budgets takes active.
PARAM_CONVENTIONS = ("total", "non_embedding", "matmul", "active")


def scaling_params(config: ModelConfig) -> dict[str, int]:
    """N under each convention of PARAM_CONVENTIONS, and the embeddings they differ by.

    Example: gpt2 -> total 124,475,904, non_embedding 85,056,000, matmul = active 123,689,472 (the blocks + the head
    over 50,304 padded rows). moe-tiny: matmul counts all 4 experts of each layer, active the top 2.
    """
    counts = param_counts(config)
    return {"total": counts["total"], "non_embedding": counts["non_embedding"], "matmul": stored_matmul_params(config),
            "active": flops_per_token(config)["matmul_params"], "embeddings": counts["embeddings"]}


def stored_matmul_params(config: ModelConfig) -> int:
    """Every matrix a forward may multiply: non-embedding + the head V'd, all experts included (dense: = active)."""
    return param_counts(config)["non_embedding"] + config.padded_vocab_size * config.n_embd


def count_params(config: ModelConfig, convention: str) -> int:
    """N of `config` under one convention ("total", "non_embedding", "matmul" or "active")."""
    if convention not in PARAM_CONVENTIONS:
        raise GptlabError(f"unknown parameter count {convention!r}; use one of {', '.join(PARAM_CONVENTIONS)}")
    return scaling_params(config)[convention]


def peak_flops(peak: str | float) -> float:
    """FLOP/s from a PEAK_FLOPS name ("h100") or a number (a measured or datasheet peak)."""
    if isinstance(peak, str):
        if peak.lower() in PEAK_FLOPS:
            return PEAK_FLOPS[peak.lower()]
        try:
            peak = float(peak)
        except ValueError:
            raise GptlabError(f"unknown device peak {peak!r}; use one of {', '.join(PEAK_FLOPS)} or a FLOP/s number like 150e12") from None
    if not peak > 0:
        raise GptlabError(f"peak FLOP/s must be positive, got {peak}")
    return float(peak)


def mfu(tokens_per_second: float, config: ModelConfig, seq_len: int | None = None, peak: str | float = "h100") -> float:
    """Model FLOPs utilisation: tokens/s x training FLOPs per token / peak FLOP/s (a fraction, 0.4 = 40%)."""
    return tokens_per_second * flops_per_token(config, seq_len)["training"] / peak_flops(peak)


def tokens_per_second_at(utilisation: float, config: ModelConfig, seq_len: int | None = None, peak: str | float = "h100") -> float:
    """The throughput that reaches a given MFU: utilisation x peak / training FLOPs per token (inverse of `mfu`)."""
    return utilisation * peak_flops(peak) / flops_per_token(config, seq_len)["training"]


def _bytes_per_element(dtype: str | torch.dtype) -> int:
    if isinstance(dtype, torch.dtype):
        return dtype.itemsize
    if dtype not in DTYPE_BYTES:
        raise GptlabError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def activation_bytes_per_layer(
    config: ModelConfig,
    batch_size: int,
    seq_len: int,
    *,
    param_dtype: str | torch.dtype = "fp32",
    amp: str | torch.dtype = "bf16",
    flash_attention: bool = True,
    sparse: bool = False,
) -> int:
    """Bytes one block keeps for backward (`sparse`: a mixture-of-experts block, see _sparse_mlp_bytes), following Korthikanti et al. 2022 ("Reducing Activation
    Recomputation in Large Transformer Models", sec. 4.1) term by term.

    Their GPT block, all in 16 bits, no recomputation: T B d (34 + 5 a T / d) bytes, of which
    attention 11 TBd + 5 a T^2 B, MLP 19 TBd, norms 4 TBd. Here matmul inputs count at the `amp`
    width p (2 for bf16/fp16, 4 for fp32), norm inputs at the residual stream's width r (the
    parameters' dtype: fp32 under autocast), dropout masks at 1 byte, adapted to the config:

        norms      2 inputs (LayerNorm); RMSNorm also keeps its fp32 input   2 TBd r, or 2 TBd (4 + r)
        attention  c_attn input, q k v, c_proj input    5 TBd p   without rotary or GQA (see _attention_widths)
                   softmax out (+ mask + dropout out)   a T^2 B (p (+ 1 + p))   only without flash attention
        MLP        c_fc input, c_fc out, activation out TB (d + F + F) p; SwiGLU: TB (d + 2F + 2F) p
                   (relu2: relu keeps its output, which square reuses, and square's output: also d + F + F)
        dropout    masks after attention and MLP        2 TBd   only when config.dropout > 0

    For GPT-2 in bf16 (r = p = 2) with dropout and math attention this is exactly their 34 + 5aT/d.
    Flash attention keeps no T x T tensor (it recomputes the scores, dropout included), which
    removes the 5aT/d term. Left out: rotary tables, flash's logsumexp and the norms' statistics (a
    few floats per token), and QK-norm's copies of q and k. On CPU, dropout masks are as wide as the activations, SDPA with dropout
    falls back to the math kernel, and the reference attention (`set_attention("math")`) keeps its
    softmax in fp32, so those cases keep more than counted here.
    """
    p, r = _bytes_per_element(amp), _bytes_per_element(param_dtype)
    d, F = config.n_embd, config.hidden_dim
    tokens = batch_size * seq_len
    norms = 2 * tokens * d * (r if config.norm_kind == "layer" else 4 + r)
    attention = tokens * (2 * d + _attention_widths(config)) * p
    if not flash_attention:
        scores = config.n_head * seq_len * seq_len * batch_size
        attention += scores * p + (scores * (1 + p) if config.dropout > 0 else 0)
    widths = 2 * F if config.gated else F  # c_fc out; SwiGLU: gate and up, then silu(gate) and the product
    mlp = _sparse_mlp_bytes(config, tokens, p) if sparse else tokens * (d + 2 * widths) * p
    masks = 2 * tokens * d if config.dropout > 0 else 0
    return norms + attention + mlp + masks


def _sparse_mlp_bytes(config: ModelConfig, tokens: int, p: int) -> int:
    """A mixture of experts keeps its input (d), the router's fp32 logits, scores and their top-k copies (4E x 4 bytes),
    and per assignment (top_k per token, none dropped) the gathered input, expert c_fc out and activation out, the
    expert's output and its weighted copy: 3d + 2 F_e (F_e = 2H for SwiGLU), plus int64 sort and gather indices and
    fp32 weights (28 bytes); shared experts as a bias-free MLP. Measured on moe-tiny: within 1% (tests/model/test_moe_accounting.py)."""
    d, moe, hidden = config.n_embd, config.moe, config.expert_hidden
    widths = 2 * hidden if config.gated else hidden
    shared = moe.n_shared * widths
    return tokens * (d * p + 16 * moe.n_experts + moe.top_k * ((3 * d + 2 * widths) * p + 28) + 2 * shared * p)


def _attention_widths(config: ModelConfig) -> int:
    """Per token, what attention keeps between c_attn and c_proj: the q, k, v that SDPA saves (a h_d = d wide each),
    plus the fused qkv output (a + 2k) h_d while one of them is still a view of it.

    Rotation makes new q and k (the tables multiply them, so the inputs need not be kept); GQA repeats k and v
    into new tensors. Plain: 3d (all views). Rotary: rotated q, k + qkv = 5d. GQA: repeated k, v + qkv
    = 3d + 2 k h_d. Rotary and GQA: rotated q, repeated k, v = 3d, and qkv is not kept at all.
    """
    d, qkv = config.n_embd, (config.n_head + 2 * config.kv_heads) * config.head_dim
    rotary, grouped = config.position_kind == "rotary", config.kv_heads != config.n_head
    new = (d if rotary else 0) + (2 * d if grouped else d if rotary else 0)  # q rotated; k, v repeated (or k rotated)
    return new + (qkv if new < 3 * d else 0)


def training_memory(
    config: ModelConfig,
    batch_size: int,
    seq_len: int | None = None,
    *,
    param_dtype: str | torch.dtype = "fp32",
    amp: str | torch.dtype = "bf16",
    optimizer: str = "adamw",
    flash_attention: bool = True,
    activation_checkpointing: bool = False,
    fused_loss: bool = False,
) -> dict[str, int]:
    """Bytes for one training step of `batch_size` x `seq_len` tokens, by part.

        parameters   P x param bytes (tied weights once)
        gradients    P x param bytes
        optimizer    states x P x param bytes (AdamW: m and v, zeros_like(p): 8 bytes/param in fp32)
        activations  L x activation_bytes_per_layer (Korthikanti et al. 2022, adapted; see there);
                     activation_checkpointing (GPT.set_activation_checkpointing): L x B T d x param bytes
                     (each block's input, the residual stream) + one block's activations, recomputed in its backward
        weight_casts N x amp bytes when amp is narrower than the parameters: autocast's 16-bit copy
                     of every matmul weight (every expert's too: stored_matmul_params), kept until its backward
        logits       B T V x 4: the fp32 log-softmax the loss keeps for backward
        logit_grads  2 B T V x 4: at the start of backward, cross-entropy's gradient and log-softmax's
                     (both fp32) are alive together with the saved log-softmax: the step's peak

    With `fused_loss` (gptlab.model.loss, the Trainer's default) the (B T x V) logits never exist at once:
        logits       one chunk's: rows x V x 4 for its fp32 logits (x 2 with a soft-cap: tanh's slope too),
                     + rows x V x amp bytes for their cast to the matmul dtype when amp is narrower than fp32;
                     rows = min(B T, chunk_rows(V, d))
        logit_grads  the input gradient (B T d) the forward makes and keeps, and its scaled copy at backward's
                     start, in the parameters' dtype: 2 B T d x param bytes, + the head's gradient (V' d x param
                     bytes) the forward keeps until backward copies it into the gradients counted above

    Not counted: the CUDA context and allocator slack, the lm_head output while the caller holds the
    logits, and the embedding activations. The total leans high: at the peak (backward's start) the
    blocks' gradients are not made yet. Measured on CPU (live tensor bytes, gptlab.train.measure),
    gpt2-mini and llama-mini peak at 85-100% of it (tests/train/test_measure.py).
    """
    seq_len = config.block_size if seq_len is None else seq_len
    if batch_size < 1 or seq_len < 1:
        raise GptlabError(f"batch_size and seq_len must be at least 1, got {batch_size} and {seq_len}")
    if optimizer not in OPTIMIZER_STATES:
        raise GptlabError(f"unknown optimizer {optimizer!r}; use one of {', '.join(OPTIMIZER_STATES)}")
    params = param_counts(config)["total"]
    param_bytes, amp_bytes = _bytes_per_element(param_dtype), _bytes_per_element(amp)
    per_layer = [activation_bytes_per_layer(config, batch_size, seq_len, param_dtype=param_dtype, amp=amp,
                                            flash_attention=flash_attention, sparse=sparse) for sparse in config.sparse_layers]
    if activation_checkpointing:
        activations = config.n_layer * batch_size * seq_len * config.n_embd * param_bytes + max(per_layer)
    else:
        activations = sum(per_layer)
    parts = {
        "parameters": params * param_bytes,
        "gradients": params * param_bytes,
        "optimizer": OPTIMIZER_STATES[optimizer] * params * param_bytes,
        "activations": activations,
        "weight_casts": stored_matmul_params(config) * amp_bytes if amp_bytes < param_bytes else 0,
        **_loss_memory(config, batch_size * seq_len, param_bytes, amp_bytes, fused_loss),
    }
    parts["total"] = sum(parts.values())
    return parts


def parameter_memory(config: ModelConfig, *, param_dtype: str | torch.dtype = "fp32", optimizer: str = "adamw") -> dict[str, int]:
    """Bytes each stored parameter costs in training (itself, its gradient, its optimizer states), and that cost for
    the routed experts and for the rest. Every expert is stored and every expert has AdamW state, though a token
    uses top_k of them: a mixture of experts is paid for in memory by its total, in FLOPs by its active count.
    Example: fp32 AdamW -> 16 bytes per parameter (4 weight + 4 gradient + 8 for m and v)."""
    if optimizer not in OPTIMIZER_STATES:
        raise GptlabError(f"unknown optimizer {optimizer!r}; use one of {', '.join(OPTIMIZER_STATES)}")
    counts, width = param_counts(config), _bytes_per_element(param_dtype)
    per_param = (2 + OPTIMIZER_STATES[optimizer]) * width
    return {"per_param": per_param, "optimizer_per_param": OPTIMIZER_STATES[optimizer] * width,
            "experts": counts["experts"] * per_param, "rest": (counts["total"] - counts["experts"]) * per_param,
            "optimizer": OPTIMIZER_STATES[optimizer] * width * counts["total"]}


def _loss_memory(config: ModelConfig, tokens: int, param_bytes: int, amp_bytes: int, fused: bool) -> dict[str, int]:
    """The loss's share of training_memory: the whole logits and their gradients, or the fused loss's (see there)."""
    vocab = config.vocab_size
    if not fused:
        return {"logits": tokens * vocab * 4, "logit_grads": 2 * tokens * vocab * 4}
    rows = min(tokens, chunk_rows(vocab, config.n_embd))
    chunk = rows * vocab * (4 * (2 if config.logit_softcap else 1) + (amp_bytes if amp_bytes < 4 else 0))
    kept = (2 * tokens * config.n_embd + config.padded_vocab_size * config.n_embd) * param_bytes
    return {"logits": chunk, "logit_grads": kept}
