"""Batch-1 bf16 decoding on a CPU takes PyTorch's matrix-vector kernel (oneDNN off for that call only), with the same results."""

import pytest
import torch
import torch.nn.functional as F

from gptlab.infer import Engine, EngineConfig, SamplingConfig, generate
from gptlab.infer.gemv import single_row_matmuls
from gptlab.model import GPT, preset

CPU = torch.device("cpu")
GREEDY = SamplingConfig(max_new_tokens=12, temperature=0)


def tiny_model(dtype: torch.dtype) -> GPT:
    torch.manual_seed(0)
    return GPT(preset("gpt2-tiny", vocab_size=512, block_size=64)).eval().to(dtype)


@pytest.mark.parametrize(
    ("dtype", "rows", "onednn_inside"),
    [(torch.bfloat16, 1, False), (torch.bfloat16, 2, True), (torch.float32, 1, True), (torch.float16, 1, True)],
)
def test_single_row_matmuls_turns_onednn_off_only_for_one_bf16_row(dtype, rows, onednn_inside):
    assert torch.backends.mkldnn.enabled
    with single_row_matmuls(CPU, dtype, rows):
        assert torch.backends.mkldnn.enabled is onednn_inside
    assert torch.backends.mkldnn.enabled


def test_single_row_matmuls_turns_onednn_back_on_after_an_error():
    with pytest.raises(RuntimeError), single_row_matmuls(CPU, torch.bfloat16, 1):
        raise RuntimeError("inside")
    assert torch.backends.mkldnn.enabled


def test_single_row_bf16_linear_is_the_float32_product_rounded_once():
    """The reference: the same bf16 numbers multiplied in float32, rounded to bf16 at the end (at most one step apart)."""
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(1000, 256, generator=generator) * 0.05).bfloat16()
    bias = torch.randn(1000, generator=generator).bfloat16()
    x = torch.randn(1, 256, generator=generator).bfloat16()
    reference = F.linear(x.float(), weight.float(), bias.float())
    with single_row_matmuls(CPU, torch.bfloat16, 1):
        fast = F.linear(x, weight, bias)
    one_step = reference.abs() * 2**-7  # a bf16 step (8 significant bits) at the value's size
    assert ((fast.float() - reference).abs() <= one_step).all()


def test_engine_decodes_one_bf16_row_without_onednn_and_prefills_with_it():
    model = tiny_model(torch.bfloat16)
    seen: list[tuple[int, bool]] = []  # (rows in the call, oneDNN on) at the first block's qkv projection
    model.transformer["h"][0].attn.c_attn.register_forward_hook(
        lambda module, inputs, output: seen.append((inputs[0].shape[0] * inputs[0].shape[1], torch.backends.mkldnn.enabled))
    )
    with Engine(model, EngineConfig(slots=2)) as engine:
        list(engine.submit(list(range(1, 9)), GREEDY))
    assert seen[0] == (8, True)  # the prompt's prefill keeps oneDNN (faster from 4 rows on)
    assert seen[1:] == [(1, False)] * (GREEDY.max_new_tokens - 1)
    assert torch.backends.mkldnn.enabled


def test_engine_bf16_batch_1_equals_generate_alone():
    """Both decode loops take the same path for one row, so one request gives generate's tokens."""
    model = tiny_model(torch.bfloat16)
    prompt = torch.randint(0, 512, (10,), generator=torch.Generator().manual_seed(1)).tolist()
    with Engine(model, EngineConfig(slots=1)) as engine:
        ours = list(engine.submit(prompt, GREEDY))
    assert ours == generate(model, [prompt], GREEDY)[0]
