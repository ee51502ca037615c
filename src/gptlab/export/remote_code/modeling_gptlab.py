"""A gptlab model in transformers: the same computation as gptlab.model.gpt, loaded with `trust_remote_code=True`.

    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained("out/base-hf", trust_remote_code=True)

Written by `gptlab export hf` where no transformers class computes the model exactly (rotary or RMSNorm on
GPT-2, ReLU², QK-norm with biases, a logit softcap, sliding-window layers, ...). It imports only torch and
transformers, so the folder loads where gptlab is not installed. Every switch of gptlab's ModelConfig is
computed here as gptlab computes it (configuration_gptlab lists them); the parameter names are gptlab's own:

    transformer.wte / wpe / ln_f, transformer.h.N.{ln_1, attn.c_attn [q | k | v], attn.{q,k}_norm, attn.c_proj,
    ln_2, mlp.c_fc ([gate | up] for swiglu), mlp.c_proj}, lm_head
    sparse layers (moe): transformer.h.N.mlp.{router, experts_fc (E, [gate | up], C), experts_proj (E, C, H),
    route_bias (E,), shared.c_fc, shared.c_proj}

`generate()` keeps past keys and values in a transformers DynamicCache (all positions: sliding-window layers
mask the old ones, as gptlab does). Left-padded batches take the 2D attention_mask and position_ids that
`generate` passes: each row counts positions from its first real token.
"""

import math

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_gptlab import GptlabConfig

TRANSFORMERS_MAJOR = int(transformers.__version__.split(".")[0])
# transformers 5.24 renamed the cache `past_key_values` -> `cache`, in the outputs and in what generate() passes
CACHE_FIELD = "cache" if "cache" in getattr(CausalLMOutputWithPast, "__dataclass_fields__", {}) else "past_key_values"


class GptlabRMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, computed in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


def make_norm(config: GptlabConfig, dim: int) -> nn.Module:
    if config.kind("norm") == "layer":
        return nn.LayerNorm(dim, eps=config.norm_eps, bias=config.bias)
    return GptlabRMSNorm(dim, config.norm_eps)


def rotary(config: GptlabConfig, positions: torch.Tensor) -> tuple:
    """cos, sin (B|1, 1, T, head_dim) of each position: angle = position * theta^(-2i/head_dim), halves repeated."""
    dim = config.head_dim
    inverse = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim))
    angles = positions.float()[..., None] * inverse  # (B|1, T, dim / 2)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos()[:, None], angles.sin()[:, None]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, D) in the rotate-half form x*cos + (-x2, x1)*sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def sliding_window_mask(mask: torch.Tensor, window: int) -> torch.Tensor:
    """Keep, for each query, only the last `window` keys its mask allows: [1 1 1 0] with window 2 -> [0 1 1 0]."""
    allowed_from_here = mask.flip(-1).cumsum(-1).flip(-1)
    return mask & (allowed_from_here <= window)


class GptlabAttention(nn.Module):
    def __init__(self, config: GptlabConfig, layer: int) -> None:
        super().__init__()
        self.config, self.layer = config, layer
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.kv_heads, config.head_dim
        qkv_bias = config.bias or config.qkv_bias  # Qwen2: biases on q, k, v alone
        self.c_attn = nn.Linear(config.n_embd, (self.n_head + 2 * self.n_kv_head) * self.head_dim, bias=qkv_bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.c_proj.residual = True  # initialised / sqrt(2 n_layer)
        if config.qk_norm:
            self.q_norm = GptlabRMSNorm(self.head_dim, config.norm_eps)
            self.k_norm = GptlabRMSNorm(self.head_dim, config.norm_eps)

    def forward(self, x: torch.Tensor, rotation, cache: Cache | None, mask: torch.Tensor | None) -> torch.Tensor:
        B, T, C = x.shape
        sizes = [self.n_head * self.head_dim, self.n_kv_head * self.head_dim, self.n_kv_head * self.head_dim]
        q, k, v = self.c_attn(x).split(sizes, dim=-1)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, n_head, T, head_dim)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, n_kv_head, T, head_dim)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        if self.config.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if rotation is not None:
            q, k = apply_rotary(q, *rotation), apply_rotary(k, *rotation)
        if cache is not None:
            k, v = cache.update(k, v, self.layer)  # every key so far: (B, n_kv_head, S, head_dim)
        if self.n_kv_head != self.n_head:  # each kv head serves n_head / n_kv_head query heads
            repeat = self.n_head // self.n_kv_head
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        dropout = self.config.dropout if self.training else 0.0
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class GptlabMLP(nn.Module):
    """gelu: GELU(x W_fc) W_proj; swiglu: (SiLU(x W_gate) * x W_up) W_proj, gate and up fused in c_fc; relu2: relu(x W_fc)^2 W_proj."""

    def __init__(self, config: GptlabConfig, hidden: int | None = None, bias: bool | None = None) -> None:
        super().__init__()
        self.activation, hidden = config.kind("activation"), hidden or config.hidden_dim
        bias = config.bias if bias is None else bias
        self.c_fc = nn.Linear(config.n_embd, 2 * hidden if self.activation == "swiglu" else hidden, bias=bias)
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=bias)
        self.c_proj.residual = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(activate(self.activation, self.c_fc(x)))


