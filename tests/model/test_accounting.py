"""Parameter, FLOP and memory accounting, checked against sums worked out by hand, built models and autograd."""

import pytest
import torch

from gptlab.cli.main import main
from gptlab.model import GPT, preset
from gptlab.model.accounting import (
    PEAK_FLOPS,
    activation_bytes_per_layer,
    flops_per_token,
    mfu,
    param_counts,
    peak_flops,
    tokens_per_second_at,
    training_memory,
)
from gptlab.model.io import save_model
from gptlab.runtime import GptlabError

# gpt2-tiny: n_layer 2, n_head 2, n_embd 32 (head_dim 16), vocab 512 (already a multiple of 64), block 64, biases, tied.
#   wte      512 x 32                          16,384
#   wpe       64 x 32                           2,048
#   per block:
#     ln_1     weight 32 + bias 32                 64
#     c_attn   32 x 96 + 96                     3,168
#     c_proj   32 x 32 + 32                     1,056
#     ln_2                                         64
#     c_fc     32 x 128 + 128                   4,224
#     c_proj   128 x 32 + 32                    4,128
#     block                                    12,704
#   2 blocks + ln_f 64 = 25,472 non-embedding; + wte + wpe = 43,904 total (lm_head is wte).
TINY_GPT2 = {"total": 43_904, "non_embedding": 25_472, "embeddings": 18_432, "per_block": 12_704}

# llama-tiny: n_layer 2, n_head 4, n_kv_head 2, n_embd 32 (head_dim 8), vocab 512, no biases, untied.
#   MLP hidden: 8 * 32 // 3 = 85, rounded up to 64 -> 128.
#   wte 512 x 32 = 16,384; lm_head 512 x 32 = 16,384; no wpe.
#   per block: 2 RMSNorm 2 x 32 = 64; c_attn 32 x (4 + 2 x 2) x 8 = 2,048; c_proj 32 x 32 = 1,024;
#              c_fc 32 x 2 x 128 = 8,192 (gate and up); c_proj 128 x 32 = 4,096; block 15,424.
#   2 blocks + ln_f 32 = 30,880 non-embedding; + 32,768 = 63,648 total.
TINY_LLAMA = {"total": 63_648, "non_embedding": 30_880, "embeddings": 32_768, "per_block": 15_424}


@pytest.mark.parametrize(("name", "expected"), [("gpt2-tiny", TINY_GPT2), ("llama-tiny", TINY_LLAMA)])
def test_param_counts_match_hand_sums(name, expected):
    counts = param_counts(preset(name))
    assert {key: counts[key] for key in expected} == expected


def test_param_counts_gpt2_is_nanogpt_124m_with_padded_vocab():
    # Per block: c_attn 3d^2 + 3d, c_proj d^2 + d, c_fc 4d^2 + 4d, c_proj 4d^2 + d, two LayerNorms 4d
    # = 12 d^2 + 13 d = 7,077,888 + 9,984 = 7,087,872 at d = 768. Twelve blocks: 85,054,464; ln_f 1,536.
    d = 768
    non_embedding = 12 * (12 * d * d + 13 * d) + 2 * d
    assert non_embedding == 85_056_000
    wte, wpe = 50_304 * d, 1024 * d  # 38,633,472 and 786,432
    counts = param_counts(preset("gpt2"))
    assert counts["non_embedding"] == non_embedding
    assert counts["total"] == non_embedding + wte + wpe == 124_475_904


@pytest.mark.parametrize(
    ("name", "published"),
    [("gpt2", 124_439_808), ("gpt2-medium", 354_823_168), ("gpt2-large", 774_030_080), ("gpt2-xl", 1_557_611_200)],
)
def test_param_counts_match_published_gpt2_sizes_without_padding(name, published):
    assert param_counts(preset(name, pad_vocab_to=1))["total"] == published


