"""PPO's settings and its objective (RLHF as in Ziegler et al. 2019, InstructGPT, TRL's PPOTrainer and
"The N Implementation Details of RLHF with PPO", Huang et al. 2024): the config, the per-token rewards,
generalised advantage estimation, the KL coefficient's controllers and the clipped losses.

For one completion of T tokens, with the sampling policy's log-probs logp_t, the frozen reference's ref_t,
the value model's V_t and the reward's score s:

    kl_t      = logp_t - ref_t                                     (k1, per token)
    r_t       = -β·kl_t,  plus s at the last token                 (s less missing_eos_penalty when it did not stop)
    δ_t       = r_t + γ·V_{t+1} - V_t                              (V_T = 0 after the last token)
    A_t       = δ_t + γλ·A_{t+1}                                   (GAE, Schulman et al. 2016), returns R_t = A_t + V_t
    A         whitened over the rollout's completion tokens        (detail 7)
    policy    -min(ρ_t A_t, clip(ρ_t, 1 - ε, 1 + ε) A_t),  ρ_t = π/π_old   (gptlab.align.logprobs.policy_gradient_loss)
    value     ½·max((V'_t - R_t)², (clip(V'_t, V_t - ε_v, V_t + ε_v) - R_t)²) × vf_coef
    loss      the mean over the minibatch's completion tokens of policy + value

β is fixed, or adapted after each rollout towards a target KL (Ziegler et al.'s AdaptiveKLController):
β ← β·(1 + clip(KL/target - 1, -0.2, 0.2)·n/horizon), n the rollout's completions.
The pieces here are pure functions of tensors, tested against hand computations.
Not here: sampling and scoring rollouts (gptlab.align.rl.ppo_rollouts), the loop (gptlab.align.rl.ppo).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gptlab.align.logprobs import policy_gradient_loss
from gptlab.runtime import GptlabError
from gptlab.train.config import TrainConfig
from gptlab.train.optim import OptimizerConfig
from gptlab.train.schedule import ScheduleConfig

VALUE_MODELS = ("separate", "shared")
DEFAULT_TASK = "arithmetic[digits=1]"  # the prompts when neither --task nor --prompts is given


@dataclass(frozen=True, kw_only=True)
class PPOConfig(TrainConfig):
    """TrainConfig's fields (init_from is the chat model; batch_tokens follows from the minibatch), and these."""

    init_from: str = ""  # the chat model to improve, also the frozen reference: a run, checkpoint or model folder (--init)
    task: str = ""  # prompts, the verifier and held-out accuracy from a built-in task NAME[options] ("" and no prompts: arithmetic[digits=1])
    prompts: str = ""  # or prompts from a mixture spec (gptlab.align.rl.prompts): .jsonl files, hf:NAME[split=S], task:NAME[n=N]
    heldout_prompts: str = ""  # with prompts: the held-out prompts' spec (e.g. a test split); "": val_fraction of --prompts
    val_fraction: float = 0.05  # with prompts and no heldout_prompts: the share of each file held out (a task part: its test split)
    reward: str = "verifier"  # the score (gptlab.align.rl.rewards): rm:DIR, verifier, judge:URL, file.py:fn, weighted sums
    value_model: str = "separate"  # separate: a scalar head on a copy of the trunk | shared: a head on the policy's trunk
    value_init: str = ""  # separate only: start the value model from this reward model folder (gptlab rm), as TRL does
    rollout_prompts: int = 16  # completions per rollout (one per prompt), all ranks together
    minibatches: int = 2  # minibatches each rollout is cut into per epoch: one optimizer step each
    ppo_epochs: int = 2  # passes over each rollout (a new shuffle each): a rollout serves ppo_epochs x minibatches steps
    max_new_tokens: int = 32  # longest completion; one cut off here did not stop (missing_eos_penalty)
    temperature: float = 1.0  # sampling temperature of rollouts
    top_k: int = 0  # sample from the k likeliest tokens only (0: all)
    kl_coef: float = 0.05  # β: the per-token KL penalty's weight in the reward (the start of the adaptive one)
    kl_target: float = 0.0  # adaptive β aiming at this KL per completion (0: β stays fixed)
    kl_horizon: int = 10000  # completions over which the adaptive β may change by up to 20%
    gamma: float = 1.0  # γ: discount per token
    lam: float = 0.95  # λ: GAE's bias-variance trade-off
    cliprange: float = 0.2  # ε: the policy ratio is clipped to [1 - ε, 1 + ε]
    cliprange_value: float = 0.2  # ε_v: the new value may move this far from the rollout's before its error stops counting
    vf_coef: float = 0.1  # the value loss's weight
    whiten_advantages: bool = True  # whiten advantages over each rollout's completion tokens
    missing_eos_penalty: float = 0.0  # subtracted from the score of a completion that did not stop (0: off)
    train_examples: int = 5000  # the task's train prompts drawn from (fewer if the task has fewer)
    eval_examples: int = 100  # held-out prompts for the before/after measures
    eval_samples: int = 4  # samples per held-out prompt for pass@1 and pass@k (tasks) and the mean reward
    task_every: int = 0  # steps between held-out evaluations (0: only before and after)
    slots: int = 0  # requests the engine decodes together (0: the whole rollout at once)
    tools: str | None = "auto"  # tools run in rollouts: auto (the task's, when it offers them) | none | a spec (calculator, my.py)
    tool_calls: int = 8  # most tool calls per completion; the next one gets an error result
    tool_seconds: float = 20.0  # most seconds all tool calls of one completion may take, each at most half

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.value_model not in VALUE_MODELS:
            raise GptlabError(f"unknown value_model {self.value_model!r}; use separate or shared")
        if self.task and self.prompts:
            raise GptlabError(f"give the prompts once: --task {self.task} or --prompts {self.prompts} (which mixes files with "
                              "task:NAME[n=N] parts); drop one")
        if self.heldout_prompts and not self.prompts:
            raise GptlabError("--heldout-prompts goes with --prompts (a --task holds out its test split); drop it or pass --prompts")
        if not 0.0 <= self.val_fraction < 1.0:
            raise GptlabError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.value_init and self.value_model != "separate":
            raise GptlabError("--value-init starts a separate value model; drop it or pass --value-model separate")
        for name in ("rollout_prompts", "minibatches", "ppo_epochs", "max_new_tokens", "train_examples", "eval_examples",
                     "eval_samples", "kl_horizon"):
            if getattr(self, name) < 1:
                raise GptlabError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.rollout_prompts % self.minibatches:
            raise GptlabError(f"rollout_prompts {self.rollout_prompts} does not divide into {self.minibatches} minibatches")
        if self.temperature <= 0:
            raise GptlabError(f"temperature must be above 0 (rollouts sample), got {self.temperature}")
        if not (0 < self.cliprange < 1 and self.cliprange_value > 0):
            raise GptlabError(f"need 0 < cliprange < 1 and cliprange_value > 0; got {self.cliprange}, {self.cliprange_value}")
        if not (0 <= self.gamma <= 1 and 0 <= self.lam <= 1):
            raise GptlabError(f"gamma and lam must lie in [0, 1]; got {self.gamma}, {self.lam}")
        if min(self.kl_coef, self.kl_target, self.vf_coef, self.missing_eos_penalty, self.task_every, self.top_k, self.slots) < 0:
            raise GptlabError("kl_coef, kl_target, vf_coef, missing_eos_penalty, task_every, top_k and slots must be 0 or more")

    @property
    def sequences(self) -> int:
        """Completions per optimizer step (one minibatch), all ranks together."""
        return self.rollout_prompts // self.minibatches


