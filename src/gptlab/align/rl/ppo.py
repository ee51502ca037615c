"""PPO (RLHF): the policy, its value model and the frozen reference; the trainer and the run.

    gptlab ppo --init runs/sft --reward rm:runs/rm --out runs/ppo
    gptlab ppo --init runs/sft --task "arithmetic[digits=1]" --reward verifier --kl-target 6 --out runs/ppo
    gptlab ppo --init runs/sft --prompts "prompts.jsonl, task:spelling[n=500]" --reward rm:runs/rm --out runs/ppo

Prompts come from --task (its train split; the verifier and held-out accuracy on its test split) or --prompts, a
mixture of files, datasets and task parts (gptlab.align.rl.prompts), never both. With --prompts the held-out measure
is the mean reward of greedy replies to held-out prompts (val_fraction of each file, or --heldout-prompts) before and
after, and its change with a paired 95% interval; `verifier` is refused unless every prompt is one task's.

Each rollout (gptlab.align.rl.ppo_rollouts) samples one completion per prompt, scores it with the --reward spec,
and turns the score and the per-token KL to the reference into per-token advantages (gptlab.align.rl.ppo_loss);
then ppo_epochs passes of shuffled minibatches train policy and value together, one optimizer step per
minibatch. The value model is ScalarModel (gptlab.align.rl.scalar): on a copy of the trunk (--value-model
separate, optionally started from a reward model with --value-init RM, as TRL does) or a head on the policy's
own trunk (--value-model shared: one forward gives logits and values). One optimizer trains both.

A checkpoint is a normal chat model folder (config.json, model.safetensors and tokenizer/: the policy, which
gptlab chat, serve and eval read) with the value model beside it: value/ (a model folder and score_head.safetensors,
the reward model's layout) when separate, value_head.safetensors when shared. As GRPO's: rewards are probed before the run folder is claimed, a
new run that fails before its first step is removed, --parallel.fsdp is refused, and held-out task accuracy
and mean reward are measured before and after.
Not here: sampling (gptlab.align.rl.rollout), reward functions (gptlab.align.rl.rewards), reward models (gptlab.align.rl.rm).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from gptlab.align.logprobs import logits_logprobs, token_entropy
from gptlab.align.rl.grpo import GRPOResult, GRPOTrainer
from gptlab.align.rl.grpo_heldout import HeldOut, compare, describe, heldout, heldout_fn
from gptlab.align.rl.ppo_loss import DEFAULT_TASK, PPO_PRESETS, PPOConfig, ppo_cpu, ppo_loss
from gptlab.align.rl.ppo_rollouts import PPORolloutLoader
from gptlab.align.rl.prompts import Prompt, greedy_rewards, load_prompts, names_verifier, prompt_scorer, reward_change
from gptlab.align.rl.rm_reward import load_reward_model
from gptlab.align.rl.rollout import answer_text, rollout
from gptlab.align.rl.scalar import ScalarModel
from gptlab.model import GPT
from gptlab.model.hf import load_pretrained_directory
from gptlab.model.io import save_model, save_safetensors
from gptlab.runtime import GptlabError
from gptlab.train.checkpoint import load_checkpoint
from gptlab.train.trainer import Trainer

__all__ = ["PPO_PRESETS", "PPOConfig", "PPOResult", "PPOTrainer", "PolicyAndValue", "ppo_cpu", "run_ppo"]

VALUE_DIR = "value"  # a separate value model in a checkpoint: a model folder with score_head.safetensors (a reward model's layout)
STAND_IN_REPLY = "I do not know."  # the probe's "right reply" to a prompt whose source gives none
SHARED_HEAD = "value_head.safetensors"  # a shared value model's head: {"weight": (1, n_embd), "bias": (1,)}


class PolicyAndValue(nn.Module):
    """The trained parameters in one module: forward(x) -> (logits (B, T, V), values (B, T) float32)."""

    def __init__(self, policy: GPT, value: ScalarModel | None) -> None:
        super().__init__()
        self.policy = policy
        # shared: a scalar head reading the policy's own hidden states (ScalarModel's init, on the policy's trunk)
        self.value = value if value is not None else ScalarModel(policy).head
        self.shared = value is None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.shared:
            hidden = self.policy.hidden_states(x)
            return self.policy.head_logits(hidden), self.value(hidden).squeeze(-1).float()
        return self.policy.head_logits(self.policy.hidden_states(x)), self.value(x)

    @property
    def transformer(self) -> nn.ModuleDict:
        """The policy's layers, where the Trainer looks up the blocks (FSDP's units, Muon's matrices)."""
        return self.policy.transformer

    def set_activation_checkpointing(self, on: bool = True) -> PolicyAndValue:
        self.policy.set_activation_checkpointing(on)
        if not self.shared:
            self.value.trunk.set_activation_checkpointing(on)
        return self

    def num_params(self) -> int:
        return self.policy.num_params() + sum(p.numel() for p in self.value.parameters() if p.requires_grad)


