"""Model configuration and presets.

One dataclass covers both families:

- GPT-2: learned positions, LayerNorm with bias, GELU (tanh), fused qkv, tied embeddings.
- Llama-style ("modern"): RMSNorm, rotary embeddings, SwiGLU, no biases, grouped-query
  attention (`n_kv_head`), optional QK-norm, untied embeddings. Qwen2 is this with biases on
  the query, key and value projections only (`qkv_bias`).

`arch` picks the family's defaults; the switches below override one part each, so every
choice can be measured alone: `position`, `norm` and `activation` ("" = the arch's own),
`qk_norm`, `tie_embeddings`, `logit_softcap`, `zero_init`, `bigram_vocab`, and sliding-window attention
(`attn_window` with `window_pattern`). Their defaults are the families as they were.
`attention` and `norm_impl` choose how attention and RMSNorm are computed (gptlab.kernels), not what:
every choice gives the same numbers. `moe` (MoEConfig) makes feed-forward layers sparse: a mixture of experts
(gptlab.model.moe); its default, n_experts 0, is the dense model.

Presets are functions of no arguments returning a config; `preset(name)` looks them up.
Not here: the layers (gptlab.model.gpt).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from gptlab.runtime import GptlabError

ARCHITECTURES = ("gpt2", "llama")
# What "" means for each switch, per arch.
ARCH_DEFAULTS = {
    "gpt2": {"position": "learned", "norm": "layer", "activation": "gelu"},
    "llama": {"position": "rotary", "norm": "rms", "activation": "swiglu"},
}
CHOICES = {"position": ("learned", "rotary"), "norm": ("layer", "rms"), "activation": ("gelu", "swiglu", "relu2")}
# How attention and RMSNorm are computed: the same numbers (tests/kernels), other speed and memory.
ATTENTIONS = ("sdpa", "math", "flash", "triton")
NORM_IMPLS = ("torch", "triton")
ROUTER_SCORES = ("softmax", "sigmoid")
MOE_IMPLS = ("grouped", "loop")


@dataclass(frozen=True, kw_only=True)
class MoEConfig:
    """Sparse feed-forward layers (gptlab.model.moe): each token goes to top_k of n_experts small MLPs.

    Top-k softmax routing with renormalised weights is Mixtral's and Qwen3-MoE's; sigmoid scores with a bias
    update and no auxiliary loss are DeepSeek-V3's; shared experts are DeepSeekMoE's; capacity is Switch's."""

    n_experts: int = 0  # routed experts per sparse layer (0: a dense model, the default)
    top_k: int = 2  # experts each token is sent to
    expert_hidden: int = 0  # hidden width of each expert (0: the dense MLP's, mlp_hidden); smaller = fine-grained
    n_shared: int = 0  # shared experts every token also passes through, expert_hidden wide each (DeepSeekMoE)
    first_dense: int = 0  # the first layers keep a dense MLP (DeepSeek-V3: 3)
    every: int = 1  # after them, every k-th layer is sparse, the others dense (Switch, GShard: 2)
    score: str = "softmax"  # router scores: softmax over experts (Mixtral, Qwen3-MoE) | sigmoid per expert (DeepSeek-V3)
    normalize: bool = True  # the top_k weights are rescaled to sum to 1 (Mixtral; Qwen3-MoE's norm_topk_prob)
    aux_loss: float = 0.01  # load-balance loss coefficient (Switch: n_experts * sum_i f_i P_i, 1.0 when balanced); 0 off
    z_loss: float = 0.0  # router z-loss coefficient (ST-MoE: mean logsumexp(router logits)^2); 0 off
    bias_update: float = 0.0  # DeepSeek-V3 balancing without a loss: each step an expert's routing bias moves by this
    capacity_factor: float = 0.0  # > 0: an expert takes at most factor * tokens * top_k / n_experts, the rest are dropped; 0: dropless
    impl: str = "grouped"  # grouped: tokens sorted by expert, one grouped matmul | loop: a per-expert loop (the reference)

    def __post_init__(self) -> None:
        for name in ("n_experts", "n_shared", "expert_hidden", "first_dense"):
            if getattr(self, name) < 0:
                raise GptlabError(f"moe.{name} must be 0 or more, got {getattr(self, name)}")
        if not self.n_experts:  # a dense model: a setting of its experts would be silently ignored
            unused = [f.name for f in fields(self) if f.name != "n_experts" and getattr(self, f.name) != f.default]
            if unused:
                name = unused[0]
                raise GptlabError(f"moe.{name} {getattr(self, name)} does nothing in a dense model (moe.n_experts 0): set "
                                  f"--model.moe.n-experts N for a mixture of experts, or leave out --model.moe.{name.replace('_', '-')}")
        if self.n_experts and not 1 <= self.top_k <= self.n_experts:
            raise GptlabError(f"moe.top_k must be between 1 and moe.n_experts ({self.n_experts}), got {self.top_k}")
        if self.every < 1:
            raise GptlabError(f"moe.every must be at least 1 (every layer sparse), got {self.every}")
        if self.score not in ROUTER_SCORES:
            raise GptlabError(f"unknown moe.score {self.score!r}; use one of {', '.join(ROUTER_SCORES)}")
        if self.impl not in MOE_IMPLS:
            raise GptlabError(f"unknown moe.impl {self.impl!r}; use one of {', '.join(MOE_IMPLS)}")
        for name in ("aux_loss", "z_loss", "bias_update", "capacity_factor"):
            if not 0.0 <= getattr(self, name) < float("inf"):
                raise GptlabError(f"moe.{name} must be 0 (off) or a positive number, got {getattr(self, name)}")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    arch: str = "gpt2"  # "gpt2" or "llama"
    vocab_size: int = 50257  # ids the tokenizer can produce
    pad_vocab_to: int = 64  # embedding/logit rows are padded to a multiple of this (50257 -> 50304)
    block_size: int = 1024  # context length (T max)
    n_layer: int = 12  # transformer blocks
    n_head: int = 12  # attention heads per block
    n_kv_head: int | None = None  # grouped-query attention: heads sharing each key/value head (None = n_head)
    n_embd: int = 768  # width of the residual stream
    mlp_hidden: int | None = None  # None: 4 * n_embd (gpt2), or 8/3 * n_embd rounded up to 64 (llama SwiGLU)
    bias: bool = True  # biases in linear layers and LayerNorm (GPT-2: yes; llama: no)
    qkv_bias: bool = False  # biases on the fused q, k, v projection alone, even with bias False (Qwen2)
    tie_embeddings: bool = True  # the output layer shares the token embedding table
    norm_eps: float = 1e-5  # epsilon of LayerNorm / RMSNorm
    rope_theta: float = 10000.0  # llama: rotary base
    qk_norm: bool = False  # llama: RMSNorm on queries and keys per head
    dropout: float = 0.0  # on attention weights and residual branches (training only)
    position: str = ""  # learned | rotary ("" = the arch's: gpt2 learned, llama rotary)
    norm: str = ""  # layer (LayerNorm) | rms (RMSNorm) ("" = the arch's: gpt2 layer, llama rms)
    activation: str = ""  # gelu | swiglu | relu2 = relu(x)^2, not gated ("" = the arch's: gpt2 gelu, llama swiglu)
    logit_softcap: float = 0.0  # > 0: logits = cap * tanh(logits / cap) (Gemma 2; nanochat uses 15); 0 = off
    zero_init: bool = False  # attention and MLP output projections start at zero: each block starts as the identity
    bigram_vocab: int = 0  # > 0: rows of a hashed (previous token, token) table added to the token embedding; 0 = off
    attn_window: int = 0  # S layers attend to the last attn_window positions, themselves included (0: no S layers)
    window_pattern: str = "L"  # S (sliding window) / L (full context) cycled over layers, e.g. SSSL; last layer always L
    # sdpa: F.scaled_dot_product_attention | math: softmax(q k^T / sqrt(d)) v spelled out | flash: FlashAttention-2
    # in PyTorch | triton: FlashAttention-2 Triton kernels. flash and triton compute the causal calls, windowed or
    # not (training, scoring, a prefill into an empty cache); calls with a mask (decoding, padding) use sdpa.
    # triton here and below: where its kernels cannot run (a CPU without TRITON_INTERPRET=1), the PyTorch path runs.
    attention: str = "sdpa"
    norm_impl: str = "torch"  # RMSNorm: torch (F.rms_norm) | triton (fused kernel, gptlab.kernels.triton_rmsnorm)
    moe: MoEConfig = field(default_factory=MoEConfig)  # mixture of experts: sparse feed-forward layers (dense by default)

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise GptlabError(f"unknown arch {self.arch!r}; use one of {', '.join(ARCHITECTURES)}")
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in ("", *allowed):
                raise GptlabError(f"unknown {name} {getattr(self, name)!r}; use one of {', '.join(allowed)} "
                                  f"(or '' for the arch's own)")
        for name in ("vocab_size", "pad_vocab_to", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise GptlabError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise GptlabError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.n_head % self.kv_heads:
            raise GptlabError(f"n_head={self.n_head} is not divisible by n_kv_head={self.n_kv_head}")
        if self.position_kind == "rotary" and self.head_dim % 2:
            raise GptlabError(f"rotary embeddings need an even head_dim, got {self.head_dim}")
        if not 0.0 <= self.dropout < 1.0:
            raise GptlabError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.bigram_vocab < 0 or self.bigram_vocab == 1:
            raise GptlabError(f"bigram_vocab must be 0 (off) or at least 2 rows, got {self.bigram_vocab}")
        if not 0.0 <= self.logit_softcap < float("inf"):
            raise GptlabError(f"logit_softcap must be 0 (off) or a positive number, got {self.logit_softcap}")
        self._check_window()
        self._check_kernels()
        if isinstance(self.moe, dict):  # from a JSON snapshot (config.json)
            object.__setattr__(self, "moe", MoEConfig(**self.moe))
        if self.moe.n_experts and not any(self.sparse_layers):
            raise GptlabError(f"moe.first_dense={self.moe.first_dense} leaves no sparse layer in {self.n_layer}; "
                              f"set it below n_layer")

    def _check_window(self) -> None:
        if self.attn_window < 0:
            raise GptlabError(f"attn_window must be 0 (off) or a number of positions, got {self.attn_window}")
        if not self.window_pattern or set(self.window_pattern) - {"S", "L"}:
            raise GptlabError(f"window_pattern must be a string of S (sliding window) and L (full context) "
                              f"layers such as SSSL, got {self.window_pattern!r}")
        if "S" in self.window_pattern and self.attn_window == 0:
            raise GptlabError(f"window_pattern {self.window_pattern!r} has sliding-window (S) layers but attn_window is 0; "
                              f"set --model.attn-window to the positions an S layer sees, or use --model.window-pattern L")

    def _check_kernels(self) -> None:
        if self.attention not in ATTENTIONS:
            raise GptlabError(f"unknown attention {self.attention!r}; use one of {', '.join(ATTENTIONS)}")
        if self.norm_impl not in NORM_IMPLS:
            raise GptlabError(f"unknown norm_impl {self.norm_impl!r}; use one of {', '.join(NORM_IMPLS)}")
        if self.attention in ("flash", "triton") and self.dropout > 0:
            raise GptlabError(f"attention {self.attention!r} has no attention dropout, got dropout {self.dropout}; "
                              f"set dropout 0 or attention sdpa")
        if self.norm_impl == "triton" and self.norm_kind != "rms" and not self.qk_norm:
            raise GptlabError(f"norm_impl 'triton' fuses RMSNorm, and this model has none (norm {self.norm_kind!r}); "
                              f"set norm rms or qk_norm, or norm_impl torch")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def padded_vocab_size(self) -> int:
        return -(-self.vocab_size // self.pad_vocab_to) * self.pad_vocab_to

    @property
    def hidden_dim(self) -> int:
        """4 * n_embd; SwiGLU 8/3 * n_embd rounded up to 64, so its three matrices cost about what two would."""
        if self.mlp_hidden:
            return self.mlp_hidden
        if not self.gated:
            return 4 * self.n_embd
        return -(-(8 * self.n_embd // 3) // 64) * 64

    @property
    def is_moe(self) -> bool:
        return self.moe.n_experts > 0

    @property
    def sparse_layers(self) -> tuple[bool, ...]:
        """Per layer, whether its feed-forward is a mixture of experts: the layers from moe.first_dense on, every
        moe.every-th of them (n_layer 6, first_dense 1, every 2 -> F F T F T F). All False for a dense model."""
        moe = self.moe
        return tuple(bool(moe.n_experts) and layer >= moe.first_dense and (layer - moe.first_dense + 1) % moe.every == 0
                     for layer in range(self.n_layer))

    @property
    def expert_hidden(self) -> int:
        """Hidden width of one expert: moe.expert_hidden, or the dense MLP's."""
        return self.moe.expert_hidden or self.hidden_dim

    @property
    def position_kind(self) -> str:
        return self.position or ARCH_DEFAULTS[self.arch]["position"]

    @property
    def norm_kind(self) -> str:
        return self.norm or ARCH_DEFAULTS[self.arch]["norm"]

    @property
    def activation_kind(self) -> str:
        return self.activation or ARCH_DEFAULTS[self.arch]["activation"]

    @property
    def gated(self) -> bool:
        """The MLP has a gate and an up projection (SwiGLU), fused in c_fc: twice the rows."""
        return self.activation_kind == "swiglu"

    @property
    def layer_windows(self) -> tuple[int, ...]:
        """Per layer, the positions its attention sees: attn_window for S layers, 0 (everything) for L.

        The pattern is cycled over the layers and the last layer is always L (nanochat):
        n_layer 6, "SSL" -> (w, w, 0, w, w, 0); n_layer 5 -> (w, w, 0, w, 0).
        """
        pattern = self.window_pattern
        windows = [self.attn_window if pattern[layer % len(pattern)] == "S" else 0 for layer in range(self.n_layer)]
        windows[-1] = 0
        return tuple(windows)


# ---------------------------------------------------------------- presets


def _gpt2(n_layer: int, n_head: int, n_embd: int) -> ModelConfig:
    return ModelConfig(arch="gpt2", n_layer=n_layer, n_head=n_head, n_embd=n_embd)


def _llama(n_layer: int, n_head: int, n_kv_head: int, n_embd: int, block_size: int = 1024) -> ModelConfig:
    return ModelConfig(
        arch="llama", n_layer=n_layer, n_head=n_head, n_kv_head=n_kv_head, n_embd=n_embd, block_size=block_size,
        bias=False, tie_embeddings=False, norm_eps=1e-5, qk_norm=False,
    )


PRESETS = {
    "gpt2": lambda: _gpt2(12, 12, 768),
    "gpt2-medium": lambda: _gpt2(24, 16, 1024),
    "gpt2-large": lambda: _gpt2(36, 20, 1280),
    "gpt2-xl": lambda: _gpt2(48, 25, 1600),
    # Small sizes for a laptop CPU (demos) and for tests.
    "gpt2-mini": lambda: ModelConfig(arch="gpt2", n_layer=4, n_head=4, n_embd=128, block_size=256),
    "gpt2-tiny": lambda: ModelConfig(arch="gpt2", n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=512),
    "llama-mini": lambda: _llama(4, 4, 2, 128, block_size=256),
    "llama-tiny": lambda: replace(_llama(2, 4, 2, 32, block_size=64), vocab_size=512),
    "llama-124m": lambda: _llama(12, 12, 4, 768),
    # Mixture of experts: the llama shapes with 8 (4) experts, 2 per token, each half the dense width: the same active size.
    "moe-mini": lambda: replace(_llama(4, 4, 2, 128, block_size=256), moe=MoEConfig(n_experts=8, top_k=2, expert_hidden=192)),
    "moe-tiny": lambda: replace(_llama(2, 4, 2, 32, block_size=64), vocab_size=512,
                                moe=MoEConfig(n_experts=4, top_k=2, expert_hidden=64)),
}


def preset(name: str, **overrides) -> ModelConfig:
    """A preset config, optionally with fields replaced (`preset("gpt2-mini", vocab_size=4096)`)."""
    if name not in PRESETS:
        raise GptlabError(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}")
    try:
        return replace(PRESETS[name](), **overrides)
    except TypeError as error:
        raise GptlabError(f"bad override for preset {name!r}: {error}") from None
