"""Model configuration and presets.

One dataclass covers both families:

- GPT-2: learned positions, LayerNorm with bias, GELU (tanh), fused qkv, tied embeddings.
- Llama-style ("modern"): RMSNorm, rotary embeddings, SwiGLU, no biases, grouped-query
  attention (`n_kv_head`), optional QK-norm, untied embeddings.

Presets are functions of no arguments returning a config; `preset(name)` looks them up.
Not here: the layers (gptlab.model.gpt).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gptlab.runtime import GptlabError

ARCHITECTURES = ("gpt2", "llama")


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
    tie_embeddings: bool = True  # the output layer shares the token embedding table
    norm_eps: float = 1e-5  # epsilon of LayerNorm / RMSNorm
    rope_theta: float = 10000.0  # llama: rotary base
    qk_norm: bool = False  # llama: RMSNorm on queries and keys per head
    dropout: float = 0.0  # on attention weights and residual branches (training only)

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise GptlabError(f"unknown arch {self.arch!r}; use one of {', '.join(ARCHITECTURES)}")
        for name in ("vocab_size", "pad_vocab_to", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise GptlabError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise GptlabError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.n_head % self.kv_heads:
            raise GptlabError(f"n_head={self.n_head} is not divisible by n_kv_head={self.n_kv_head}")
        if self.arch == "llama" and self.head_dim % 2:
            raise GptlabError(f"rotary embeddings need an even head_dim, got {self.head_dim}")
        if not 0.0 <= self.dropout < 1.0:
            raise GptlabError(f"dropout must be in [0, 1), got {self.dropout}")

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
        if self.mlp_hidden:
            return self.mlp_hidden
        if self.arch == "gpt2":
            return 4 * self.n_embd
        return -(-(8 * self.n_embd // 3) // 64) * 64


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
}


def preset(name: str, **overrides) -> ModelConfig:
    """A preset config, optionally with fields replaced (`preset("gpt2-mini", vocab_size=4096)`)."""
    if name not in PRESETS:
        raise GptlabError(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}")
    try:
        return replace(PRESETS[name](), **overrides)
    except TypeError as error:
        raise GptlabError(f"bad override for preset {name!r}: {error}") from None