class PPOTrainer(GRPOTrainer):
    """GRPO's trainer (checks, prompt pool, reward probing, resume of completions.jsonl) with PPO's models, rollouts
    and loss (module docstring)."""

    command = "ppo"

    def _check_before_compute(self, config: PPOConfig) -> PPOConfig:
        if not config.init_from:
            raise GptlabError("PPO starts from a chat model: pass --init CHECKPOINT (e.g. the output of gptlab sft)")
        self.prompt_splits, self.heldout_prompts = None, []
        config = super()._check_before_compute(config if config.prompts else dataclasses.replace(config, task=config.task or DEFAULT_TASK))
        self.value_init = None
        if config.value_init:  # a reward model however gptlab rm left it (its folder, a run, a checkpoint), read once
            try:
                self.value_init = load_reward_model(config.value_init)
            except GptlabError as error:
                raise GptlabError(f"--value-init: {error}") from None
            if self.value_init.chat.tokenizer.fingerprint() != self.fingerprint:
                raise GptlabError(f"--value-init {config.value_init} reads text with another tokenizer than --init "
                                  f"{config.init_from}'s; pass a reward model trained from the same chat model")
        return config

    def _load_prompts(self, config: PPOConfig) -> list:
        """--task: GRPO's. --prompts: read and hold out the prompts, build their scorer (a verifier only when every prompt
        is one task's), and keep the train prompts that fit the context with max_new_tokens (the others counted and
        left out, as GRPO's), and up to eval_examples held-out ones that fit."""
        if not config.prompts:
            return super()._load_prompts(config)
        self.prompt_splits = read = load_prompts(config.prompts, val_fraction=config.val_fraction, heldout=config.heldout_prompts)
        self.task = read.one_task()
        if self.task is None and names_verifier(config.reward):
            raise GptlabError(f"reward verifier checks a task's answers, and --prompts {config.prompts} holds prompts without "
                              "them (rows of files and datasets); pass --task NAME for its verifier, or score with rm:DIR, "
                              "judge:URL or file.py:fn")
        self.score = prompt_scorer(config.reward, self.task)
        self.tools = self._rollout_tools(config)  # auto: the tools of the one task every prompt comes from, if it offers them
        room = min(config.seq_len + 1, config.model.block_size) - config.max_new_tokens
        if room < 1:
            raise GptlabError(f"max_new_tokens {config.max_new_tokens} leaves no room for a prompt in seq_len "
                              f"{config.seq_len} (the model's context is {config.model.block_size}); lower --max-new-tokens")
        self.print(read.summary())
        pool = self._fitting(read.train, room, "train")
        if not pool:
            raise GptlabError(f"no prompt of --prompts {config.prompts} fits {room} tokens (seq_len {config.seq_len} less "
                              f"max_new_tokens {config.max_new_tokens}); lower --max-new-tokens or pass shorter prompts")
        self.heldout_prompts = self._fitting(read.val, room, "held-out")[: config.eval_examples]
        return pool

    def _fitting(self, prompts: list[Prompt], room: int, label: str) -> list[Prompt]:
        kept = [prompt for prompt in prompts if len(self.prompt_ids(prompt)) <= room]
        if len(kept) < len(prompts):
            self.print(f"note: {len(prompts) - len(kept)} of {len(prompts)} {label} prompts are longer than {room} tokens "
                       f"(seq_len less max_new_tokens) and left out")
        return kept

    def _check_batch(self, config: PPOConfig) -> None:
        world = self.runtime.world_size
        if config.rollout_prompts % (world * config.minibatches):
            raise GptlabError(f"rollout_prompts {config.rollout_prompts} does not divide among {world} ranks x "
                              f"{config.minibatches} minibatches")
        per_rank = config.sequences // world
        if per_rank % config.micro_batch:
            raise GptlabError(f"a rank's {per_rank} completions per minibatch (rollout_prompts / minibatches / ranks) do not "
                              f"divide into micro-batches of {config.micro_batch}; pass --micro-batch {math.gcd(per_rank, config.micro_batch)}")

    def _probe_rewards(self, config: PPOConfig) -> None:
        """Score a rollout's shape of stand-in completions (right replies, empty ones, another prompt's) before
        the run folder is claimed: a reward that raises, or returns the wrong count or NaN, costs no compute."""
        examples = [self.pool[index % len(self.pool)] for index in range(config.rollout_prompts // self.runtime.world_size)]
        replies = [example.reply or STAND_IN_REPLY for example in examples]  # a prompt from a file may come without one
        texts = [(replies[n], "", replies[(n + 1) % len(examples)])[n % 3] for n in range(len(examples))]
        try:
            self.score(examples, texts)
        except GptlabError as error:
            raise GptlabError(f"{error} (checked before training, on {len(texts)} stand-in completions: "
                              "right replies, empty ones and wrong ones)") from None

    def _choose_pool(self) -> None:
        """Every prompt of the pool: GRPO's learnable filter compares a group's samples, and PPO samples one per prompt
        (the held-out reward and accuracy of the start are measured before training instead)."""

    def _make_model(self) -> PolicyAndValue:
        device = self.runtime.device
        policy = load_pretrained_directory(self.init_path, device=device)
        self.reference = load_pretrained_directory(self.init_path, device=device).eval().requires_grad_(False)
        value = None
        if self.config.value_model == "separate":
            if self.value_init is not None:  # the reward model's trunk and head, trained on from here (TRL's start)
                value = self.value_init.model.to(device).train().requires_grad_(True)
            else:
                value = ScalarModel(load_pretrained_directory(self.init_path, device=device))
            if not value.trunk.config.tie_embeddings:  # the trunk's language-model head is never used: not trained
                value.trunk.lm_head.requires_grad_(False)
        return PolicyAndValue(policy, value)

    def _loader(self, split: str) -> PPORolloutLoader:
        return PPORolloutLoader(self)

    def _whole_model(self) -> GPT:
        """What a checkpoint's model.safetensors holds: the policy alone, a normal chat model."""
        return self.model.policy

    def _attach(self, folder: Path) -> None:
        """The tokenizer (as every checkpoint), and the value model beside the policy: separate, value/ in the reward
        model's layout (a model folder and score_head.safetensors); shared, value_head.safetensors."""
        super()._attach(folder)
        value = self.model.value
        head = value.head if not self.model.shared else value
        if not self.model.shared:
            save_model(value.trunk, folder / VALUE_DIR)
        save_safetensors({name: tensor.detach().cpu().contiguous() for name, tensor in head.state_dict().items()},
                         folder / (VALUE_DIR + "/score_head.safetensors" if not self.model.shared else SHARED_HEAD))

    def _load(self, path: Path) -> dict:
        """Policy, value, optimizer, scaler and RNGs from a checkpoint."""
        from safetensors.torch import load_file

        device, value = self.runtime.device, self.model.value
        saved = load_checkpoint(path, self.model.policy, None, scaler=self.scaler, device=device, rank=self.runtime.rank)
        if self.model.shared:
            value.load_state_dict(load_file(path / SHARED_HEAD, device=str(device)))
        else:
            value.trunk.load_state_dict(load_pretrained_directory(path / VALUE_DIR, device=device).state_dict())
            value.head.load_state_dict(load_file(path / VALUE_DIR / "score_head.safetensors", device=str(device)))
        self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=device, weights_only=True))
        return saved

    def _micro_loss(self, x: torch.Tensor, y: torch.Tensor, kwargs: dict, weight: float | None) -> torch.Tensor:
        with self.cast:
            logits, values = self.wrapped(x)
        logp = logits_logprobs(logits, y)
        parts = ppo_loss(logp, values, kwargs, self.config)
        for key, value in parts.sums.items():
            self.parts[key] = self.parts.get(key, 0.0) + value
        self.parts["entropy"] = self.parts.get("entropy", 0.0) + float((token_entropy(logits) * (kwargs["weights"] > 0)).sum())
        return parts.loss

    def _step_batches(self) -> tuple[list[tuple], list[float | None]]:
        batches, weights = super()._step_batches()
        self.parts = {}
        return batches, weights

    def _step_metrics(self) -> dict[str, float]:
        tokens = max(self.parts.get("tokens", 0.0), 1.0)
        step = {key: value / tokens for key, value in self.parts.items() if key != "tokens"}
        return {**self.train_loader.stats, **step}

    def _announce(self) -> None:
        Trainer._announce(self)
        config = self.config
        beta = f"β adaptive from {config.kl_coef} to KL {config.kl_target}" if config.kl_target else f"β {config.kl_coef}"
        self.print(f"each rollout: {config.rollout_prompts} prompts x 1 sample of up to {config.max_new_tokens} tokens "
                   f"({config.task or config.prompts}, reward {config.reward}, {beta}, value model {config.value_model}"
                   f"{f', tools {tools}' if (tools := self._tool_names()) else ''}); "
                   f"{config.ppo_epochs} epochs x {config.minibatches} minibatches = {config.ppo_epochs * config.minibatches} steps per rollout")


