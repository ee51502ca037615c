"""AdamW against torch.optim.AdamW, parameter groups, and the learning-rate schedules."""

import io
import math

import pytest
import torch

from gptlab.model import GPT, preset
from gptlab.runtime import GptlabError
from gptlab.train.optim import AdamW, OptimizerConfig, build_optimizer, parameter_groups
from gptlab.train.schedule import ScheduleConfig, learning_rate


def train_steps(model, optimizer, steps=20, seed=0):
    generator = torch.Generator().manual_seed(seed)
    for step in range(steps):
        idx = torch.randint(0, 512, (2, 16), generator=generator)
        for group in optimizer.param_groups:
            group["lr"] = 1e-3 * (1 + step % 3)  # the schedule changes lr between steps
        _, loss = model(idx, idx)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


@pytest.mark.parametrize("betas, eps, decay", [((0.9, 0.95), 1e-8, 0.1), ((0.8, 0.999), 1e-6, 0.0)])
def test_adamw_matches_torch_update_for_update(betas, eps, decay):
    torch.manual_seed(0)
    ours_model = GPT(preset("gpt2-tiny"))
    torch_model = GPT(preset("gpt2-tiny"))
    torch_model.load_state_dict(ours_model.state_dict())
    ours = AdamW(parameter_groups(ours_model, decay), betas=betas, eps=eps)
    theirs = torch.optim.AdamW(parameter_groups(torch_model, decay), betas=betas, eps=eps)
    train_steps(ours_model, ours)
    train_steps(torch_model, theirs)
    for (name, a), b in zip(ours_model.state_dict().items(), torch_model.state_dict().values()):
        assert torch.equal(a, b), name  # bit for bit: same operations in the same order
    # The state dicts have the same layout, so an optimizer state moves between the two.
    theirs.load_state_dict(ours.state_dict())


def test_adamw_state_round_trip_continues_identically():
    torch.manual_seed(0)
    a, b = GPT(preset("gpt2-tiny")), GPT(preset("gpt2-tiny"))
    b.load_state_dict(a.state_dict())
    opt_a = AdamW(parameter_groups(a, 0.1))
    train_steps(a, opt_a, steps=5)
    b.load_state_dict(a.state_dict())
    opt_b = AdamW(parameter_groups(b, 0.1))
    buffer = io.BytesIO()  # through a file, as a checkpoint does (in memory, torch would share the tensors)
    torch.save(opt_a.state_dict(), buffer)
    buffer.seek(0)
    opt_b.load_state_dict(torch.load(buffer, weights_only=True))
    train_steps(a, opt_a, steps=5, seed=1)
    train_steps(b, opt_b, steps=5, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_weight_decay_applies_to_matrices_only():
    model = GPT(preset("gpt2-tiny"))
    decay, no_decay = parameter_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in decay["params"]} >= {"transformer.wte.weight", "transformer.h.0.attn.c_attn.weight"}
    assert "transformer.h.0.ln_1.bias" in {names[id(p)] for p in no_decay["params"]}
    total = sum(p.numel() for p in decay["params"] + no_decay["params"])
    assert total == model.num_params()  # the tied embedding counted once
    decay, _ = parameter_groups(model, 0.1, decay_embeddings=False)
    assert "transformer.wte.weight" not in {names[id(p)] for p in decay["params"]}


def test_build_optimizer_choices():
    model = GPT(preset("gpt2-tiny"))
    assert isinstance(build_optimizer(model, OptimizerConfig(impl="gptlab")), AdamW)
    assert build_optimizer(model, OptimizerConfig(), "cpu").defaults["fused"]
    assert build_optimizer(model, OptimizerConfig(), "mps").defaults["foreach"]
    assert isinstance(build_optimizer(model, OptimizerConfig(impl="foreach")), torch.optim.AdamW)
    with pytest.raises(GptlabError, match="needs one of cpu, cuda"):
        build_optimizer(model, OptimizerConfig(impl="fused"), "mps")
    with pytest.raises(GptlabError, match="unknown optimizer"):
        OptimizerConfig(impl="sgd")