def ppo_cpu() -> PPOConfig:
    """A few minutes on 2 CPU cores: the demo's chat model practises a built-in task against its verifier."""
    return PPOConfig(
        optimizer=OptimizerConfig(lr=3e-5, weight_decay=0.0, betas=(0.9, 0.95)),
        schedule=ScheduleConfig(kind="constant", warmup_steps=0),
        rollout_prompts=32, minibatches=2, ppo_epochs=2, micro_batch=16, seq_len=128, max_new_tokens=24,
        max_steps=80, eval_every=0, checkpoint_every=20, log_every=4, eval_examples=100, eval_samples=4,
    )


PPO_PRESETS = {"ppo-cpu": ppo_cpu}


def token_rewards(scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """(N,) scores, (N, T) per-token KL and completion mask -> (N, T) rewards: -β·kl, the score added at each row's
    last completion token (TRL). Rows are left-aligned: the completion's token t at column t."""
    rewards = -beta * kl * mask
    last = (mask.sum(1).long() - 1).clamp(min=0)
    return rewards.scatter_add(1, last[:, None], scores[:, None].to(rewards.dtype))


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, T) rewards and values of left-aligned completions -> (advantages, returns), 0 past each row's end.

    δ_t = r_t + γ·V_{t+1} - V_t and A_t = δ_t + γλ·A_{t+1}, with V and A zero after the last token, so a row's
    end is terminal; returns = A + V, the value model's targets.
    """
    rewards, values = rewards * mask, values * mask
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        following = values[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * following - values[:, t]
        running = delta + gamma * lam * running
        advantages[:, t] = running
    advantages = advantages * mask
    return advantages, (advantages + values) * mask


@dataclass
class FixedKLController:
    """β that stays as given."""

    value: float

    def update(self, kl: float, completions: int) -> None:
        pass


@dataclass
class AdaptiveKLController:
    """β moved towards a target KL (Ziegler et al. 2019): up to ±20% of β per `horizon` completions."""

    value: float
    target: float
    horizon: int

    def update(self, kl: float, completions: int) -> None:
        error = min(max(kl / self.target - 1, -0.2), 0.2)
        self.value *= 1 + error * completions / self.horizon


def kl_controller(config: PPOConfig) -> FixedKLController | AdaptiveKLController:
    if config.kl_target > 0:
        return AdaptiveKLController(config.kl_coef, config.kl_target, config.kl_horizon)
    return FixedKLController(config.kl_coef)


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               cliprange_value: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ½·max((V' - R)², (clip(V', V - ε_v, V + ε_v) - R)²), and where the clipped error was the larger."""
    clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    plain, far = (values - returns) ** 2, (clipped - returns) ** 2
    return 0.5 * torch.maximum(plain, far), far > plain