PPOResult = GRPOResult  # the training result, and the held-out measures before and after


def heldout_reward(trainer: PPOTrainer, model: GPT) -> float:
    """The mean --reward score of eval_samples samples per held-out prompt (the task's test split), seeded alike
    before and after training, so the two means are over the same draws of the sampler's noise."""
    config = trainer.config
    examples = trainer.task.examples("test", min(config.eval_examples, getattr(trainer.task, "test_size", None) or config.eval_examples))
    prompts = [trainer.prompt_ids(example) for example in examples]
    seed = int(np.random.SeedSequence([config.seed, 2]).generate_state(1)[0])
    groups = rollout(model, prompts, trainer.sampling, samples=config.eval_samples, seed=seed, slots=config.slots or None,
                     tools=trainer.tools)
    texts = [answer_text(trainer.chat, c.tokens, trainer.tools) for group in groups for c in group]
    scores, _ = trainer.score([example for example in examples for _ in range(config.eval_samples)], texts)
    return float(np.mean(scores))


def run_ppo(config: PPOConfig, *, runtime=None, log: Callable[[str], None] = print, resume: bool = True,
            force: bool = False) -> PPOResult:
    """Train with PPO, with held-out reward and task accuracy before and after (every rank calls this)."""
    from gptlab.align.finetune.sft import chat_sampler

    trainer = PPOTrainer(config, runtime=runtime, log=log, resume=resume, force=force)
    if trainer.prompt_splits is not None:
        return _run_with_prompts(trainer, log)
    sampler = chat_sampler(trainer.task.examples("test", 1)[0].question, trainer.config.max_new_tokens)
    trainer.sample_fn = lambda model, tokenizer: sampler(model.policy, tokenizer)
    task, name = trainer.task, trainer.task.name
    measure = heldout_fn(trainer.chat, task, trainer.config, trainer.sampling, trainer.tools)
    trainer.task_fn = lambda model: {**measure(model.policy), "heldout_reward": heldout_reward(trainer, model.policy)}

    def measure_start() -> tuple[HeldOut, float]:
        start = load_pretrained_directory(trainer.init_path, device=trainer.runtime.device)
        held = heldout(start, trainer.chat, task, trainer.config, trainer.sampling, trainer.tools)
        reward = heldout_reward(trainer, start)
        if trainer.runtime.is_main:
            log(f"before: held-out reward {reward:.4f}; " + describe(held.summary(name), name, config.eval_samples))
        return held, reward

    trainer.before_fn = measure_start
    result = trainer.fit()
    start, start_reward = trainer.before
    before, after = {**start.summary(name), "heldout_reward": start_reward}, {}
    if result.status != "interrupted":
        end = heldout(trainer.model.policy, trainer.chat, task, trainer.config, trainer.sampling, trainer.tools)
        after = {**end.summary(name), "heldout_reward": heldout_reward(trainer, trainer.model.policy)}
        if trainer.runtime.is_main:
            log(f"after:  held-out reward {after['heldout_reward']:.4f}; " + describe(after, name, config.eval_samples))
            log(compare(start, end))
    if trainer.runtime.is_main:
        log(f"{result.status} after {result.steps} steps in {result.seconds:.0f} s; checkpoint {result.checkpoint}")
    return PPOResult(result, before, after)


