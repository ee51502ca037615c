"""The model's `attention` and `norm_impl` choices: the same logits and gradients as the defaults, masked calls
(sliding window, KV cache) left to SDPA, clear errors for a bad choice, older config files still load."""

import dataclasses

import pytest
import torch

from gptlab.model import GPT, KVCache, ModelConfig, preset
from gptlab.model.io import config_from_dict
from gptlab.runtime import GptlabError


def build(config: ModelConfig) -> GPT:
    """A model whose norm weights are perturbed too, so a norm kernel that ignored its weight would show."""
    torch.manual_seed(0)
    model = GPT(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return model


def logits_loss_and_grads(config: ModelConfig, idx: torch.Tensor):
    model = build(config).to(idx.device)
    logits, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    return logits.detach(), loss.detach(), {name: p.grad for name, p in model.named_parameters()}


def assert_same_model_outputs(ours, reference):
    torch.testing.assert_close(ours[0], reference[0], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(ours[1], reference[1], atol=2e-6, rtol=1e-6)
    for name, grad in reference[2].items():
        torch.testing.assert_close(ours[2][name], grad, atol=2e-6, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")


def ids(config: ModelConfig, B: int = 2, T: int = 34) -> torch.Tensor:
    return torch.randint(0, config.vocab_size, (B, T), generator=torch.Generator().manual_seed(1))


def tiny(**changes) -> ModelConfig:
    """llama-tiny with one layer, QK-norm (more RMSNorms) and grouped-query attention (4 query heads, 2 kv heads)."""
    return preset("llama-tiny", n_layer=1, qk_norm=True, **changes)


def test_model_with_flash_attention_equals_the_default():
    idx = ids(tiny())
    assert_same_model_outputs(logits_loss_and_grads(tiny(attention="flash"), idx), logits_loss_and_grads(tiny(), idx))


@pytest.mark.parametrize(("attention", "norm_impl"), [("triton", "torch"), ("triton", "triton")])
def test_model_with_triton_kernels_equals_the_default(triton_device, attention, norm_impl):
    idx = ids(tiny(), T=18).to(triton_device)
    ours = logits_loss_and_grads(tiny(attention=attention, norm_impl=norm_impl), idx)
    assert_same_model_outputs(ours, logits_loss_and_grads(tiny(), idx))


def test_model_set_attention_switches_to_flash_and_back():
    config = tiny()
    model = build(config).eval()
    idx = ids(config)
    with torch.no_grad():
        flash, _ = model.set_attention("flash")(idx)
        sdpa, _ = model.set_attention("sdpa")(idx)
    torch.testing.assert_close(flash, sdpa, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", ["flash", "triton"])
def test_model_kernels_cut_sliding_windows_and_leave_the_kv_cache_to_sdpa(attention, request):
    """Sliding-window layers go to the kernels with their window, decoding passes a mask and goes to SDPA:
    the logits, the gradients and the cached decode equal the default's."""
    device = request.getfixturevalue("triton_device") if attention == "triton" else torch.device("cpu")
    config = preset("llama-tiny", n_layer=2, attn_window=5, window_pattern="SL", attention=attention)
    reference = dataclasses.replace(config, attention="sdpa")
    idx = ids(config, T=21).to(device)
    ours = logits_loss_and_grads(config, idx)
    assert_same_model_outputs(ours, logits_loss_and_grads(reference, idx))
    model = build(config).to(device).eval()
    with torch.no_grad():
        cache = KVCache(config, batch_size=2, device=device)
        steps = [model(idx[:, :12], cache=cache)[0]]  # prefill into an empty cache: the kernels; then decoding: SDPA
        steps += [model(idx[:, t : t + 1], cache=cache)[0] for t in range(12, 20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), ours[0], atol=2e-5, rtol=1e-5)


def test_model_with_triton_where_its_kernels_cannot_run_computes_the_same_in_pytorch(monkeypatch):
    """A model trained with the Triton kernels on a GPU, loaded on a CPU without Triton's interpreter: SDPA and
    torch's RMSNorm compute it, windows included, and no kernel is called."""
    import gptlab.model.gpt as gpt

    def no_kernel(*args, **kwargs):
        raise AssertionError("a Triton kernel was called")

    monkeypatch.setattr(gpt, "triton_runs_on", lambda device: False)
    monkeypatch.setattr(gpt, "triton_flash_attention", no_kernel)
    monkeypatch.setattr(gpt, "triton_rms_norm", no_kernel)
    config = preset("llama-tiny", n_layer=2, qk_norm=True, attn_window=5, window_pattern="SL")
    idx = ids(config, T=21)
    ours = logits_loss_and_grads(dataclasses.replace(config, attention="triton", norm_impl="triton"), idx)
    assert_same_model_outputs(ours, logits_loss_and_grads(config, idx))


@pytest.mark.parametrize(("changes", "message"), [
    (dict(attention="fast"), "unknown attention 'fast'; use one of sdpa, math, flash, triton"),
    (dict(norm_impl="cuda"), "unknown norm_impl 'cuda'; use one of torch, triton"),
    (dict(attention="flash", dropout=0.1), "attention 'flash' has no attention dropout"),
    (dict(norm_impl="triton", norm="layer"), "norm_impl 'triton' fuses RMSNorm, and this model has none"),
])
def test_model_config_refuses_an_unknown_or_impossible_kernel_choice(changes, message):
    with pytest.raises(GptlabError, match=message):
        preset("llama-tiny", **changes)


def test_model_config_from_an_older_file_gets_the_default_kernels():
    """A config.json written before these fields existed loads as SDPA and torch RMSNorm, as the model ran then."""
    saved = dataclasses.asdict(preset("llama-tiny"))
    del saved["attention"], saved["norm_impl"]
    config = config_from_dict(saved)
    assert (config.attention, config.norm_impl) == ("sdpa", "torch")
    assert config == preset("llama-tiny")


def test_kernels_import_without_triton_and_say_how_to_get_it(monkeypatch):
    import subprocess
    import sys

    code = "import sys, gptlab.kernels, gptlab.model; print('triton' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"  # importing gptlab does not import triton
    from gptlab.kernels import triton_rms_norm

    monkeypatch.setitem(sys.modules, "triton", None)  # as if not installed: `import triton` fails
    monkeypatch.delitem(sys.modules, "gptlab.kernels.triton_rmsnorm", raising=False)
    with pytest.raises(GptlabError, match="needs the triton package, from gptlab's 'kernels' extra: make install-kernels"):
        triton_rms_norm(torch.ones(2, 16), torch.ones(16), 1e-5)