@dataclass
class PPOParts:
    loss: torch.Tensor  # the micro-batch's share of the step's loss
    sums: dict[str, float]  # per-token figures summed over the micro-batch's completion tokens


def ppo_loss(logp: torch.Tensor, values: torch.Tensor, batch: dict, config: PPOConfig) -> PPOParts:
    """The micro-batch's loss from the policy's (B, T) log-probs and the value model's (B, T) values.

    batch holds the rollout's (B, T) tensors at the completion tokens' places: old_logp, old_values, advantages,
    returns, weights (each token's share of the step's mean: 1 / the step's completion tokens, 0 elsewhere).
    """
    mask = batch["weights"] > 0
    policy, policy_clipped = policy_gradient_loss(batch["advantages"], logp, batch["old_logp"], config.cliprange, config.cliprange)
    value, value_clipped = value_loss(values, batch["old_values"], batch["returns"], config.cliprange_value)
    per_token = policy + config.vf_coef * value
    loss = (per_token * batch["weights"]).sum()
    gap = (logp - batch["old_logp"]).detach()
    sums = {"policy_loss": policy.detach(), "value_loss": value.detach(), "clipfrac": policy_clipped.float(),
            "value_clipfrac": value_clipped.float(), "approx_kl": 0.5 * gap**2}
    return PPOParts(loss, {key: float((tensor * mask).sum()) for key, tensor in sums.items()} | {"tokens": float(mask.sum())})
