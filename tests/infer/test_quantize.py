"""Weight-only int8/int4: the codes stand for their weights within half a step, the kernels equal the readable
dequantise-then-matmul, and a quantised model decodes (cache, engine, CLI) like itself without a cache."""

import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gptlab.chat import ChatFormat
from gptlab.cli.main import main
from gptlab.infer import Engine, EngineConfig, SamplingConfig, generate
from gptlab.infer.quantize import (
    QuantizedEmbedding,
    QuantizedLinear,
    dequantize_int4,
    dequantize_int8,
    quantize_int4,
    quantize_int8,
    quantize_model,
    quantized_bytes,
)
from gptlab.model import GPT, preset
from gptlab.runtime import GptlabError

GREEDY = SamplingConfig(max_new_tokens=12, temperature=0)


def tiny_model(name: str = "gpt2-tiny", dtype: torch.dtype = torch.float32) -> GPT:
    torch.manual_seed(0)
    return GPT(preset(name, vocab_size=500, block_size=64)).to(dtype).eval()


def weights(rows: int, columns: int, seed: int = 0) -> torch.Tensor:
    """Gaussian weights with an outlier and an all-zero row: the cases a scale must survive."""
    weight = torch.randn(rows, columns, generator=torch.Generator().manual_seed(seed), dtype=torch.float32) * 0.02
    weight[1, 3] = 0.5
    weight[2] = 0.0
    return weight


def test_quantize_int8_each_weight_within_half_a_step_of_its_code():
    weight = weights(24, 64)
    q, scale = quantize_int8(weight)
    restored = dequantize_int8(q, scale)
    for n in range(weight.shape[0]):  # brute force, weight by weight, against the row's own step
        step = weight[n].abs().max().item() / 127
        for k in range(weight.shape[1]):
            assert abs(restored[n, k].item() - weight[n, k].item()) <= step / 2 + 1e-9
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 127
    assert restored[2].abs().max() == 0 and restored[1, 3] == pytest.approx(0.5)  # a row's largest weight is exact


def test_quantize_int4_each_weight_within_half_a_step_of_its_group():
    weight, group = weights(16, 96), 32
    codes, scale, low = quantize_int4(weight, group)
    restored = dequantize_int4(codes, scale, low)
    for n in range(weight.shape[0]):
        for k in range(weight.shape[1]):
            members = weight[n, k - k % group : k - k % group + group]
            step = (members.max() - members.min()).item() / 15
            assert abs(restored[n, k].item() - weight[n, k].item()) <= step / 2 + 1e-7
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 15
    assert restored[2].abs().max() == 0


@pytest.mark.parametrize("scheme", ["int8", "int4"])
@pytest.mark.parametrize("out_features, bias", [(48, True), (40, False)])  # 40: not a multiple of the packers' 16
def test_quantized_linear_kernels_equal_the_readable_reference_within_bf16(scheme, out_features, bias):
    torch.manual_seed(0)
    linear = nn.Linear(64, out_features, bias=bias)
    layer = QuantizedLinear(linear, scheme, group_size=32)
    if scheme == "int8":
        weight = dequantize_int8(*quantize_int8(linear.weight.detach()))
    else:
        weight = dequantize_int4(*quantize_int4(linear.weight.detach(), 32))
    x = torch.randn(3, 5, 64, dtype=torch.float32)
    reference = F.linear(x, weight, None if linear.bias is None else linear.bias.detach())
    fast = layer(x)
    assert fast.dtype == torch.float32 and fast.shape == (3, 5, out_features)
    torch.testing.assert_close(fast, reference, rtol=2e-2, atol=1e-2 * reference.abs().max().item())
    # the module keeps the scale (int4: and zero) in bf16, as the kernels take them: bf16 rounding again
    torch.testing.assert_close(layer.reference(x), reference, rtol=2e-2, atol=1e-2 * reference.abs().max().item())