@pytest.mark.parametrize(
    "config",
    [
        preset("gpt2-tiny"),
        preset("gpt2-mini"),
        preset("llama-tiny"),
        preset("llama-mini"),
        preset("gpt2"),
        preset("llama-124m"),
        preset("gpt2-tiny", bias=False, tie_embeddings=False, qk_norm=True, vocab_size=500),
        preset("llama-tiny", bias=True, qk_norm=True, mlp_hidden=96, n_kv_head=1),
        preset("llama-tiny", tie_embeddings=True, n_kv_head=None),
        preset("gpt2-tiny", activation="relu2"),
        preset("gpt2-tiny", position="rotary", norm="rms"),
        preset("gpt2-tiny", position="rotary", norm="rms", activation="swiglu", bias=False, qk_norm=True, zero_init=True),
        preset("gpt2-mini", activation="relu2", tie_embeddings=False, attn_window=16, window_pattern="SSSL", logit_softcap=15.0),
        preset("llama-tiny", position="learned", norm="layer", activation="gelu", bias=True),
        preset("llama-tiny", activation="relu2", norm="layer"),  # LayerNorm without bias: weight only
    ],
    ids=lambda config: f"{config.arch}-L{config.n_layer}-d{config.n_embd}-bias{config.bias}-tie{config.tie_embeddings}-qk{config.qk_norm}"
                       f"-{config.position_kind}-{config.norm_kind}-{config.activation_kind}",
)
def test_param_counts_equal_built_model(config):
    model = GPT(config)
    counts = param_counts(config)
    assert counts["total"] == model.num_params()
    assert counts["non_embedding"] == model.num_params(embeddings=False)
    assert counts["embeddings"] == counts["total"] - counts["non_embedding"]


def test_flops_per_token_match_hand_sums():
    # gpt2-tiny at T = 64: N = non-embedding 25,472 + lm_head 512 x 32 = 41,856; 6N = 251,136.
    # attention 12 L a h_d T = 12 x 2 x 2 x 16 x 64 = 49,152; forward 2N + 4 L a h_d T = 83,712 + 16,384.
    flops = flops_per_token(preset("gpt2-tiny"))
    assert flops == {
        "seq_len": 64,
        "matmul_params": 41_856,
        "dense": 251_136,
        "attention": 49_152,
        "training": 300_288,
        "forward": 100_096,
    }
    assert flops_per_token(preset("gpt2-tiny"), 32)["attention"] == 49_152 // 2


def test_flops_per_token_relu2_and_rotary_on_gpt2_match_hand_sums():
    # relu2 is not gated: the same matrices as GELU. Rotary on gpt2: no wpe (not a matmul anyway), RMSNorm no bias:
    # non-embedding 25,472 - 2 blocks x 2 norms x 32 - ln_f 32 = 25,312; N = 25,312 + 512 x 32 = 41,696.
    assert flops_per_token(preset("gpt2-tiny", activation="relu2")) == flops_per_token(preset("gpt2-tiny"))
    counts = param_counts(preset("gpt2-tiny", position="rotary", norm="rms"))
    assert (counts["total"], counts["wpe"], counts["non_embedding"]) == (25_312 + 16_384, 0, 25_312)
    assert flops_per_token(preset("gpt2-tiny", position="rotary", norm="rms"))["matmul_params"] == 41_696


def test_flops_per_token_sliding_window_layers_count_window_keys():
    # gpt2-tiny with 4 layers, window 16, pattern SSL: layers (16, 16, 0, 0). At T = 64 the attention term is
    # 12 a h_d (16 + 16 + 64 + 64) = 12 x 32 x 160 = 61,440 instead of 12 x 32 x 256 = 98,304.
    config = preset("gpt2-tiny", n_layer=4, attn_window=16, window_pattern="SSL")
    assert config.layer_windows == (16, 16, 0, 0)
    flops = flops_per_token(config)
    assert flops["attention"] == 61_440
    assert flops["training"] == flops["dense"] + 61_440
    assert flops_per_token(preset("gpt2-tiny", n_layer=4))["attention"] == 98_304
    assert flops_per_token(config, 8)["attention"] == 12 * 32 * 8 * 4  # T under the window: every layer sees T keys