def test_cosine_schedule_warms_up_then_decays_to_min():
    config = ScheduleConfig(kind="cosine", warmup_steps=10, min_lr_ratio=0.1)
    lrs = [learning_rate(step, 1.0, 110, config) for step in range(111)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.1 + 0.5 * 0.9)  # half-way through the decay: cos(pi/2) = 0
    assert lrs[110] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))


def test_constant_and_wsd_schedules():
    assert [learning_rate(s, 2.0, 100, ScheduleConfig(kind="constant", warmup_steps=4)) for s in (0, 3, 50, 99)] == [0.5, 2.0, 2.0, 2.0]
    wsd = ScheduleConfig(kind="wsd", warmup_steps=0, min_lr_ratio=0.0, decay_fraction=0.2)
    assert learning_rate(79, 1.0, 100, wsd) == 1.0
    assert learning_rate(90, 1.0, 100, wsd) == pytest.approx(0.5)
    assert learning_rate(100, 1.0, 100, wsd) == pytest.approx(0.0)
    with pytest.raises(GptlabError):
        ScheduleConfig(kind="linear")
    assert math.isfinite(learning_rate(5, 1.0, 0, ScheduleConfig()))


def test_schedule_warmup_is_what_its_docstring_says():
    """The module docstring's worked example: 4 warmup steps give 0.25, 0.5, 0.75, 1.0 times max_lr; never 0."""
    import gptlab.train.schedule as schedule

    assert "0.25, 0.5, 0.75, 1.0" in schedule.__doc__
    for kind in ("cosine", "constant", "wsd"):
        config = ScheduleConfig(kind=kind, warmup_steps=4)
        assert [learning_rate(step, 2.0, 100, config) for step in range(4)] == [0.5, 1.0, 1.5, 2.0]


@pytest.mark.parametrize("kind", ["cosine", "wsd"])
def test_a_time_budget_moves_the_schedule_to_the_step_it_corresponds_to(kind):
    """A run stopped by its time limit ends annealed: the spent share of the budget counts as that share of the steps."""
    config = ScheduleConfig(kind=kind, warmup_steps=10, min_lr_ratio=0.1)
    for step, spent in [(20, 0.0), (20, 0.1), (20, 0.5), (30, 0.2), (60, 0.95)]:
        expected = learning_rate(max(step, round(spent * 1000)), 1.0, 1000, config)
        assert learning_rate(step, 1.0, 1000, config, time_fraction=spent) == pytest.approx(expected)
    assert learning_rate(20, 1.0, 1000, config, time_fraction=1.0) == pytest.approx(0.1)
    assert learning_rate(20, 1.0, 1000, config, time_fraction=3.0) == pytest.approx(0.1)  # never below min_lr
    assert learning_rate(3, 1.0, 1000, config, time_fraction=0.9) == pytest.approx(0.4)  # warmup stays in steps


def test_the_default_fused_adamw_matches_the_readable_one():
    """impl auto (torch's fused kernel, the default) and impl gptlab (the reference) agree within float rounding."""
    torch.manual_seed(0)
    ours_model, fused_model = GPT(preset("gpt2-tiny")), GPT(preset("gpt2-tiny"))
    fused_model.load_state_dict(ours_model.state_dict())
    start = {name: tensor.clone() for name, tensor in ours_model.state_dict().items()}
    ours = build_optimizer(ours_model, OptimizerConfig(impl="gptlab", lr=1e-3), "cpu")
    fused = build_optimizer(fused_model, OptimizerConfig(lr=1e-3), "cpu")
    assert isinstance(fused, torch.optim.AdamW) and fused.defaults["fused"]
    train_steps(ours_model, ours)
    train_steps(fused_model, fused)
    moved = 0.0
    for (name, a), b in zip(ours_model.state_dict().items(), fused_model.state_dict().values()):
        # 1e-4: the key biases get gradients near 0 (softmax ignores them), where m / sqrt(v) amplifies rounding
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-4 if name.endswith("c_attn.bias") else 1e-6, msg=name)
        moved = max(moved, float((a - start[name]).abs().max()))
    assert moved > 1e-3  # the steps did move the weights: the agreement is not two untouched copies