def test_quantized_linear_int4_reads_back_the_codes_it_was_given():
    """dequantize() reads the opaque packed layout back through the kernel: it must equal the readable
    dequantisation with the kernel's own bf16 scale and zero."""
    weight = weights(40, 64)
    layer = QuantizedLinear(_linear_of(weight), "int4", 32)
    codes, scale, low = quantize_int4(weight, 32)
    scale_bf16 = scale.to(torch.bfloat16).float()
    zero_bf16 = (low + 8 * scale).to(torch.bfloat16).float()
    expected = dequantize_int4(codes, scale_bf16, zero_bf16 - 8 * scale_bf16)
    torch.testing.assert_close(layer.dequantize(), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("in_features, group", [(48, 32), (40, 32), (32, 64), (200, 128)])
def test_quantized_linear_int4_on_inputs_the_group_does_not_divide_is_the_padded_weights_layer(in_features, group):
    """Zero columns up to a multiple of the group: the codes read back are the padded weight's, cut to the real
    inputs, and the output is the layer's on those inputs alone (the padding meets zero inputs)."""
    weight = weights(40, in_features)
    layer = QuantizedLinear(_linear_of(weight), "int4", group)
    padded = F.pad(weight, (0, -in_features % group))
    codes, scale, low = quantize_int4(padded, group)
    scale_bf16 = scale.to(torch.bfloat16).float()
    zero_bf16 = (low + 8 * scale).to(torch.bfloat16).float()
    expected = dequantize_int4(codes, scale_bf16, zero_bf16 - 8 * scale_bf16)[:, :in_features]
    torch.testing.assert_close(layer.dequantize(), expected, rtol=1e-6, atol=1e-7)
    x = torch.randn(3, 5, in_features, generator=torch.Generator().manual_seed(2))
    reference = F.linear(x, expected)
    torch.testing.assert_close(layer(x), reference, rtol=2e-2, atol=1e-2 * reference.abs().max().item())


def test_cli_sample_int4_on_a_width_32_does_not_divide_prints_the_quantised_models_text(tmp_path, capsys):
    """A model 48 wide (inputs 48 and 192): --quantize int4 works, and prints what the Python API generates."""
    from gptlab.model.io import save_model
    from gptlab.tokenizer import Tokenizer

    tokenizer = Tokenizer.train(["the quick brown fox jumps over the lazy dog " * 40], vocab_size=300)
    torch.manual_seed(0)
    model = GPT(preset("gpt2-tiny", vocab_size=tokenizer.vocab_size, n_embd=48, n_head=2, block_size=64))
    save_model(model, tmp_path / "m")
    tokenizer.save(tmp_path / "m" / "tokenizer")
    assert main(["sample", "--checkpoint", str(tmp_path / "m"), "--prompt", "the", "--max-new-tokens", "6", "--temperature", "0",
                 "--device", "cpu", "--quantize", "int4"]) == 0
    quantized = quantize_model(model.eval(), "int4")
    assert quantized.transformer["h"][0].attn.c_attn.scheme == "int4"
    ids = tokenizer.encode("the")
    config = SamplingConfig(max_new_tokens=6, temperature=0, stop_tokens=(tokenizer.eot_id,), vocab_size=tokenizer.vocab_size)
    assert capsys.readouterr().out == tokenizer.decode(ids + generate(quantized, [ids], config)[0]) + "\n"


def _linear_of(weight: torch.Tensor) -> nn.Linear:
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    with torch.no_grad():
        linear.weight.copy_(weight)
    return linear


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
@pytest.mark.parametrize("scheme, bound", [("int8", 0.03), ("int4", 0.2)])
def test_quantized_model_logits_close_to_the_unquantised_models(name, scheme, bound):
    model = tiny_model(name)
    idx = torch.randint(0, 500, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, _ = model(idx)
        quantize_model(model, scheme)
        logits, _ = model(idx)
    assert logits.dtype == torch.float32
    assert ((logits - expected).norm() / expected.norm()).item() < bound
    assert isinstance(model.transformer["wte"], QuantizedEmbedding) and isinstance(model.lm_head, QuantizedLinear)


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantize_keeps_a_tied_head_and_embedding_as_one_int8_matrix(scheme):
    model = tiny_model("gpt2-tiny")
    quantize_model(model, scheme)
    assert model.lm_head.scheme == "int8" and model.lm_head.q is model.transformer["wte"].q
    untied = quantize_model(tiny_model("llama-tiny"), scheme)
    assert untied.lm_head.scheme == scheme  # an untied head follows the scheme


def test_quantize_int8_bytes_are_one_a_weight_and_the_tied_table_counts_once():
    model = tiny_model("gpt2-tiny")
    matrices = [module.weight for module in model.modules() if isinstance(module, nn.Linear)]  # the head is wte's
    kept = sum(p.numel() for p in model.parameters() if all(p is not matrix for matrix in matrices))  # wpe, norms, biases
    rows = sum(matrix.shape[0] for matrix in matrices)
    quantize_model(model, "int8")
    # 1 byte a weight, 4 + 2 a row (the fp32 scale and the kernels' bf16 copy), the rest fp32; wte's table once
    expected = 4 * kept + sum(matrix.numel() for matrix in matrices) + 6 * rows
    assert quantized_bytes(model) == expected


@pytest.mark.parametrize("scheme", ["int8", "int4"])
@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_quantized_model_greedy_decoding_with_the_cache_equals_without(name, scheme):
    model = quantize_model(tiny_model(name), scheme)
    prompts = [[1, 2, 3, 4, 5], [7, 8]]  # different lengths: left padding and masks too
    assert generate(model, prompts, GREEDY) == generate(model, prompts, GREEDY, use_cache=False)


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_engine_on_a_quantized_model_equals_generate_alone(scheme):
    model = quantize_model(tiny_model("llama-tiny"), scheme)
    prompts = [[5, 6, 7], [9] * 11, [3]]
    with Engine(model, EngineConfig(slots=2)) as engine:
        requests = [engine.submit(prompt, GREEDY) for prompt in prompts]
        outputs = [list(request) for request in requests]
    assert outputs == [generate(model, [prompt], GREEDY)[0] for prompt in prompts]


def test_quantize_bfloat16_model_returns_bfloat16_logits():
    model = quantize_model(tiny_model("gpt2-tiny", torch.bfloat16), "int4")
    logits, _ = model(torch.tensor([[1, 2, 3]]))
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()


def test_quantize_leaves_mixture_of_experts_stacks_in_full_precision():
    torch.manual_seed(0)
    model = GPT(preset("moe-tiny", vocab_size=500, block_size=64)).eval()
    experts = model.transformer["h"][0].mlp.experts_fc
    quantize_model(model, "int8")
    moe = model.transformer["h"][0].mlp
    assert moe.experts_fc is experts and isinstance(moe.router, nn.Linear)
    assert isinstance(model.transformer["h"][0].attn.c_attn, QuantizedLinear)
    assert generate(model, [[1, 2, 3]], GREEDY) == generate(model, [[1, 2, 3]], GREEDY, use_cache=False)


@pytest.mark.parametrize("make, scheme, group_size, message", [
    (lambda: quantize_model(tiny_model(), "int8"), "int4", 32, "already quantised"),
    (tiny_model, "int3", 32, "unknown quantisation scheme 'int3'"),
    (tiny_model, "int4", 16, "int4 group_size must be one of 32, 64, 128, 256"),
    (lambda: tiny_model(dtype=torch.float64), "int8", 32, "torch.float64"),
    (lambda: tiny_model().to("meta"), "int8", 32, "the model is on meta"),
])
def test_quantize_model_refuses_bad_input_in_one_line_and_changes_nothing(make, scheme, group_size, message):
    model = make()
    modules = [type(module) for module in model.modules()]
    with pytest.raises(GptlabError, match=message) as error:
        quantize_model(model, scheme, group_size=group_size)
    assert "\n" not in str(error.value)
    assert [type(module) for module in model.modules()] == modules


def test_cli_sample_quantize_int8_prints_the_quantised_models_greedy_text(chat_model, capsys):
    from gptlab.model.io import load_model
    from gptlab.tokenizer import Tokenizer

    argv = ["sample", "--checkpoint", str(chat_model), "--prompt", "ROMEO:", "--max-new-tokens", "6", "--temperature", "0",
            "--device", "cpu", "--quantize", "int8"]
    assert main(argv) == 0
    tokenizer = Tokenizer.load(chat_model / "tokenizer")
    model = quantize_model(load_model(chat_model), "int8")
    ids = tokenizer.encode("ROMEO:")
    stops = ChatFormat(tokenizer).stop_tokens  # a chat model's sample ends at its end-of-turn too
    config = SamplingConfig(max_new_tokens=6, temperature=0, stop_tokens=stops, vocab_size=tokenizer.vocab_size)
    assert capsys.readouterr().out == tokenizer.decode(ids + generate(model, [ids], config)[0]) + "\n"


def test_cli_quantize_unknown_scheme_is_one_error_line(chat_model, capsys):
    with pytest.raises(SystemExit) as exit:
        main(["sample", "--checkpoint", str(chat_model), "--prompt", "A", "--quantize", "int3"])
    assert exit.value.code != 0
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--quantize" in error and "'int3'" in error


@pytest.mark.parametrize("argv", [
    ["chat", "{model}", "--device", "cpu"],
    ["serve", "{model}", "--port", "0"],
    ["eval", "{model}", "--suite", "chat", "--tasks", "spelling", "--out", "{out}"],
])
def test_cli_chat_serve_eval_quantize_the_model_right_after_loading_it(argv, chat_model, tmp_path, monkeypatch, capsys):
    """Stopped just after quantising (a spy raises): the verb handed its loaded model over, and an error there
    leaves nothing behind (eval's card folder is undone)."""
    seen = []

    def quantize_then_stop(model, scheme):
        seen.append(quantize_model(model, scheme))
        raise GptlabError("stopped after quantising")

    monkeypatch.setattr("gptlab.load.decoding.quantize_loaded", quantize_then_stop)  # chat, serve and eval load through it
    argv = [part.format(model=chat_model, out=tmp_path / "card") for part in argv]
    assert main([*argv, "--quantize", "int4"]) == 1
    assert "stopped after quantising" in capsys.readouterr().err
    assert len(seen) == 1 and seen[0].transformer["h"][0].mlp.c_fc.scheme == "int4"
    assert not (tmp_path / "card").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA kernels need a CUDA device")
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantized_linear_cuda_kernels_equal_the_readable_reference(scheme):
    torch.manual_seed(0)
    if scheme == "int4" and torch.cuda.get_device_capability()[0] < 8:  # tinygemm has no kernel there: refused in one line
        with pytest.raises(GptlabError, match="compute capability 8.0"):
            quantize_model(GPT(preset("gpt2-tiny")).cuda(), "int4")
        return
    linear = nn.Linear(128, 96).cuda()
    layer = QuantizedLinear(linear, scheme, group_size=32)
    if scheme == "int8":
        weight = dequantize_int8(*quantize_int8(linear.weight.detach()))
    else:
        weight = dequantize_int4(*quantize_int4(linear.weight.detach(), 32))
    x = torch.randn(4, 128, device="cuda", dtype=torch.float32)
    reference = F.linear(x, weight, linear.bias.detach())
    torch.testing.assert_close(layer(x), reference, rtol=2e-2, atol=1e-2 * reference.abs().max().item())
    torch.testing.assert_close(layer.reference(x), reference, rtol=2e-2, atol=1e-2 * reference.abs().max().item())


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8,
                    reason="int4 CUDA kernels (tinygemm) need compute capability 8.0")
def test_quantized_linear_int4_cuda_on_inputs_the_group_does_not_divide_equals_the_padded_reference():
    weight = weights(40, 48).cuda()
    layer = QuantizedLinear(_linear_of(weight).cuda(), "int4", 32)
    expected = dequantize_int4(*quantize_int4(F.pad(weight, (0, 16)), 32))[:, :48]
    x = torch.randn(4, 48, device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    reference = F.linear(x, expected)
    torch.testing.assert_close(layer(x), reference, rtol=2e-2, atol=1e-2 * reference.abs().max().item())
    torch.testing.assert_close(layer.dequantize(), expected, rtol=2e-2, atol=1e-2 * expected.abs().max().item())


def test_cli_eval_card_of_a_quantized_model_records_the_scheme(chat_model, tmp_path):
    assert main(["eval", str(chat_model), "--suite", "chat", "--tasks", "spelling", "--limit", "2", "--out", str(tmp_path / "card"),
                 "--quantize", "int8", "--device", "cpu", "--precision", "fp32"]) == 0
    saved = json.loads((tmp_path / "card" / "eval.json").read_text())
    assert saved["settings"]["quantize"] == "int8"
