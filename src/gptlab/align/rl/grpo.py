"""GRPO: reinforcement learning with verifiable rewards, and its relatives: the trainer and the run.

    gptlab grpo --init runs/shakespeare/sft --task "spelling" --out runs/grpo

One optimizer step, for P prompts of the task's train split:

    rollout   each prompt sampled G times by the batched KV-cache engine     (gptlab.align.rl.grpo_rollouts)
    reward    each completion scored: the task's verifier, and/or user functions (gptlab.align.rl.rewards)
    advantage A = r - mean(group rewards)   [/ std(group rewards)]           (gptlab.align.rl.grpo_loss)
    loss      over the completion tokens only: grpo, dapo, drgrpo, reinforce or expert, + β·KL optionally

Reward functions are called once before the run folder is claimed, on a rollout's shape of stand-in
completions (right replies, empty ones, wrong ones), so one that raises or returns the wrong count, text
or NaN is refused before any compute. A new run that fails before its first step is removed, so
the corrected command starts afresh; --parallel.fsdp is refused (each rank's rollout differs in length).

A group whose samples all get the same reward has advantage 0 and teaches
nothing: the fraction of such groups is logged, with a warning as it nears 1, and
the closing lines say so when that held for the whole run. Before the first step
the start's pass rate on the train prompts is measured, and prompt_filter="learnable"
keeps the prompts it sometimes gets right (gptlab.align.rl.learnable); a start with too
few of those is refused before any training, leaving no run folder. The policy's
per-token entropy over the completion tokens is logged as `entropy`.
Held-out accuracy (greedy), pass@1 and pass@k (k samples each) on the task's
test split are measured before, during (task_every) and after training (gptlab.align.rl.grpo_heldout).

The Trainer runs underneath (checkpoints, exact resume, DDP, precision): a
"batch" here is a rollout, made on demand by RolloutLoader from the current
weights; its per-token weights carry the loss's normalisation over the whole
step, so micro-batches and accumulation change nothing. Resume is exact: each
request's sampler is seeded from (seed, rollout, prompt, sample), and a
rollout still being reused (epochs > 1) is saved in the checkpoint.

The config, presets and loss pieces are importable from here as well as from their modules.
Not here: sampling (gptlab.align.rl.rollout, gptlab.infer), reward functions
(gptlab.align.rl.rewards), tasks and verifiers (gptlab.chat.tasks).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gptlab.align.logprobs import IGNORE, token_logprobs
from gptlab.align.rl.grpo_heldout import HeldOut, compare, describe, heldout, heldout_fn
from gptlab.align.rl.grpo_loss import (
    CLIPPED,
    GRPO_PRESETS,
    LOSSES,
    GRPOConfig,
    LossParts,
    group_advantages,
    grpo_cpu,
    policy_loss,
    token_weights,
)
from gptlab.align.rl.grpo_rollouts import RolloutLoader, load_grpo_task, make_scorer, rollout_groups, rollout_stats
from gptlab.align.rl.learnable import FLAT, choose_pool, distinct, nothing_learned, probe_start
from gptlab.align.rl.prompts import Prompt
from gptlab.align.rl.rollout import tool_prompt
from gptlab.align.start import find_init, refuse_fsdp
from gptlab.chat import CHAT_TOKENS, ChatFormat
from gptlab.data.match import find_model_tokenizer
from gptlab.eval.chat import ChatTools
from gptlab.infer.generate import SamplingConfig
from gptlab.load.checkpoints import list_checkpoints
from gptlab.model import GPT
from gptlab.model.hf import load_pretrained_directory, read_pretrained_config
from gptlab.runtime import GptlabError, atomic_write_text
from gptlab.runtime.device import resolve_precision
from gptlab.tools import reply_limits, task_toolbox
from gptlab.tools.turn import chat_tools
from gptlab.train.trainer import RUN_FILES, Trainer, TrainResult

__all__ = ["CLIPPED", "GRPO_PRESETS", "LOSSES", "GRPOConfig", "GRPOResult", "GRPOTrainer", "HeldOut", "LossParts", "RolloutLoader",
           "compare", "describe", "group_advantages", "grpo_cpu", "heldout", "heldout_fn", "load_grpo_task", "make_scorer",
           "policy_loss", "rollout_groups", "rollout_stats", "run_grpo", "token_weights"]

ZERO_SPREAD_WARNING = FLAT  # warn when this fraction of groups has no reward spread


class GRPOTrainer(Trainer):
    """The Trainer with rollouts for batches and the policy-gradient loss (module docstring)."""

    command = "grpo"
    run_files = RUN_FILES + ("completions.jsonl",)
    fsdp_ok = False  # each rank samples rollouts of its own length: sharded forwards would not pair up

    def _check_before_compute(self, config: GRPOConfig) -> GRPOConfig:
        refuse_fsdp(config.parallel, self.command, "each rank samples rollouts of its own length, so sharded forwards would not pair up")
        if not config.init_from:
            raise GptlabError("GRPO starts from a chat model: pass --init CHECKPOINT (e.g. the output of gptlab sft)")
        self.init_path = find_init(config.init_from)
        self.tokenizer = find_model_tokenizer(self.init_path)
        if self.tokenizer is None or not all(token in self.tokenizer.special_tokens for token in CHAT_TOKENS):
            raise GptlabError(f"{config.init_from} is not a chat model (its tokenizer lacks the chat tokens): "
                              "fine-tune it with gptlab sft first, then pass that run to --init")
        self.chat = ChatFormat(self.tokenizer)
        self.fingerprint = self.tokenizer.fingerprint()
        init = read_pretrained_config(self.init_path)
        config = dataclasses.replace(config, model=dataclasses.replace(init, dropout=config.model.dropout),
                                     seq_len=min(config.seq_len, init.block_size))
        config = dataclasses.replace(config, batch_tokens=config.sequences * config.seq_len)  # TrainConfig's view of a step
        self._check_batch(config)
        self.pool = self._load_prompts(config)
        self.candidates, self.kept = distinct(self.pool), None  # the prompts the start's probe samples; those it kept
        self._probe_rewards(config)
        self.sampling = SamplingConfig(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                                       top_k=config.top_k or None, stop_tokens=self.chat.stop_tokens,
                                       vocab_size=self.tokenizer.vocab_size)
        self.has_val, self.reference = False, None
        self.accum = config.accumulation_steps(self.runtime.world_size)
        self.precision = resolve_precision(config.precision, self.runtime.device)
        return self._shorten_warmup(config)

    def _load_prompts(self, config: GRPOConfig) -> list:
        """The task, the scorer of its completions and the pool of train prompts (PPO reads prompts from files too)."""
        self.task = load_grpo_task(config.task)
        self.score = make_scorer(config.reward, self.task)
        self.tools = self._rollout_tools(config)
        return self._prompt_pool(config)

    def _rollout_tools(self, config: GRPOConfig) -> ChatTools | None:
        """The tools the rollouts run (config.tools: auto, the task's when it offers them; none; or a spec), loaded
        and checked against the model's tool tokens before any compute."""
        toolbox = task_toolbox(config.tools, self.task, reply_limits(config.tool_calls, config.tool_seconds))
        return chat_tools(self.chat, toolbox)

    def prompt_ids(self, item) -> list[int]:
        """A pool item's rendered prompt, after the tools block when tools run: a task's Example (its question) or a
        Prompt (its messages)."""
        messages = list(item.messages) if isinstance(item, Prompt) else [{"role": "user", "content": item.question}]
        return tool_prompt(self.chat, messages, self.tools)

    def _probe_rewards(self, config: GRPOConfig) -> None:
        """Score one rollout-shaped batch before the run folder is claimed, so a reward function that raises, or
        returns the wrong count, text or NaN, is refused before any compute and leaves nothing behind. The
        completions stand in for samples: each group gets its prompt's right reply, an empty reply (a model
        can stop at once) and another prompt's reply."""
        per_rank = config.prompts_per_step // self.runtime.world_size
        examples = [self.pool[index % len(self.pool)] for index in range(per_rank)]
        repeated = [example for example in examples for _ in range(config.group_size)]
        texts = [(example.reply, "", examples[(number + 1) % len(examples)].reply)[sample % 3]
                 for number, example in enumerate(examples) for sample in range(config.group_size)]
        try:
            self.score(repeated, texts)
        except GptlabError as error:
            raise GptlabError(f"{error} (checked before training, on {len(texts)} stand-in completions: "
                              "right replies, empty ones and wrong ones)") from None

    def fit(self) -> TrainResult:
        """The Trainer's; and a new run that fails before its first step ends (a reward function that fails only on
        real samples) is removed, so rerunning with the fix starts afresh instead of being refused as other settings.
        A run that trained a step keeps its folder: its metrics say what happened."""
        try:
            return super().fit()
        except GptlabError:
            self._forget_untrained_run()
            raise

    def _forget_untrained_run(self) -> None:
        folder = getattr(self, "folder", None)
        state = getattr(self, "state", None)
        if folder is None or folder.status != "new" or (state is not None and state.step > 0) or list_checkpoints(folder.path):
            return
        if getattr(self, "metrics", None) is not None:
            self.metrics.close()  # its files are about to go
        folder.undo()

    def _check_batch(self, config: GRPOConfig) -> None:
        world = self.runtime.world_size
        if config.prompts_per_step % world:
            raise GptlabError(f"prompts_per_step {config.prompts_per_step} does not divide among {world} ranks")
        per_rank = config.sequences // world
        if per_rank % config.micro_batch:
            raise GptlabError(f"a rank's {per_rank} completions per step (prompts_per_step x group_size / ranks) do not divide "
                              f"into micro-batches of {config.micro_batch}; pass --micro-batch {math.gcd(per_rank, config.micro_batch)}")

    def _prompt_pool(self, config: GRPOConfig) -> list:
        """The train prompts that fit the context with max_new_tokens; the others are counted and left out."""
        size = getattr(self.task, "train_size", None)
        examples = self.task.examples("train", min(config.train_examples, size) if size else config.train_examples)
        room = min(config.seq_len + 1, config.model.block_size) - config.max_new_tokens
        pool = [e for e in examples if len(self.prompt_ids(e)) <= room]
        if room < 1:
            raise GptlabError(f"max_new_tokens {config.max_new_tokens} leaves no room for a prompt in seq_len "
                              f"{config.seq_len} (the model's context is {config.model.block_size}); lower --max-new-tokens")
        if not pool:
            raise GptlabError(f"no {self.task.name} prompt fits {room} tokens (seq_len {config.seq_len} less "
                              f"max_new_tokens {config.max_new_tokens}); lower --max-new-tokens")
        if len(pool) < len(examples):
            self.print(f"note: {len(examples) - len(pool)} of {len(examples)} prompts are too long for the context and left out")
        return pool

    def _choose_pool(self) -> None:
        """A new run measures the start's pass rate on the train prompts and, with prompt_filter learnable, keeps
        the prompts it can learn from (gptlab.align.rl.learnable); refused (the new folder removed) when too few."""
        config = self.config
        if config.probe_samples == 0:
            return
        probe = probe_start(self.model, self.chat, self.score, self.candidates, self.sampling, config,
                            rank=self.runtime.rank, world=self.runtime.world_size, tools=self.tools)
        kept = choose_pool(probe, config, self.print)
        if kept is not None:
            self.use_pool(kept)

    def use_pool(self, kept: list[int]) -> None:
        """Train on these candidates only (the probe's choice, or a checkpoint's record of it)."""
        self.kept, self.pool = list(kept), [self.candidates[index] for index in kept]

    def _make_model(self) -> GPT:
        model = load_pretrained_directory(self.init_path, device=self.runtime.device)
        if self.config.kl_beta > 0:  # a frozen copy of the start, for the KL penalty
            self.reference = load_pretrained_directory(self.init_path, device=self.runtime.device).eval().requires_grad_(False)
        return model

    def _loader(self, split: str) -> RolloutLoader:
        return RolloutLoader(self)

    def _token_bytes(self) -> torch.Tensor | None:
        return None

    def _task_every(self) -> int:
        return self.config.task_every

    def _step_batches(self) -> tuple[list[tuple], list[float | None]]:
        """The rollout's micro-batches; their per-token weights already hold the step's normalisation."""
        self.parts = {"clipped": 0.0, "tokens": 0.0, "kl": 0.0, "entropy": 0.0}
        batches = [self.train_loader.next_batch() for _ in range(self.accum)]
        self.rows_tokens = sum(x.numel() for x, _, _ in batches) * self.runtime.world_size
        return batches, [None] * self.accum

    def _step_tokens(self) -> int:
        return self.rows_tokens

    def _micro_loss(self, x: torch.Tensor, y: torch.Tensor, kwargs: dict, weight: float | None) -> torch.Tensor:
        with self.cast:
            logp, entropy = token_logprobs(self.wrapped, x, y, entropy=True)
        parts = policy_loss(logp, y, kwargs, self.config)
        for key in ("clipped", "tokens", "kl"):
            self.parts[key] += getattr(parts, key)
        self.parts["entropy"] += float((entropy * (y != IGNORE)).sum())  # over the completion tokens, as the loss
        return parts.loss

    def _step_metrics(self) -> dict[str, float]:
        stats = dict(self.train_loader.stats)
        tokens = max(self.parts["tokens"], 1.0)
        stats["entropy"] = self.parts["entropy"] / tokens  # nats per completion token: near 0, the samples stop differing
        if self.config.loss in CLIPPED:
            stats["clipped"] = self.parts["clipped"] / tokens
        if self.config.kl_beta > 0:
            stats["kl"] = self.parts["kl"] / tokens
        if stats.get("zero_spread", 0) >= ZERO_SPREAD_WARNING:
            self.print(f"warning: {stats['zero_spread']:.0%} of groups gave every sample the same reward, so their "
                       "advantages are 0 and the gradient vanishes; try a higher --temperature, a larger --group-size "
                       "or an easier task")
        return stats

    def _announce(self) -> None:
        super()._announce()
        config = self.config
        self.print(f"each step: {config.prompts_per_step} prompts x {config.group_size} samples of up to "
                   f"{config.max_new_tokens} tokens ({config.task}, reward {config.reward}, loss {config.loss}"
                   f"{f', tools {tools}' if (tools := self._tool_names()) else ''}"
                   f"{f', {config.epochs} steps per rollout' if config.epochs > 1 else ''}); rows are as long as the "
                   f"rollout's longest, so tokens/step varies")

    def _tool_names(self) -> str:
        """The tools rollouts run, comma-separated ("" without)."""
        return ", ".join(spec["function"]["name"] for spec in self.tools.specs) if self.tools is not None else ""

    def _restore(self, path: Path | None):
        """As the Trainer's; a new run then probes the start for its prompt pool, and a resumed one drops the
        completions logged after its checkpoint (they will be sampled again)."""
        state = super()._restore(path)
        if path is None:  # a new run; a resumed one trains on the pool its checkpoint names (RolloutLoader)
            self._choose_pool()
        completions = Path(self.config.out) / "completions.jsonl"
        if self.runtime.is_main and completions.is_file():
            kept = [line for line in completions.read_text(encoding="utf-8").splitlines(keepends=True)
                    if line.strip() and json.loads(line)["step"] < state.step]
            atomic_write_text(completions, "".join(kept))
        return state


@dataclass
class GRPOResult:
    train: TrainResult
    before: dict[str, float] = field(default_factory=dict)  # held-out measures of the starting model
    after: dict[str, float] = field(default_factory=dict)  # ... and of the trained one

    @property
    def status(self) -> str:
        return self.train.status


def run_grpo(config: GRPOConfig, *, runtime=None, log: Callable[[str], None] = print, resume: bool = True,
             force: bool = False) -> GRPOResult:
    """Train with GRPO (or a relative), with held-out accuracy and pass@k before and after (every rank calls this)."""
    from gptlab.align.finetune.sft import chat_sampler

    trainer = GRPOTrainer(config, runtime=runtime, log=log, resume=resume, force=force)
    trainer.sample_fn = chat_sampler(trainer.task.examples("test", 1)[0].question, trainer.config.max_new_tokens)
    task, name = trainer.task, trainer.task.name
    trainer.task_fn = heldout_fn(trainer.chat, task, trainer.config, trainer.sampling, trainer.tools)

    def measure_start() -> HeldOut:
        start = heldout(load_pretrained_directory(trainer.init_path, device=trainer.runtime.device), trainer.chat, task,
                        trainer.config, trainer.sampling, trainer.tools)
        if trainer.runtime.is_main:
            log("before: " + describe(start.summary(name), name, config.eval_samples))
        return start

    trainer.before_fn = measure_start
    result = trainer.fit()
    start = trainer.before
    before, after = start.summary(name), {}
    if result.status != "interrupted":
        end = heldout(trainer.model, trainer.chat, task, trainer.config, trainer.sampling, trainer.tools)
        after = end.summary(name)
        if trainer.runtime.is_main:
            log("after:  " + describe(after, name, config.eval_samples))
            log(compare(start, end))
    flat = nothing_learned(trainer.train_loader.flat, trainer.train_loader.rollout)
    if trainer.runtime.is_main and flat:
        log(flat)
    if trainer.runtime.is_main:
        log(f"{result.status} after {result.steps} steps in {result.seconds:.0f} s; checkpoint {result.checkpoint}")
    return GRPOResult(result, before, after)

