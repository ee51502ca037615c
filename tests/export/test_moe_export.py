"""MoE models no transformers class computes (sigmoid scores, shared experts, a routing bias, capacity) export with
gptlab's own modeling code and load in transformers (trust_remote_code=True) with gptlab's logits."""

import json

import pytest
import torch
import transformers  # a dev extra: make test installs it

from gptlab.export import export_hf
from gptlab.infer import SamplingConfig, generate
from gptlab.model.hf import load_pretrained_directory
from tests.model.test_hf_moe import assert_same_logits, assert_same_weights, hf_greedy, ids, moe_model

pytestmark = pytest.mark.usefixtures("hf_modules_cache")  # transformers' copy of remote code under tmp (tests/conftest.py)


@pytest.mark.parametrize("moe", [
    dict(score="sigmoid", n_shared=1, bias_update=0.01, normalize=False),
    dict(capacity_factor=1.0, first_dense=1),
])
def test_export_moe_custom_code_loads_in_transformers_with_equal_logits_and_round_trips(tmp_path, moe):
    model = moe_model(**moe)
    for layer in model.moe_layers():  # a bias in use: it must change which experts are picked in the exported code too
        layer.route_bias.copy_(torch.tensor([0.3, -0.2, 0.0, 0.1]))
    written = export_hf(model, tmp_path / "hf")
    assert written.remote_code
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "gptlab"
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True, dtype=torch.float32)
    assert_same_logits(model, reference, ids())
    prompt = [5, 8, 13, 21]  # transformers' generate() with our code's cache, against gptlab's KV cache
    assert generate(model, [prompt], SamplingConfig(max_new_tokens=6, temperature=0)) == [hf_greedy(reference, prompt, 6)]
    back = load_pretrained_directory(tmp_path / "hf")
    assert back.config == model.config
    assert_same_weights(model, back)
    if moe.get("capacity_factor"):  # capacity cuts in training only, in both codes: the same drops there
        assert_same_training_logits(model, reference, ids())


def assert_same_training_logits(ours, reference, idx: torch.Tensor) -> None:
    with torch.no_grad():
        logits, _ = ours.train()(idx)
        expected = reference.train()(idx).logits
    assert sum(float(layer.pop_stats()["dropped"]) for layer in ours.moe_layers()) > 0  # assignments were dropped
    torch.testing.assert_close(logits, expected, atol=2e-5, rtol=1e-5)


def test_export_moe_without_bias_update_but_a_bias_writes_custom_code(tmp_path):
    model = moe_model()
    model.moe_layers()[0].route_bias[0] = 1.0
    assert export_hf(model, tmp_path / "hf").remote_code