def test_flops_per_token_gpt2_follows_nanogpt_estimate_mfu():
    # nanoGPT: N = get_num_params() (total - wpe, lm_head tied to wte), flops = 6N + 12 L H Q T.
    config = preset("gpt2")
    n = 124_475_904 - 1024 * 768
    flops = flops_per_token(config)
    assert flops["matmul_params"] == n == 123_689_472
    assert flops["training"] == 6 * n + 12 * 12 * 12 * 64 * 1024 == 855_383_040


def test_flops_per_token_llama_counts_untied_lm_head_not_wte():
    config = preset("llama-tiny")
    assert flops_per_token(config)["matmul_params"] == TINY_LLAMA["non_embedding"] + 512 * 32


def test_mfu_arithmetic():
    tiny = preset("gpt2-tiny")
    assert mfu(1000, tiny, 64, peak=300_288_000) == pytest.approx(1.0)
    # gpt2 at 100k tokens/s on an A100: 1e5 x 855,383,040 / 312e12 = 0.27416...
    assert mfu(100_000, preset("gpt2"), 1024, "a100") == pytest.approx(8.5538304e13 / 312e12)
    assert tokens_per_second_at(0.4, preset("gpt2"), 1024, "h100") == pytest.approx(0.4 * 989e12 / 855_383_040)
    assert mfu(tokens_per_second_at(0.25, tiny, 64, "cpu"), tiny, 64, "cpu") == pytest.approx(0.25)


def test_peak_flops_reads_names_and_numbers():
    assert peak_flops("H100") == PEAK_FLOPS["h100"] == 989e12
    assert peak_flops("a100") == 312e12
    assert peak_flops("150e12") == 150e12
    assert peak_flops(2e12) == 2e12
    with pytest.raises(GptlabError, match="unknown device peak 'tpu'"):
        peak_flops("tpu")
    with pytest.raises(GptlabError, match="positive"):
        peak_flops(-1.0)


def test_training_memory_matches_hand_sums():
    # gpt2-tiny, B 4, T 64, fp32 parameters, bf16 autocast, AdamW, flash attention, no dropout.
    #   parameters 43,904 x 4 = 175,616; gradients the same; AdamW m and v 2 x 175,616 = 351,232.
    #   per layer (TB = 256 tokens, d 32, F 128): norms 2 x 256 x 32 x 4 = 65,536 (fp32 residual stream);
    #     attention 5 x 256 x 32 x 2 = 81,920; MLP 256 x (32 + 128 + 128) x 2 = 147,456 -> 294,912; x 2 layers.
    #   weight casts: 41,856 matmul weights x 2 = 83,712; logits 4 x 64 x 512 x 4 = 524,288;
    #   logit gradients twice that, 1,048,576.
    memory = training_memory(preset("gpt2-tiny"), 4, 64)
    assert memory == {
        "parameters": 175_616,
        "gradients": 175_616,
        "optimizer": 351_232,
        "activations": 589_824,
        "weight_casts": 83_712,
        "logits": 524_288,
        "logit_grads": 1_048_576,
        "total": 2_948_864,
    }
    fp32 = training_memory(preset("gpt2-tiny"), 4, 64, amp="fp32", optimizer="none")
    assert fp32["optimizer"] == fp32["weight_casts"] == 0
    assert fp32["activations"] == 2 * (65_536 + 2 * 81_920 + 2 * 147_456)