def activate(activation: str, h: torch.Tensor) -> torch.Tensor:
    """swiglu: SiLU(gate) * up of the [gate | up] halves; relu2: relu(h)^2; gelu: GELU (tanh)."""
    if activation == "swiglu":
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up
    if activation == "relu2":
        return F.relu(h).square()
    return F.gelu(h, approximate="tanh")


class GptlabMoE(nn.Module):
    """A mixture of experts, as gptlab.model.moe computes it, one expert at a time.

    scores = softmax or sigmoid(router(x)); each token takes its top_k experts by score + route_bias (the bias picks,
    never weighs); weights = the picked scores, renormalised if moe["normalize"]; with capacity_factor > 0, in training, an
    expert keeps only its first ceil(factor * tokens * top_k / n_experts) assignments in token order (evaluation and
    generation drop nothing, as in gptlab); shared experts see every token."""

    def __init__(self, config: GptlabConfig) -> None:
        super().__init__()
        self.moe, self.activation, hidden = config.moe, config.kind("activation"), config.expert_hidden
        n_experts = self.moe["n_experts"]
        self.router = nn.Linear(config.n_embd, n_experts, bias=False)
        rows = 2 * hidden if self.activation == "swiglu" else hidden
        self.experts_fc = nn.Parameter(torch.empty(n_experts, rows, config.n_embd))
        self.experts_proj = nn.Parameter(torch.empty(n_experts, config.n_embd, hidden))
        self.register_buffer("route_bias", torch.zeros(n_experts))
        self.shared = GptlabMLP(config, self.moe["n_shared"] * hidden, bias=False) if self.moe["n_shared"] else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # (N, C)
        logits = self.router(flat).float()
        scores = logits.softmax(-1) if self.moe["score"] == "softmax" else logits.sigmoid()
        chosen = (scores + self.route_bias).topk(self.moe["top_k"], dim=-1).indices  # (N, top_k)
        weights = scores.gather(-1, chosen)
        if self.moe["normalize"]:
            weights = weights / weights.sum(-1, keepdim=True)
        capacity = flat.shape[0] * self.moe["top_k"]
        if self.moe["capacity_factor"] and self.training:
            capacity = math.ceil(self.moe["capacity_factor"] * capacity / self.moe["n_experts"])
        y = torch.zeros_like(flat)
        for expert in range(self.moe["n_experts"]):
            token, slot = (chosen == expert).nonzero(as_tuple=True)  # in token order
            token, slot = token[:capacity], slot[:capacity]
            h = activate(self.activation, flat[token] @ self.experts_fc[expert].t()) @ self.experts_proj[expert].t()
            y.index_add_(0, token, (h * weights[token, slot, None]).to(flat.dtype))
        if self.shared is not None:
            y = y + self.shared(flat)
        return y.view(x.shape)


class GptlabBlock(nn.Module):
    def __init__(self, config: GptlabConfig, layer: int) -> None:
        super().__init__()
        self.ln_1 = make_norm(config, config.n_embd)
        self.attn = GptlabAttention(config, layer)
        self.ln_2 = make_norm(config, config.n_embd)
        self.mlp = GptlabMoE(config) if config.sparse_layers[layer] else GptlabMLP(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x, rotation, cache, mask):
        x = x + self.dropout(self.attn(self.ln_1(x), rotation, cache, mask))
        return x + self.dropout(self.mlp(self.ln_2(x)))


