"""PPO's pieces against hand computations: per-token rewards, GAE, the KL controllers, and the clipped policy
and value losses against their formulas written one token at a time (value and gradient)."""

import pytest
import torch

from gptlab.align.rl.ppo import PolicyAndValue
from gptlab.align.rl.ppo_loss import AdaptiveKLController, FixedKLController, PPOConfig, gae, ppo_loss, token_rewards, value_loss
from gptlab.align.rl.ppo_rollouts import explained_variance, left_align, place
from gptlab.align.rl.rollout import pad_rows
from gptlab.align.rl.scalar import ScalarModel
from gptlab.model import GPT, preset
from gptlab.runtime import GptlabError


def test_token_rewards_are_the_kl_penalty_with_the_score_at_each_rows_last_token():
    kl = torch.tensor([[0.5, -0.25, 1.0], [2.0, 0.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    rewards = token_rewards(torch.tensor([1.0, 2.0]), kl, mask, beta=0.1)
    expected = [[-0.05, 0.025, -0.1 + 1.0], [-0.2, 0.0 + 2.0, 0.0]]  # the padding gets neither penalty nor score
    torch.testing.assert_close(rewards, torch.tensor(expected))


def test_gae_matches_a_hand_computation():
    rewards = torch.tensor([[0.1, -0.2, 1.0], [0.0, 2.0, 5.0]])
    values = torch.tensor([[0.5, 0.4, 0.3], [1.0, -1.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # row 2 ends after 2 tokens: its third column is padding
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # row 1: δ2 = 1 - 0.3 = 0.7; δ1 = -0.2 + 0.9·0.3 - 0.4 = -0.33; δ0 = 0.1 + 0.9·0.4 - 0.5 = -0.04
    #        A2 = 0.7; A1 = -0.33 + 0.72·0.7 = 0.174; A0 = -0.04 + 0.72·0.174 = 0.08528
    # row 2: δ1 = 2 - (-1) = 3; δ0 = 0 + 0.9·(-1) - 1 = -1.9; A1 = 3; A0 = -1.9 + 0.72·3 = 0.26
    torch.testing.assert_close(advantages, torch.tensor([[0.08528, 0.174, 0.7], [0.26, 3.0, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[0.58528, 0.574, 1.0], [1.26, 2.0, 0.0]]))


def test_gae_with_gamma_and_lambda_one_is_the_return_to_go_minus_the_value():
    torch.manual_seed(0)
    rewards, values = torch.randn(3, 5), torch.randn(3, 5)
    mask = torch.ones(3, 5)
    advantages, returns = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    to_go = rewards.flip(1).cumsum(1).flip(1)
    torch.testing.assert_close(advantages, to_go - values)
    torch.testing.assert_close(returns, to_go)


def test_adaptive_kl_controller_follows_its_formula():
    controller = AdaptiveKLController(0.05, target=6.0, horizon=10000)
    controller.update(9.0, 16)  # 9/6 - 1 = 0.5, clipped to 0.2
    assert controller.value == pytest.approx(0.05 * (1 + 0.2 * 16 / 10000))
    controller.update(5.4, 16)  # 5.4/6 - 1 = -0.1
    assert controller.value == pytest.approx(0.05 * (1 + 0.2 * 16 / 10000) * (1 - 0.1 * 16 / 10000))
    fixed = FixedKLController(0.05)
    fixed.update(100.0, 16)
    assert fixed.value == 0.05


def test_value_loss_keeps_the_larger_of_the_plain_and_clipped_errors():
    old = torch.tensor([0.0, 0.0, 0.0])
    new = torch.tensor([0.5, 0.1, -0.5])
    returns = torch.tensor([1.0, 0.0, 0.0])
    loss, clipped = value_loss(new, old, returns, 0.2)
    # 1: plain (0.5-1)² = 0.25, clipped (0.2-1)² = 0.64 -> 0.64; 2: inside the range, both 0.01; 3: plain 0.25, clipped 0.04
    torch.testing.assert_close(loss, 0.5 * torch.tensor([0.64, 0.01, 0.25]))
    assert clipped.tolist() == [True, False, False]


def brute_loss(model, sequences, starts, batch_rows, config):
    """PPO's minibatch loss written out token by token: the mean over every completion token of the clipped
    surrogate plus vf_coef × the clipped value error."""
    terms = []
    for i, (sequence, start) in enumerate(zip(sequences, starts)):
        logits, values = model(torch.tensor([sequence[:-1]]))
        log_softmax = torch.log_softmax(logits[0].float(), dim=-1)
        for k, t in enumerate(range(start, len(sequence))):
            row = batch_rows[i]
            logp, value = log_softmax[t - 1, sequence[t]], values[0, t - 1]
            ratio = torch.exp(logp - row["old_logp"][k])
            advantage = row["advantages"][k]
            surrogate = torch.minimum(ratio * advantage, ratio.clamp(1 - config.cliprange, 1 + config.cliprange) * advantage)
            old_value, target = row["old_values"][k], row["returns"][k]
            clipped_value = old_value + (value - old_value).clamp(-config.cliprange_value, config.cliprange_value)
            error = 0.5 * torch.maximum((value - target) ** 2, (clipped_value - target) ** 2)
            terms.append(-surrogate + config.vf_coef * error)
    return torch.stack(terms).mean()


@pytest.mark.parametrize("shared", [False, True])
def test_ppo_loss_equals_its_formula_token_by_token_in_value_and_gradient(shared):
    torch.manual_seed(0)
    policy = GPT(preset("gpt2-tiny", vocab_size=40, block_size=32))
    model = PolicyAndValue(policy, None if shared else ScalarModel(GPT(preset("gpt2-tiny", vocab_size=40, block_size=32))))
    sequences = [[1, 2, 3, 4, 5, 6], [1, 2, 7, 8], [3, 3, 9, 10, 11, 12, 13], [5, 6, 7, 8, 9]]
    starts = [3, 2, 2, 4]
    x, y = pad_rows(sequences, starts, 8)
    with torch.no_grad():
        logits, values = model(x)
        from gptlab.align.logprobs import logits_logprobs

        current = logits_logprobs(logits, y)
    generator = torch.Generator().manual_seed(1)
    rows = []
    for i, (sequence, start) in enumerate(zip(sequences, starts)):
        n = len(sequence) - start
        counted = y[i] != -100
        rows.append({"old_logp": (current[i][counted] + 0.3 * torch.randn(n, generator=generator) * (i % 2)).tolist(),
                     "old_values": (values[i][counted] + 0.4 * torch.randn(n, generator=generator)).tolist(),
                     "advantages": torch.randn(n, generator=generator).tolist(), "returns": torch.randn(n, generator=generator).tolist()})
    config = PPOConfig(cliprange=0.2, cliprange_value=0.1, vf_coef=0.5)
    batch = {name: place([row[name] for row in rows], y) for name in rows[0]}
    total = (y != -100).sum().item()
    batch["weights"] = (y != -100).float() / total
    ours = 0
    for part in (slice(0, 3), slice(3, 4)):  # two micro-batches: the weights hold the minibatch's mean
        logits, values = model(x[part])
        parts = ppo_loss(logits_logprobs(logits, y[part]), values, {k: v[part] for k, v in batch.items()}, config)
        ours = ours + parts.loss
    expected = brute_loss(model, sequences, starts, rows, config)
    assert ours.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-7)
    parameters = [p for p in model.parameters() if p.requires_grad]
    our_grads = torch.autograd.grad(ours, parameters, allow_unused=True)
    expected_grads = torch.autograd.grad(expected, parameters, allow_unused=True)
    for mine, theirs in zip(our_grads, expected_grads):
        if theirs is None:
            assert mine is None or mine.abs().sum() == 0
        else:
            torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-6)


def test_ppo_loss_reports_clipped_shares_and_the_approximate_kl():
    logp = torch.tensor([[0.0, 0.0, 0.0, 0.0]])
    batch = {"old_logp": torch.tensor([[0.0, -0.5, 0.5, 0.0]]), "advantages": torch.tensor([[1.0, 1.0, 1.0, 0.0]]),
             "old_values": torch.zeros(1, 4), "returns": torch.tensor([[0.0, 1.0, 0.0, 0.0]]), "weights": torch.tensor([[0.25, 0.25, 0.25, 0.0]])}
    parts = ppo_loss(logp, torch.tensor([[0.0, 0.5, 0.0, 9.0]]), batch, PPOConfig())
    assert parts.sums["tokens"] == 3  # the fourth token weighs 0: not a completion token
    assert parts.sums["clipfrac"] == 1  # ratio e^0.5 with A > 0 clips; e^-0.5 with A > 0 does not
    assert parts.sums["value_clipfrac"] == 1  # 0.5 from 0 leaves the 0.2 range, and the clipped 0.2 is further from 1
    assert parts.sums["approx_kl"] == pytest.approx(0.5 * (0.25 + 0.25))


def test_left_align_and_place_are_inverse():
    x, y = pad_rows([[1, 2, 3, 4, 5], [1, 2, 3]], [2, 1], 6)
    values = torch.arange(10, dtype=torch.float32).view(2, 5) * (y != -100)
    aligned = left_align(values, y)
    assert aligned.tolist() == [[1.0, 2.0, 3.0], [5.0, 6.0, 0.0]]
    torch.testing.assert_close(place([[1.0, 2.0, 3.0], [5.0, 6.0]], y), values)


def test_explained_variance_is_one_for_a_perfect_value_and_zero_for_the_mean():
    returns = torch.tensor([[1.0, 2.0, 3.0]])
    mask = torch.ones(1, 3)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full((1, 3), 2.0), returns, mask) == pytest.approx(0.0)


def test_ppo_config_refuses_bad_settings_in_one_line():
    for changes, message in [({"value_model": "tied"}, "unknown value_model"), ({"rollout_prompts": 6, "minibatches": 4}, "divide"),
                             ({"value_model": "shared", "value_init": "rm"}, "--value-init"), ({"lam": 1.5}, "lam"),
                             ({"kl_coef": -1.0}, "kl_coef")]:
        with pytest.raises(GptlabError, match=message):
            PPOConfig(**changes)
