"""The fused, chunked head + cross-entropy against GPT.forward's unfused loss: values and gradients."""

import pytest
import torch

from gptlab.model import GPT, preset
from gptlab.model import loss as fused


def grads(model, idx, targets, **kwargs):
    model.zero_grad()
    logits, loss = model(idx, targets, **kwargs)
    loss.backward()
    return logits, loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("tie, softcap, reduction", [(True, 0.0, "mean"), (False, 15.0, "mean"), (False, 3.0, "sum")])
def test_fused_loss_equals_the_unfused_in_value_and_gradient(monkeypatch, tie, softcap, reduction):
    monkeypatch.setattr(fused, "chunk_rows", lambda vocab, width: 64)  # several chunks per batch, the last one short
    torch.manual_seed(0)
    model = GPT(preset("gpt2-tiny", vocab_size=500, tie_embeddings=tie, logit_softcap=softcap))  # padded to 512 rows
    assert model.lm_head.weight.size(0) > 500
    idx = torch.randint(0, 500, (3, 50))
    targets = idx.roll(-1, 1)
    targets[0, :7] = -100  # ignored: prompt tokens in fine-tuning
    _, expected, expected_grads = grads(model, idx, targets, loss_reduction=reduction)
    logits, loss, got_grads = grads(model, idx, targets, loss_reduction=reduction, fused_loss=True)
    assert logits is None
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    head = "transformer.wte.weight" if tie else "lm_head.weight"
    assert got_grads[head][500:].abs().max() == 0  # padded rows are never seen


def test_fused_loss_scales_with_the_incoming_gradient_and_falls_back_without_gradients():
    torch.manual_seed(0)
    model = GPT(preset("gpt2-tiny"))
    idx = torch.randint(0, 512, (2, 16))
    _, loss = model(idx, idx, fused_loss=True)
    (3 * loss).backward()
    scaled = model.lm_head.weight.grad.clone()
    model.zero_grad()
    _, loss = model(idx, idx)
    loss.backward()
    torch.testing.assert_close(scaled, 3 * model.lm_head.weight.grad)
    with torch.no_grad():
        logits, loss = model(idx, idx, fused_loss=True)
    assert logits.shape == (2, 16, 512) and torch.isfinite(loss)
    with pytest.raises(ValueError, match="reduction"):
        fused.linear_cross_entropy(torch.zeros(2, 4), torch.zeros(3, 4), torch.zeros(2, dtype=torch.long), 3, reduction="none")


def test_fused_loss_under_bf16_autocast_is_close_to_the_unfused():
    torch.manual_seed(0)
    model = GPT(preset("gpt2-tiny", tie_embeddings=False, logit_softcap=15.0))
    idx = torch.randint(0, 512, (2, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, expected, expected_grads = grads(model, idx, idx)
        _, loss, got_grads = grads(model, idx, idx, fused_loss=True)
    torch.testing.assert_close(loss, expected, rtol=2e-2, atol=2e-2)
    for name in ("lm_head.weight", "transformer.wte.weight"):
        torch.testing.assert_close(got_grads[name], expected_grads[name], rtol=5e-2, atol=2e-3, msg=name)