class GptlabPreTrainedModel(PreTrainedModel):
    config_class = GptlabConfig
    base_model_prefix = "transformer"
    _no_split_modules = ["GptlabBlock"]
    _supports_cache_class = True  # transformers 4.x: past_key_values is a Cache

    def _init_weights(self, module: nn.Module) -> None:
        """gptlab's initialisation (N(0, 0.02), residual projections / sqrt(2 n_layer), biases 0, norms 1), for a
        model built from a config; loaded weights (marked by transformers) are left alone."""
        for name, parameter in module.named_parameters(recurse=False):
            if getattr(parameter, "_is_hf_initialized", False):
                continue
            with torch.no_grad():
                if isinstance(module, (nn.LayerNorm, GptlabRMSNorm)):
                    parameter.fill_(1.0 if name == "weight" else 0.0)
                elif name == "bias":
                    parameter.zero_()
                elif getattr(module, "residual", False) or name == "experts_proj":  # two residual adds per block (GPT-2); zero_init: identity blocks
                    parameter.normal_(0.0, 0.02 / math.sqrt(2 * self.config.n_layer)).mul_(0.0 if self.config.zero_init else 1.0)
                else:
                    parameter.normal_(0.0, 0.02)


class GptlabForCausalLM(GptlabPreTrainedModel, GenerationMixin):
    # transformers 5 maps the tied parameter to its source; 4.x lists it and ties through get_output_embeddings
    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"} if TRANSFORMERS_MAJOR >= 5 else ["lm_head.weight"]

    def __init__(self, config: GptlabConfig) -> None:
        super().__init__(config)
        parts = {"wte": nn.Embedding(config.vocab_size, config.n_embd), "drop": nn.Dropout(config.dropout),
                 "h": nn.ModuleList(GptlabBlock(config, layer) for layer in range(config.n_layer)),
                 "ln_f": make_norm(config, config.n_embd)}
        if config.kind("position") == "learned":
            parts["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        self.transformer = nn.ModuleDict(parts)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.transformer["wte"]

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.transformer["wte"] = value

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.lm_head = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, inputs_embeds=None,
                labels=None, use_cache=None, logits_to_keep=0, return_dict=None, cache=None, **kwargs) -> CausalLMOutputWithPast:
        """Logits (B, T, vocab_size) of input_ids (B, T); with labels, the mean next-token cross-entropy (labels shifted here)."""
        past_key_values = cache if past_key_values is None else past_key_values  # either name (CACHE_FIELD)
        x = self.transformer["wte"](input_ids) if inputs_embeds is None else inputs_embeds
        B, T = x.shape[:2]
        use_cache = use_cache if use_cache is not None else (getattr(self.config, "use_cache", True) and not self.training)
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        start = past_key_values.get_seq_length() if past_key_values is not None else 0
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of {start + T} tokens is longer than the context ({self.config.block_size})")
        if position_ids is None:
            position_ids = torch.arange(start, start + T, device=x.device)[None]
        rotation = None
        if self.config.kind("position") == "learned":
            x = x + self.transformer["wpe"](position_ids)
        else:
            rotation = rotary(self.config, position_ids)
        x = self.transformer["drop"](x)
        masks = self._layer_masks(attention_mask, B, T, start + T, x.device)
        for block, mask in zip(self.transformer["h"], masks):
            x = block(x, rotation, past_key_values, mask)
        x = self.transformer["ln_f"](x)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        logits = self.lm_head(x)
        if self.config.logit_softcap:
            cap = self.config.logit_softcap
            logits = cap * torch.tanh(logits / cap)  # smoothly bounded to (-cap, cap) (Gemma 2)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1).to(logits.device))
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: past_key_values if use_cache else None})

    def _layer_masks(self, attention_mask, B: int, T: int, S: int, device) -> list:
        """Per layer, a bool mask (B|1, 1, T, S), True = may attend, or None for plain causal attention.

        The T queries are the last T of S positions. Padded keys (attention_mask 0) are hidden, and a padded
        query sees itself, since a row with no key gives NaN. Sliding-window layers keep each query's last
        attn_window allowed keys; a window that covers all S keys cuts nothing."""
        padded = attention_mask is not None and not bool(attention_mask.all())
        windows = [0 < window < S for window in self.config.layer_windows]
        if not padded and S == T and not any(windows):
            return [None] * len(windows)
        mask = torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T)[None, None]  # (1, 1, T, S)
        if padded:
            keys = attention_mask[:, -S:].to(device=device, dtype=torch.bool)  # (B, S)
            diagonal = torch.arange(S, device=device)[None, :] == torch.arange(S - T, S, device=device)[:, None]  # (T, S)
            mask = (mask & keys[:, None, None, :]) | diagonal[None, None]
        full = None if S == T and not padded else mask
        windowed = sliding_window_mask(mask, self.config.attn_window) if any(windows) else None
        return [windowed if short else full for short in windows]