def _run_with_prompts(trainer: PPOTrainer, log: Callable[[str], None]) -> PPOResult:
    """run_ppo with --prompts: the held-out measure is the mean reward of greedy replies to the held-out prompts,
    before and after, and its change with a paired 95% interval (no task accuracy: files hold no answers)."""
    from gptlab.align.finetune.sft import chat_sampler

    config, held, is_main = trainer.config, trainer.heldout_prompts, trainer.runtime.is_main
    sampler = chat_sampler(trainer.pool[0].question, config.max_new_tokens)
    trainer.sample_fn = lambda model, tokenizer: sampler(model.policy, tokenizer)

    def measure(model: GPT) -> list[float]:
        return greedy_rewards(model, trainer.chat, held, trainer.score, trainer.sampling, slots=config.slots or None,
                              tools=trainer.tools)

    def summary(scores: list[float]) -> str:
        return f"held-out reward {float(np.mean(scores)):.4f} on {len(scores)} prompts (greedy replies)"

    def measure_start() -> list[float]:
        scores = measure(load_pretrained_directory(trainer.init_path, device=trainer.runtime.device))
        if is_main:
            log("before: " + summary(scores))
        return scores

    if held:
        trainer.task_fn = lambda model: {"heldout_reward": float(np.mean(measure(model.policy)))}
        trainer.before_fn = measure_start
    elif is_main:
        log("note: no held-out prompts (pass --val-fraction above 0 or --heldout-prompts), so no before/after reward")
    result = trainer.fit()
    before, after = {}, {}
    if held:
        before = {"heldout_reward": float(np.mean(trainer.before)), "heldout_n": len(held)}
    if held and result.status != "interrupted":
        end = measure(trainer.model.policy)
        after = {"heldout_reward": float(np.mean(end)), "heldout_n": len(held)}
        if is_main:
            log("after:  " + summary(end))
            log(reward_change(trainer.before, end))
    if is_main:
        log(f"{result.status} after {result.steps} steps in {result.seconds:.0f} s; checkpoint {result.checkpoint}")
    return PPOResult(result, before, after)