def test_training_memory_with_activation_checkpointing_keeps_the_block_inputs_and_one_block():
    # gpt2-tiny, B 4, T 64 (hand sums above): 2 block inputs 2 x 256 x 32 x 4 = 65,536 (fp32 residual stream)
    #   + one block's 294,912 = 360,448 instead of 589,824; nothing else changes.
    plain = training_memory(preset("gpt2-tiny"), 4, 64)
    checkpointed = training_memory(preset("gpt2-tiny"), 4, 64, activation_checkpointing=True)
    assert checkpointed["activations"] == 65_536 + 294_912 == 360_448
    assert checkpointed["total"] == plain["total"] - 589_824 + 360_448
    assert {k: v for k, v in checkpointed.items() if k not in ("activations", "total")} == {
        k: v for k, v in plain.items() if k not in ("activations", "total")}


def test_training_memory_with_the_fused_loss_counts_one_chunk_and_the_gradients_it_keeps():
    # gpt2-tiny, B 4, T 64 (hand sums above), vocab 512, d 32: a chunk is max(2**20 // 512, 4 x 32) = 2,048 rows,
    #   so all 256 rows: fp32 logits 256 x 512 x 4 = 524,288 + their bf16 cast 256 x 512 x 2 = 262,144 -> 786,432;
    #   kept: the input gradient and its scaled copy 2 x 256 x 32 x 4 = 65,536 + the head's 512 x 32 x 4 = 65,536.
    plain = training_memory(preset("gpt2-tiny"), 4, 64)
    fused = training_memory(preset("gpt2-tiny"), 4, 64, fused_loss=True)
    assert (fused["logits"], fused["logit_grads"]) == (786_432, 131_072)
    assert fused["total"] == plain["total"] - 524_288 - 1_048_576 + 786_432 + 131_072
    # gpt2 (V 50,257, d 768) at B 8, T 1024: chunks of max(20, 3,072) rows instead of 8,192 rows of logits
    gpt2 = preset("gpt2")
    big_plain, big_fused = training_memory(gpt2, 8, 1024), training_memory(gpt2, 8, 1024, fused_loss=True)
    assert big_fused["logits"] == 3_072 * 50_257 * 6 and big_plain["logits"] == 8_192 * 50_257 * 4
    assert big_fused["logit_grads"] == (2 * 8_192 * 768 + 50_304 * 768) * 4
    capped = training_memory(preset("gpt2-tiny", logit_softcap=15.0), 4, 64, fused_loss=True)
    assert capped["logits"] == 256 * 512 * (4 + 4 + 2)  # tanh's slope kept beside the logits