def test_embedding_and_head_lrs_update_as_torch_adamw_with_those_lrs():
    """embedding_lr and head_lr: the tables and the untied head step as torch AdamW at those peaks, the rest at lr,
    every group following the schedule (the Trainer sets lr x lr_ratio)."""
    torch.manual_seed(0)
    ours_model, ref_model = GPT(preset("gpt2-tiny", tie_embeddings=False)), GPT(preset("gpt2-tiny", tie_embeddings=False))
    ref_model.load_state_dict(ours_model.state_dict())
    config = OptimizerConfig(lr=1e-3, embedding_lr=0.05, head_lr=4e-3, impl="torch")
    ours = build_optimizer(ours_model, config, "cpu")
    own = {id(m.weight) for m in ref_model.modules() if isinstance(m, torch.nn.Embedding)} | {id(ref_model.lm_head.weight)}
    decay, no_decay = (group["params"] for group in parameter_groups(ref_model, 0.1))
    peaks = {id(p): 0.05 for m in ref_model.modules() if isinstance(m, torch.nn.Embedding) for p in [m.weight]}
    peaks[id(ref_model.lm_head.weight)] = 4e-3
    groups = [{"params": [p], "weight_decay": 0.1, "peak": peaks[id(p)]} for p in decay if id(p) in own]
    groups += [{"params": [p for p in decay if id(p) not in own], "weight_decay": 0.1, "peak": 1e-3},
               {"params": no_decay, "weight_decay": 0.0, "peak": 1e-3}]
    ref = torch.optim.AdamW(groups, betas=config.betas, eps=config.eps)
    generator = torch.Generator().manual_seed(0)
    for step in range(10):
        scale = 1 + step % 3  # the schedule's multiplier changes between steps
        for group in ours.param_groups:
            group["lr"] = 1e-3 * scale * group.get("lr_ratio", 1.0)
        for group in ref.param_groups:
            group["lr"] = group["peak"] * scale
        idx = torch.randint(0, 512, (2, 16), generator=generator)
        for model, optimizer in ((ours_model, ours), (ref_model, ref)):
            optimizer.zero_grad()
            model(idx, idx)[1].backward()
            optimizer.step()
    for (name, a), b in zip(ours_model.state_dict().items(), ref_model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)


def test_own_lrs_reach_muon_and_tied_heads_take_the_embedding_lr():
    untied = GPT(preset("gpt2-tiny", tie_embeddings=False))
    groups = build_optimizer(untied, OptimizerConfig(kind="muon", lr=2e-3, embedding_lr=0.1, head_lr=6e-3)).param_groups
    ratios = {id(p): group.get("lr_ratio", 1.0) for group in groups for p in group["params"]}
    assert ratios[id(untied.transformer["wte"].weight)] == pytest.approx(50)
    assert ratios[id(untied.lm_head.weight)] == pytest.approx(3)
    assert ratios[id(untied.transformer["h"][0].attn.c_attn.weight)] == pytest.approx(10)  # Muon's 0.02
    tied = GPT(preset("gpt2-tiny"))
    groups = build_optimizer(tied, OptimizerConfig(lr=2e-3, embedding_lr=0.1, head_lr=6e-3)).param_groups
    ratios = {id(p): group.get("lr_ratio", 1.0) for group in groups for p in group["params"]}
    assert ratios[id(tied.lm_head.weight)] == pytest.approx(50) and sum(len(g["params"]) for g in groups) == len(list(tied.parameters()))
    with pytest.raises(GptlabError, match="embedding_lr and head_lr"):
        OptimizerConfig(head_lr=-1.0)
