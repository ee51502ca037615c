"""Muon: Newton-Schulz and the update against torch.optim.Muon, AdamW's groups against torch.optim.AdamW,
the singular values it produces, and training with it (the schedule, exact resume)."""

import dataclasses
import shutil

import pytest
import torch
from torch.optim._muon import _zeropower_via_newtonschulz

from gptlab.model import GPT, preset
from gptlab.runtime import GptlabError
from gptlab.train import Trainer
from gptlab.train.muon import NS_COEFFICIENTS, MuonAdamW, newton_schulz
from gptlab.train.optim import OptimizerConfig, build_optimizer

from .conftest import tiny_config


@pytest.mark.parametrize("shape", [(16, 48), (48, 16), (32, 32)])
def test_newton_schulz_equals_torch_and_pushes_singular_values_towards_one(shape):
    torch.manual_seed(0)
    update = torch.randn(shape)
    ours = newton_schulz(update)
    assert torch.equal(ours, _zeropower_via_newtonschulz(update, NS_COEFFICIENTS, 5, 1e-7))
    singular = torch.linalg.svdvals(ours.float())
    assert singular.min() > 0.5 and singular.max() < 1.5  # U S' V^T with S' near 1, not the SVD's spread
    u, _, v = torch.linalg.svd(update, full_matrices=False)
    assert torch.nn.functional.cosine_similarity(ours.float().flatten(), (u @ v).flatten(), dim=0) > 0.9


def test_muon_groups_update_as_torch_muon_and_the_rest_as_torch_adamw():
    torch.manual_seed(0)
    matrices = [torch.nn.Parameter(torch.randn(24, 40)), torch.nn.Parameter(torch.randn(40, 24))]
    vectors = [torch.nn.Parameter(torch.randn(24))]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in matrices + vectors]
    ours = MuonAdamW([{"params": matrices, "muon": True, "lr": 0.02, "weight_decay": 0.1},
                      {"params": vectors, "lr": 3e-3, "weight_decay": 0.0}], momentum=0.95, betas=(0.9, 0.95), eps=1e-8)
    muon = torch.optim.Muon(twins[:2], lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True)
    adamw = torch.optim.AdamW(twins[2:], lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    for _ in range(5):
        grads = [torch.randn_like(p) for p in matrices + vectors]
        for p, twin, grad in zip(matrices + vectors, twins, grads):
            p.grad, twin.grad = grad.clone(), grad.clone()
        ours.step(), muon.step(), adamw.step()
    for p, twin in zip(matrices + vectors, twins):
        assert torch.equal(p, twin)


def test_muon_takes_the_blocks_matrices_and_the_schedule_scales_its_own_peak(prepared, tmp_path):
    model = GPT(preset("gpt2-tiny", vocab_size=64, block_size=16))
    optimizer = build_optimizer(model, OptimizerConfig(kind="muon", lr=3e-3, muon_lr=0.03))
    muon_group, *rest = optimizer.param_groups
    hidden = {id(p) for p in model.transformer["h"].parameters() if p.dim() == 2}
    assert {id(p) for p in muon_group["params"]} == hidden and muon_group["lr_ratio"] == pytest.approx(10)
    assert id(model.transformer["wte"].weight) in {id(p) for group in rest for p in group["params"]}
    config = tiny_config(prepared, tmp_path / "run", optimizer=OptimizerConfig(kind="muon", lr=3e-3, muon_lr=0.03),
                         max_steps=3, checkpoint_every=0)
    trainer = Trainer(config, log=lambda *_: None)
    result = trainer.fit()
    groups = trainer.optimizer.param_groups
    assert result.status == "finished" and groups[0]["lr"] == pytest.approx(10 * groups[1]["lr"])
    with pytest.raises(GptlabError, match="muon needs impl auto or gptlab"):
        OptimizerConfig(kind="muon", impl="torch")


def test_training_with_muon_resumes_exactly(prepared, tmp_path):
    config = tiny_config(prepared, tmp_path / "straight", optimizer=OptimizerConfig(kind="muon", lr=3e-3), max_steps=6)
    straight = Trainer(config, log=lambda *_: None).fit()
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step_000006")
    resumed = Trainer(dataclasses.replace(config, out=str(tmp_path / "resumed")), log=lambda *_: None).fit()
    assert resumed.losses == straight.losses[3:]


def test_newton_schulz_in_fp32_is_the_quintic_iteration_computed_directly():
    torch.manual_seed(1)
    update = torch.randn(20, 36)
    x = update.double() / update.double().norm()
    a, b, c = NS_COEFFICIENTS
    for _ in range(5):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    torch.testing.assert_close(newton_schulz(update, dtype=torch.float32).double(), x, rtol=1e-4, atol=1e-5)
    with pytest.raises(GptlabError, match="muon_precision"):
        OptimizerConfig(kind="muon", muon_precision="fp8")


def test_muon_precision_auto_is_bf16_on_cuda_and_fp32_on_cpu():
    model = GPT(preset("gpt2-tiny", vocab_size=64, block_size=16))
    config = OptimizerConfig(kind="muon")
    assert build_optimizer(model, config, "cpu").ns_dtype == torch.float32
    assert build_optimizer(model, config, "cuda").ns_dtype == torch.bfloat16
    assert build_optimizer(model, dataclasses.replace(config, muon_precision="bf16"), "cpu").ns_dtype == torch.bfloat16
