"""The public pieces of gptlab.align.logprobs, each against a brute-force reference: torch.distributions, a
log_softmax gather, and plain Python loops over the counted entries, in float32 (float64 for the references)."""

import math

import pytest
import torch

from gptlab.align.logprobs import (
    IGNORE,
    logits_logprobs,
    masked_mean,
    masked_normalize,
    masked_var,
    policy_gradient_loss,
    sequence_logprobs,
    token_entropy,
    token_logprobs,
    whiten,
)

B, T, V = 3, 5, 11


def random_logits(seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(B, T, V, generator=torch.Generator().manual_seed(seed), dtype=torch.float32) * scale


def random_mask(seed: int = 1) -> torch.Tensor:
    mask = torch.rand(B, T, generator=torch.Generator().manual_seed(seed)) < 0.6
    mask[0, 0] = True  # every row has at least one counted entry, and one row has a single one
    mask[1] = False
    mask[1, 2] = True
    return mask


class Logits(torch.nn.Module):
    """A module returning logits alone (not GPT's (logits, loss) pair): an embedding of (B, T) ids to (B, T, V)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(V, V)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.table(x) * scale


@pytest.mark.parametrize("rows", [3, 4096])  # 3: chunks end mid-batch (15 positions = 5 chunks of 3)
def test_token_entropy_equals_categorical_entropy(rows):
    logits = random_logits()
    expected = torch.distributions.Categorical(logits=logits.double()).entropy()
    got = token_entropy(logits, rows=rows)
    assert got.shape == (B, T) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


def test_token_entropy_of_uniform_and_of_a_near_certain_distribution():
    assert token_entropy(torch.zeros(2, V)).tolist() == pytest.approx([math.log(V)] * 2)
    sharp = torch.full((1, V), -1e4)
    sharp[0, 3] = 0.0
    assert token_entropy(sharp).item() == pytest.approx(0.0, abs=1e-6)


def test_token_logprobs_equals_log_softmax_gather_and_zero_at_ignored_targets():
    logits = random_logits(seed=2)
    y = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(3))
    y[0, 1] = y[2, 4] = IGNORE
    logp = logits_logprobs(logits, y)
    table = torch.log_softmax(logits.double(), dim=-1)
    for b in range(B):
        for t in range(T):
            expected = 0.0 if y[b, t] == IGNORE else table[b, t, y[b, t]].item()
            assert logp[b, t].item() == pytest.approx(expected, abs=1e-5)


def test_token_logprobs_of_a_logits_only_module_with_entropy_and_kwargs():
    torch.manual_seed(0)
    model = Logits()
    x = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(4))
    y = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(5))
    y[1, 0] = IGNORE
    logp, entropy = token_logprobs(model, x, y, entropy=True, scale=2.0)  # kwargs reach the module
    logits = model(x, scale=2.0)
    torch.testing.assert_close(logp, logits_logprobs(logits, y))
    torch.testing.assert_close(entropy, torch.distributions.Categorical(logits=logits.detach()).entropy())
    assert logp.requires_grad and not entropy.requires_grad  # the entropy is logged, never trained on
    torch.testing.assert_close(sequence_logprobs(model, x, y, scale=2.0), logp.sum(-1))
    logp.sum().backward()  # the log-probs carry the gradient back to the module
    assert model.table.weight.grad is not None and model.table.weight.grad.abs().sum() > 0


def loop_mean(values, mask, dim):
    """The masked mean by hand: over the counted entries of each slice (all of them when dim is None); 0 if none."""
    if dim is None:
        picked = [v for v, m in zip(values.flatten().tolist(), mask.flatten().tolist()) if m]
        return torch.tensor(sum(picked) / max(len(picked), 1))
    moved_v, moved_m = values.movedim(dim, -1), mask.movedim(dim, -1)
    out = [sum(v for v, m in zip(vs, ms) if m) / max(sum(ms), 1) for vs, ms in zip(moved_v.tolist(), moved_m.tolist())]
    return torch.tensor(out)


@pytest.mark.parametrize("dim", [None, 0, 1])
def test_masked_mean_and_normalize_equal_loops_over_the_counted_entries(dim):
    values, mask = random_logits(seed=6)[..., 0].double(), random_mask()
    torch.testing.assert_close(masked_mean(values, mask, dim), loop_mean(values, mask, dim).double())
    sums = loop_mean(values, mask, dim) * (mask.sum() if dim is None else mask.sum(dim).clamp(min=1))
    torch.testing.assert_close(masked_normalize(values, mask, 7.0, dim), sums.double() / 7.0)


def test_masked_mean_of_an_all_false_slice_is_zero_not_nan():
    values, mask = torch.ones(2, 3), torch.tensor([[True, False, True], [False, False, False]])
    assert masked_mean(values, mask, 1).tolist() == [1.0, 0.0]


@pytest.mark.parametrize("unbiased", [True, False])
def test_masked_var_equals_a_loop(unbiased):
    values, mask = random_logits(seed=7)[..., 0].double(), random_mask()
    picked = values[mask].tolist()
    mean = sum(picked) / len(picked)
    expected = sum((v - mean) ** 2 for v in picked) / (len(picked) - (1 if unbiased else 0))
    assert masked_var(values, mask, unbiased=unbiased).item() == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("shift_mean", [True, False])
def test_whiten_equals_a_loop(shift_mean):
    values, mask = random_logits(seed=8)[..., 0].double(), random_mask()
    picked = values[mask].tolist()
    mean = sum(picked) / len(picked)
    std = math.sqrt(sum((v - mean) ** 2 for v in picked) / (len(picked) - 1) + 1e-8)
    out = whiten(values, mask, shift_mean=shift_mean)
    for b in range(B):
        for t in range(T):
            expected = ((values[b, t].item() - mean) / std + (0 if shift_mean else mean)) if mask[b, t] else 0.0
            assert out[b, t].item() == pytest.approx(expected, rel=1e-9, abs=1e-12)
    if shift_mean:
        assert out[mask].mean().item() == pytest.approx(0.0, abs=1e-9)
        assert out[mask].var().item() == pytest.approx(1.0, rel=1e-6)


def test_whiten_of_a_constant_is_zero_not_nan():
    values, mask = torch.full((2, 4), 3.0), torch.tensor([[True, True, False, True], [True, False, False, False]])
    assert whiten(values, mask).tolist() == [[0.0] * 4] * 2
    kept = whiten(values, mask, shift_mean=False)  # the mean put back: 3 where counted, 0 elsewhere
    assert kept.tolist() == (3.0 * mask).tolist()


def loop_policy_loss(adv, logp, old, low, high):
    """Per-token -min(ρA, clip(ρ, 1-low, 1+high)A) by hand (ρ = 1 and no clip for REINFORCE's -A log π)."""
    loss, clipped = [], []
    for a, lp, o in zip(adv, logp, old):
        if o is None:
            loss.append(-a * lp)
            clipped.append(False)
            continue
        ratio = math.exp(lp - o)
        plain = ratio * a
        bounded = min(max(ratio, 1 - low), 1 + high) * a if low is not None else plain
        loss.append(-min(plain, bounded))
        clipped.append(bounded < plain)
    return loss, clipped


CASES = {"reinforce": (False, None, None), "ratio": (True, None, None), "clipped": (True, 0.2, 0.28), "symmetric": (True, 0.1, None),
         "high_only": (True, None, 0.1)}  # one bound alone clips both sides by it


@pytest.mark.parametrize("case", CASES)
def test_policy_gradient_loss_value_gradient_and_clipped_mask_equal_the_formula(case):
    with_old, clip_low, clip_high = CASES[case]
    low = clip_low if clip_low is not None else clip_high  # the bounds the reference applies
    high = clip_high if clip_high is not None else clip_low
    generator = torch.Generator().manual_seed(9)
    adv = torch.randn(B, 1, generator=generator, dtype=torch.float64)  # one advantage per response (GRPO), broadcast
    old = torch.randn(B, T, generator=generator, dtype=torch.float64) - 2.0
    logp = (old + torch.randn(B, T, generator=generator, dtype=torch.float64) * 0.4).requires_grad_()  # ratios either side
    loss, clipped = policy_gradient_loss(adv, logp, old if with_old else None, clip_low, clip_high)
    rows = [loop_policy_loss([adv[b, 0].item()] * T, logp[b].tolist(), old[b].tolist() if with_old else [None] * T,
                             low, high) for b in range(B)]
    torch.testing.assert_close(loss, torch.tensor([row[0] for row in rows], dtype=torch.float64))
    assert clipped.tolist() == [row[1] for row in rows]
    if low is not None:
        assert clipped.any() and not clipped.all()  # the inputs exercise both branches

    loss.sum().backward()
    step = 1e-6  # central differences of the hand formula, token by token
    for b in range(B):
        advantages, olds = [adv[b, 0].item()] * T, old[b].tolist() if with_old else [None] * T
        for t in range(T):
            ups, downs = logp[b].tolist(), logp[b].tolist()
            ups[t] += step
            downs[t] -= step
            up = loop_policy_loss(advantages, ups, olds, low, high)[0][t]
            down = loop_policy_loss(advantages, downs, olds, low, high)[0][t]
            assert logp.grad[b, t].item() == pytest.approx((up - down) / (2 * step), rel=1e-5, abs=1e-8)
    if low is not None:
        assert (logp.grad[clipped] == 0).all()  # a clipped token gets no gradient


def test_policy_gradient_loss_per_token_advantages_and_asymmetric_bounds():
    """One advantage per token (PPO), ρ = 1.25: a positive advantage is held at 1 + 0.2, a negative one is not (the
    min keeps the unclipped, lower value); ρ = 0.5 with a negative advantage is held at 1 - 0.3."""
    logp = torch.log(torch.tensor([[1.25, 1.25, 0.5, 0.5]]))
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]])
    loss, clipped = policy_gradient_loss(adv, logp, torch.zeros(1, 4), clip_low=0.3, clip_high=0.2)
    torch.testing.assert_close(loss, torch.tensor([[-1.2, 1.25, 0.7, -0.5]]))
    assert clipped.tolist() == [[True, False, True, False]]