def test_activation_bytes_reproduce_korthikanti_formula_for_gpt2():
    # Korthikanti et al. 2022: s b h (34 + 5 a s / h) bytes per layer, 16-bit, dropout, no flash attention.
    config = preset("gpt2-tiny", dropout=0.1)
    s, b, h, a = 64, 4, 32, 2
    math = activation_bytes_per_layer(config, b, s, param_dtype="bf16", amp="bf16", flash_attention=False)
    assert math == s * b * h * (34 + 5 * a * s // h) == 442_368
    flash = activation_bytes_per_layer(config, b, s, param_dtype="bf16", amp="bf16", flash_attention=True)
    assert flash == s * b * h * 34


def _saved_bytes_of_one_block(model: GPT, batch_size: int, seq_len: int) -> int:
    """Bytes autograd keeps for block 0's backward: distinct storages, parameters excluded."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        pointer = tensor.untyped_storage().data_ptr()
        if pointer not in parameters:
            saved[pointer] = tensor.untyped_storage().nbytes()
        return tensor

    x = torch.randn(batch_size, seq_len, model.config.n_embd, requires_grad=True)
    rotary = None
    if model.config.position_kind == "rotary":
        rotary = (model.rope_cos[:seq_len][None, None], model.rope_sin[:seq_len][None, None])
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model.transformer["h"][0](x, rotary)
    return sum(saved.values())


@pytest.mark.parametrize(
    ("name", "overrides"),
    [("gpt2-mini", {}), ("llama-mini", {}), ("gpt2-mini", {"activation": "relu2", "position": "rotary", "norm": "rms"}),
     ("gpt2-mini", {"n_kv_head": 2}), ("llama-mini", {"n_kv_head": None}), ("llama-mini", {"position": "learned"}),
     ("llama-mini", {"activation": "relu2", "norm": "layer"})],
    ids=lambda value: value if isinstance(value, str) else "-".join(f"{k}={v}" for k, v in value.items()) or "default",
)
def test_activation_bytes_per_layer_match_autograd_saved_tensors_in_fp32(name, overrides):
    config = preset(name, block_size=64, **overrides)
    model = GPT(config).train()
    measured = _saved_bytes_of_one_block(model, 2, 64)
    estimate = activation_bytes_per_layer(config, 2, 64, param_dtype="fp32", amp="fp32", flash_attention=True)
    assert measured == pytest.approx(estimate, rel=0.03)  # the rest: logsumexp, norm statistics, rotary tables


def test_training_memory_rejects_bad_arguments():
    with pytest.raises(GptlabError, match="unknown optimizer 'lion'"):
        training_memory(preset("gpt2-tiny"), 1, 8, optimizer="lion")
    with pytest.raises(GptlabError, match="unknown dtype 'int8'"):
        training_memory(preset("gpt2-tiny"), 1, 8, amp="int8")
    with pytest.raises(GptlabError, match="at least 1"):
        training_memory(preset("gpt2-tiny"), 0, 8)


def test_cli_model_info_prints_the_accounting(capsys):
    assert main(["model", "info", "--preset", "gpt2"]) == 0
    out = capsys.readouterr().out
    memory = training_memory(preset("gpt2"), 8, 1024, fused_loss=True)  # what training runs by default
    for text in ("124,475,904", "85,056,000", "855,383,040", "50304", "h100 peak 989 TFLOP/s",
                 f"{0.4 * 989e12 / 855_383_040:,.0f} tokens/s", f"{memory['total'] / 2**30:8.2f}"):
        assert text in out


def test_cli_model_info_prints_the_switches_and_counts_them(tmp_path, capsys):
    config = preset("gpt2-tiny", n_layer=4, position="rotary", activation="relu2", logit_softcap=15.0, zero_init=True,
                    attn_window=16, window_pattern="SSL")
    save_model(GPT(config), tmp_path / "model")
    assert main(["model", "info", "--checkpoint", str(tmp_path / "model")]) == 0
    out = capsys.readouterr().out
    assert ("switches    position rotary, norm layer, activation relu2, logit_softcap 15, zero_init yes, "
            "attention sliding window 16 in layers 0,1 (pattern SSL)") in out
    assert f"total {param_counts(config)['total']:,}" in out and f"attention {flops_per_token(config)['attention']:,}" in out
    assert main(["model", "info", "--preset", "llama-tiny"]) == 0
    assert ("position rotary, norm rms, activation swiglu, logit_softcap off, zero_init no, "
            "attention full context in every layer") in capsys.readouterr().out


def test_cli_model_info_reads_a_saved_model(tmp_path, capsys):
    save_model(GPT(preset("llama-tiny")), tmp_path / "model")
    assert main(["model", "info", "--checkpoint", str(tmp_path / "model"), "--seq-len", "32", "--batch-size", "2",
                 "--device-peak", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "63,648" in out and "30,880" in out and "cpu peak 1 TFLOP/s" in out
    assert f"{flops_per_token(preset('llama-tiny'), 32)['training']:,}" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preset", "gpt5"], "gptlab: error: unknown model preset 'gpt5'"),
        (["--checkpoint", "nowhere"], "gptlab: error: no model at nowhere: no such folder here"),
        (["--preset", "gpt2-tiny", "--seq-len", "65"], "longer than the model's context (64)"),
        (["--preset", "gpt2-tiny", "--device-peak", "tpu"], "unknown device peak 'tpu'"),
    ],
)
def test_cli_model_info_errors_in_one_line(argv, message, capsys):
    assert main(["model", "info", *argv]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
