"""The configuration of a gptlab model exported to Hugging Face (loaded with `trust_remote_code=True`).

Shipped inside the export folder beside modeling_gptlab.py; it imports only transformers, so the
machine that loads the folder needs no gptlab. Its fields are gptlab's ModelConfig fields, with the same
names, meanings and defaults (gptlab.model.config), so a folder read back into gptlab is the same model:

    arch            gpt2 | llama: the family whose defaults "" picks for position, norm and activation
    position        learned | rotary (rope_theta)         norm        layer | rms (norm_eps)
    activation      gelu (tanh) | swiglu | relu2          qk_norm     RMSNorm on each head's q and k
    n_kv_head       grouped-query attention (None: n_head)  mlp_hidden  None: 4 n_embd, or 8/3 n_embd to 64 (swiglu)
    logit_softcap   cap * tanh(logits / cap), 0 off         attn_window, window_pattern: sliding-window layers (S/L)
    moe             gptlab's MoEConfig as a dict: n_experts (0: dense), top_k, expert_hidden, n_shared, first_dense,
                    every, score, normalize, capacity_factor (and training-only fields, kept for the way back)

Embedding and logit tables have exactly `vocab_size` rows here (gptlab pads them; the export cuts the pads).
"""

from transformers import PretrainedConfig

# gptlab's MoEConfig defaults: n_experts 0 is a dense model
MOE_DEFAULTS = {"n_experts": 0, "top_k": 2, "expert_hidden": 0, "n_shared": 0, "first_dense": 0, "every": 1, "score": "softmax",
                "normalize": True, "aux_loss": 0.01, "z_loss": 0.0, "bias_update": 0.0, "capacity_factor": 0.0, "impl": "grouped"}
ARCH_DEFAULTS = {
    "gpt2": {"position": "learned", "norm": "layer", "activation": "gelu"},
    "llama": {"position": "rotary", "norm": "rms", "activation": "swiglu"},
}


class GptlabConfig(PretrainedConfig):
    model_type = "gptlab"
    keys_to_ignore_at_inference = ["past_key_values"]
    # the names transformers' generic code (caches, generation, pipelines) asks for
    attribute_map = {"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head",
                     "max_position_embeddings": "block_size"}

    def __init__(self, arch="gpt2", vocab_size=50257, pad_vocab_to=64, block_size=1024, n_layer=12, n_head=12, n_kv_head=None,
                 n_embd=768, mlp_hidden=None, bias=True, qkv_bias=False, tie_embeddings=True, norm_eps=1e-5, rope_theta=10000.0, qk_norm=False,
                 dropout=0.0, position="", norm="", activation="", logit_softcap=0.0, zero_init=False, attn_window=0,
                 window_pattern="L", attention="sdpa", norm_impl="torch", moe=None, **kwargs):
        if arch not in ARCH_DEFAULTS:
            raise ValueError(f"unknown arch {arch!r}; this code computes {', '.join(ARCH_DEFAULTS)}")
        self.arch, self.vocab_size, self.pad_vocab_to, self.block_size = arch, vocab_size, pad_vocab_to, block_size
        self.n_layer, self.n_head, self.n_kv_head, self.n_embd = n_layer, n_head, n_kv_head, n_embd
        self.mlp_hidden, self.bias, self.tie_embeddings, self.norm_eps = mlp_hidden, bias, tie_embeddings, norm_eps
        self.rope_theta, self.qk_norm, self.dropout, self.qkv_bias = rope_theta, qk_norm, dropout, qkv_bias
        self.position, self.norm, self.activation = position, norm, activation
        self.logit_softcap, self.zero_init, self.attn_window, self.window_pattern = logit_softcap, zero_init, attn_window, window_pattern
        self.attention, self.norm_impl = attention, norm_impl  # how gptlab computed it, kept for the way back; here always SDPA
        self.moe = {**MOE_DEFAULTS, **(moe or {})}
        kwargs["tie_word_embeddings"] = tie_embeddings  # transformers ties lm_head to the embeddings by this name
        super().__init__(**kwargs)

    def kind(self, name: str) -> str:
        """position / norm / activation as computed: the field, or the arch's own when it is ""."""
        return getattr(self, name) or ARCH_DEFAULTS[self.arch][name]

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def hidden_dim(self) -> int:
        """The MLP's width: mlp_hidden, else 4 n_embd, or for SwiGLU 8/3 n_embd rounded up to 64."""
        if self.mlp_hidden:
            return self.mlp_hidden
        if self.kind("activation") != "swiglu":
            return 4 * self.n_embd
        return -(-(8 * self.n_embd // 3) // 64) * 64

    @property
    def expert_hidden(self) -> int:
        return self.moe["expert_hidden"] or self.hidden_dim

    @property
    def sparse_layers(self) -> list:
        """Per layer, whether it is a mixture of experts: from first_dense on, every `every`-th layer."""
        moe = self.moe
        return [bool(moe["n_experts"]) and layer >= moe["first_dense"] and (layer - moe["first_dense"] + 1) % moe["every"] == 0
                for layer in range(self.n_layer)]

    @property
    def layer_windows(self) -> list:
        """Per layer, the keys its attention sees: attn_window for S layers of the cycled pattern, 0 (all) for L;
        the last layer is always L."""
        pattern = self.window_pattern
        windows = [self.attn_window if pattern[layer % len(pattern)] == "S" else 0 for layer in range(self.n_layer)]
        windows[-1] = 0
        return windows
