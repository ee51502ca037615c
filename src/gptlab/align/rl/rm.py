"""Reward models: a chat model's trunk with a scalar head learns to score each pair's chosen reply above the rejected.

    gptlab rm --init runs/sft --data "task:arithmetic[n=2000,digits=1], prefs.jsonl" --out runs/rm

The model is a ScalarModel (gptlab.align.rl.scalar) on the --init model's trunk (a base model gets the chat tokens, as
SFT and DPO do); the reward r of a reply is the head's value at the last token of the rendered prompt + reply +
<|end|>. For a pair's chosen c and rejected r (Bradley-Terry, as InstructGPT and TRL's RewardTrainer):

    loss = −log σ(r_c − r_r − margin)  +  center_rewards_coefficient · (r_c + r_r)²        averaged over the pairs

with `margin` a pair's own "margin" column (0 when absent; TRL's) and the second term TRL's reward centring
(Eisenstein et al. 2023), which keeps the rewards near 0 since the first term only sees their differences.
Pairs are what `gptlab dpo --data` reads (gptlab.align.preference.pairs); a step is batch_tokens / seq_len pairs.

Logged per step: loss, accuracy (the share of pairs with r_c > r_r), margin (mean r_c − r_r), reward_mean and
reward_std (over both replies); per evaluation (eval_every) the same as val_* on each rank's first eval_batches
micro-batches of held-out pairs. Before and after training: the accuracy on every held-out pair with its 95% Wilson
interval. At the end the run folder also holds the reward-model folder (gptlab.align.rl.rm_reward), its scores
normalised by the mean and spread of the rewards of the first normalise_pairs train pairs' replies.

Not here: reading pairs (gptlab.align.preference.pairs), loading and scoring a trained reward model (gptlab.align.rl.rm_reward),
the loop (gptlab.train.trainer).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from gptlab.align.preference.pairs import PairLoader, PairLoaderConfig, PairSplit, load_pairs, render_pair
from gptlab.align.rl.rm_reward import FOLDER_FILES, reward_rows, score_sequences, write_reward_model
from gptlab.align.rl.scalar import ScalarModel, last_scores
from gptlab.align.start import refuse_fsdp, resolve_start
from gptlab.chat.data import MixtureConfig
from gptlab.eval.stats import wilson_interval
from gptlab.model import GPT
from gptlab.runtime import GptlabError
from gptlab.runtime.device import autocast, resolve_precision, rng_state, set_rng_state
from gptlab.train.config import TrainConfig
from gptlab.train.optim import OptimizerConfig
from gptlab.train.schedule import ScheduleConfig
from gptlab.train.trainer import RUN_FILES, Trainer, TrainResult


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | None = None, *,
                       center_coefficient: float = 0.0) -> torch.Tensor:
    """(B,) per-pair losses from (B,) rewards (module docstring); their mean is TRL RewardTrainer's loss."""
    difference = chosen - rejected if margin is None else chosen - rejected - margin
    losses = -F.logsigmoid(difference)
    if center_coefficient:
        losses = losses + center_coefficient * (chosen + rejected) ** 2
    return losses


@dataclass(frozen=True, kw_only=True)
class RMConfig(TrainConfig):
    """TrainConfig's fields (data is a mixture of pairs, init_from the model whose trunk scores), and these."""

    data: str = ""  # preference pairs: .jsonl files, hf:DATASET and task:NAME parts (gptlab.align.preference.pairs)
    init_from: str = ""  # the model whose trunk the reward model starts from, usually an SFT run (--init)
    tokenizer: str = ""  # the model's tokenizer, when it has none saved with it
    center_rewards_coefficient: float = 0.0  # TRL's: adds this times mean((r_c + r_r)^2), keeping rewards near 0 (0: off)
    val_fraction: float = 0.05  # held out of every file and dataset (tasks: their test split)
    on_error: str = "skip"  # malformed pairs: skip (counted, reported) | refuse (stop at the first)
    normalise_pairs: int = 1000  # train pairs whose replies' rewards set the saved normalisation (mean, std)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (math.isfinite(self.center_rewards_coefficient) and self.center_rewards_coefficient >= 0):
            raise GptlabError(f"center_rewards_coefficient must be 0 or more, got {self.center_rewards_coefficient}")
        if self.normalise_pairs < 1:
            raise GptlabError(f"normalise_pairs must be at least 1, got {self.normalise_pairs}")


def rm_cpu() -> RMConfig:
    """About 2 minutes on 2 CPU cores: the demo's SFT model learns to score right sums and spellings above wrong ones.
    Sums need the trunk to check the arithmetic: at lr 1e-4 for 150 steps a reward model on two-digit sums stayed at
    chance (0.49-0.53 on 500 held-out pairs, two seeds), at 3e-4 for 600 steps it reached 0.83 (bench/align_compare.py)."""
    return RMConfig(
        data="task:arithmetic[n=10000,digits=1], task:spelling[n=10000]",
        optimizer=OptimizerConfig(lr=3e-4, weight_decay=0.0, betas=(0.9, 0.95)),
        schedule=ScheduleConfig(kind="cosine", warmup_steps=20, min_lr_ratio=0.1),
        batch_tokens=32 * 64,
        micro_batch=16,
        seq_len=64,
        max_steps=600,
        eval_every=100,
        checkpoint_every=200,
    )


RM_PRESETS = {"rm-cpu": rm_cpu}


class RewardModel(ScalarModel):
    """The ScalarModel the Trainer trains: its head drawn from the run's seed alone, an untied lm_head frozen (it
    never gets a gradient, which DDP would refuse), and the GPT methods the Trainer calls on its model."""

    def __init__(self, trunk: GPT, seed: int) -> None:
        super().__init__(trunk)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # the std ScalarModel uses, from a generator of its own: the same head however it is built
            weight = torch.randn(self.head.weight.shape, generator=generator) / math.sqrt(trunk.config.n_embd + 1)
            self.head.weight.copy_(weight)
        if not trunk.config.tie_embeddings:
            trunk.lm_head.requires_grad_(False)

    @property
    def transformer(self):
        return self.trunk.transformer  # the blocks, for data-parallel wrapping and Muon's groups

    def num_params(self) -> int:
        return self.trunk.num_params() + sum(p.numel() for p in self.head.parameters())

    def set_activation_checkpointing(self, on: bool = True) -> RewardModel:
        self.trunk.set_activation_checkpointing(on)
        return self


class RewardPairLoader(PairLoader):
    """PairLoader's order and resumable state, batched for a reward model: x (2B, T) the whole renderings (the chosen
    rows, then the rejected), right-padded; lengths (2B,) where a language model's loader puts targets; and kwargs
    {"pair_index": (B,), "margin": (B,) float32}."""

    def __init__(self, split: PairSplit, *args, **kwargs) -> None:
        super().__init__(split, *args, **kwargs)
        self.margins = torch.tensor([pair.margin for pair in split.pairs], dtype=torch.float32)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor, dict]:
        indices = self._next_indices()
        items = [self.rendered[i] for i in indices]
        x, lengths = reward_rows([item.chosen for item in items] + [item.rejected for item in items], self.chat.bos)
        index = torch.tensor(indices, dtype=torch.int64)
        return x.to(self.device), lengths.to(self.device), {"pair_index": index.to(self.device),
                                                            "margin": self.margins[index].to(self.device)}


def pair_figures(chosen: torch.Tensor, rejected: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
    """(6,) float64 sums to all-reduce: pairs, loss, correct (r_c > r_r), margin, reward, reward squared."""
    rewards = torch.cat([chosen, rejected]).detach().double()
    return torch.stack([torch.tensor(float(len(chosen)), dtype=torch.float64, device=rewards.device),
                        losses.detach().double().sum(), (chosen > rejected).double().sum(),
                        (chosen - rejected).detach().double().sum(), rewards.sum(), (rewards ** 2).sum()]).cpu()


def figures_of(sums: torch.Tensor) -> dict[str, float]:
    """The averages of pair_figures' sums (summed over batches and ranks)."""
    pairs, loss, correct, margin, reward, squares = sums.tolist()
    mean = reward / (2 * pairs)
    return {"pairs": pairs, "correct": correct, "loss": loss / pairs, "accuracy": correct / pairs, "margin": margin / pairs,
            "reward_mean": mean, "reward_std": math.sqrt(max(squares / (2 * pairs) - mean * mean, 0.0))}


def _all_reduce(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        values = values.to(device)
        torch.distributed.all_reduce(values)
    return values.cpu()


class RewardTrainer(Trainer):
    """The Trainer with preference pairs for data, a ScalarModel for the model and the Bradley-Terry loss."""

    command = "rm"
    run_files = (*RUN_FILES, *FOLDER_FILES)  # the run's folder ends up a reward-model folder too
    fsdp_ok = False  # the model is a ScalarModel, and FSDP's saving rebuilds a GPT

    def _check_before_compute(self, config: RMConfig) -> RMConfig:
        refuse_fsdp(config.parallel, self.command, "its checkpoints save a scalar head beside the GPT")
        if not config.data:
            raise GptlabError("no preference pairs: pass --data SOURCES, e.g. prefs.jsonl or task:arithmetic[n=2000]")
        self.start = resolve_start(config.init_from, config.tokenizer, dropout=config.model.dropout)
        self.tokenizer, self.chat = self.start.tokenizer, self.start.chat
        self.fingerprint = self.tokenizer.fingerprint()
        config = dataclasses.replace(config, model=self.start.model_config)  # seq_len checked against it
        mixture = MixtureConfig.from_spec(config.data, seed=config.seed, val_fraction=config.val_fraction, on_error=config.on_error)
        self.splits = load_pairs(mixture)
        for report in self.splits["train"].mixture.reports:
            self.print(report.summary())
        # the reward is read at the <|end|>, so a rendering takes at most seq_len tokens (DPO's: seq_len + 1)
        self.rendered = {name: [render_pair(self.chat, pair, config.seq_len - 1) for pair in split.pairs]
                         for name, split in self.splits.items()}
        self.dropped = {name: sum(item is None for item in items) for name, items in self.rendered.items()}
        if any(self.dropped.values()):
            self.print(f"pairs longer than seq_len {config.seq_len} tokens, dropped: " +
                       ", ".join(f"{count} of {len(self.rendered[name])} {name}" for name, count in self.dropped.items()))
        if all(item is None for item in self.rendered["train"]):
            problems = [problem for report in self.splits["train"].mixture.reports for problem in report.problems]
            why = f"first problem: {problems[0]}" if problems else f"none fits seq_len {config.seq_len}"
            raise GptlabError(f"no preference pairs to train on in {config.data} ({why}); a pair is "
                              '{"prompt": ..., "chosen": ..., "rejected": ...}, see gptlab.align.preference.pairs')
        self.has_val = "val" in self.splits
        self.accum = config.accumulation_steps(self.runtime.world_size)
        self.precision = resolve_precision(config.precision, self.runtime.device)
        self.cast = autocast(self.runtime.device, self.precision)  # held_out runs before the build too
        self.tally = torch.zeros(6, dtype=torch.float64)
        return self._shorten_warmup(config)

    def _make_model(self) -> RewardModel:
        return RewardModel(self.start.model(self.runtime.device), self.config.seed).to(self.runtime.device)

    def start_model(self) -> RewardModel:
        """The model as step 0 has it (the --init trunk, the seed's head), without touching the run's random state."""
        saved = rng_state()
        try:
            return self._make_model()
        finally:
            set_rng_state(saved)

    def _loader(self, split: str) -> RewardPairLoader:
        config = self.config
        return RewardPairLoader(self.splits[split], self.rendered[split], self.chat,
                                config=PairLoaderConfig(batch_size=config.micro_batch, seq_len=config.seq_len, cycle=split == "train"),
                                rank=self.runtime.rank, world_size=self.runtime.world_size, device=self.runtime.device)

    def _token_bytes(self) -> torch.Tensor | None:
        return None

    def _task_every(self) -> int:
        return 0

    def pair_losses(self, model, x, lengths, kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(losses, chosen rewards, rejected rewards), each (B,), of a batch's pairs."""
        with self.cast:
            values = model(x)
        scores = last_scores(values.float(), lengths)
        B = len(kwargs["pair_index"])
        chosen, rejected = scores[:B], scores[B:]
        losses = bradley_terry_loss(chosen, rejected, kwargs["margin"], center_coefficient=self.config.center_rewards_coefficient)
        return losses, chosen, rejected

    def _step_batches(self) -> tuple[list[tuple], list[float | None]]:
        """The step's micro-batches; each one's loss is the mean over its pairs / accum (equal-sized micro-batches)."""
        self.tally = torch.zeros(6, dtype=torch.float64)
        return [self.train_loader.next_batch() for _ in range(self.accum)], [None] * self.accum

    def _micro_loss(self, x: torch.Tensor, lengths: torch.Tensor, kwargs: dict, weight: float | None) -> torch.Tensor:
        losses, chosen, rejected = self.pair_losses(self.wrapped, x, lengths, kwargs)
        self.tally += pair_figures(chosen, rejected, losses)
        return losses.mean() / self.accum

    def _step_metrics(self) -> dict[str, float]:
        figures = figures_of(_all_reduce(self.tally, self.runtime.device))
        return {key: figures[key] for key in ("accuracy", "margin", "reward_mean", "reward_std")}

    @torch.no_grad()
    def held_out(self, model: ScalarModel, *, batches: int | None = None) -> dict[str, float]:
        """Figures on the held-out pairs (every one, or each rank's first `batches` micro-batches), all ranks together:
        loss, accuracy with its 95% Wilson interval (accuracy_low, accuracy_high), margin, reward mean and std."""
        was_training = model.training
        model.eval()
        sums = torch.zeros(6, dtype=torch.float64)
        for x, lengths, kwargs in itertools.islice(self._loader("val"), batches):
            losses, chosen, rejected = self.pair_losses(model, x, lengths, kwargs)
            sums += pair_figures(chosen, rejected, losses)
        model.train(was_training)
        figures = figures_of(_all_reduce(sums, self.runtime.device))
        figures["accuracy_low"], figures["accuracy_high"] = wilson_interval(round(figures["correct"]), round(figures["pairs"]))
        return figures

    def _evaluate(self) -> None:
        if not self.has_val:
            return
        figures, state = self.held_out(self.model, batches=self.config.eval_batches), self.state
        state.val = {"bpb": None, **figures}
        state.best_val = figures["loss"] if state.best_val is None else min(state.best_val, figures["loss"])
        self.metrics.log({"step": state.step, **{f"val_{key}": figures[key] for key in
                                                 ("loss", "accuracy", "margin", "reward_mean", "reward_std")}})
        self.print(f"step {state.step:>6}: val loss {figures['loss']:.4f}, accuracy {figures['accuracy']:.3f}, margin "
                   f"{figures['margin']:.3f}, reward {figures['reward_mean']:.3f} ± {figures['reward_std']:.3f} "
                   f"({figures['pairs']:.0f} pairs)")

    def train_reward_spread(self) -> tuple[float, float]:
        """(mean, std) of the model's rewards on both replies of the first normalise_pairs train pairs that fit."""
        kept = [item for item in self.rendered["train"] if item is not None][: self.config.normalise_pairs]
        sequences = [item.chosen for item in kept] + [item.rejected for item in kept]
        rewards = score_sequences(self.model, sequences, self.chat.bos, device=self.runtime.device, cast=self.cast).double()
        std = rewards.std(unbiased=False).item() if len(rewards) > 1 else 0.0
        return rewards.mean().item(), std if std > 0 else 1.0


@dataclass
class RMResult:
    train: TrainResult
    before: dict[str, float] = field(default_factory=dict)  # held-out figures of the start (the init trunk, a fresh head)
    after: dict[str, float] = field(default_factory=dict)  # ... and of the trained reward model
    pairs: dict[str, int] = field(default_factory=dict)  # train and val pairs, and those dropped as too long
    normalise: dict[str, float] = field(default_factory=dict)  # the saved mean and std of the train replies' rewards
    folder: Path | None = None  # the reward-model folder written (the run folder), None when interrupted

    @property
    def status(self) -> str:
        return self.train.status


def run_rm(config: RMConfig, *, runtime=None, log: Callable[[str], None] = print, resume: bool = True,
           force: bool = False) -> RMResult:
    """Train a reward model, with held-out accuracy before and after; the run folder becomes a reward-model folder."""
    trainer = RewardTrainer(config, runtime=runtime, log=log, resume=resume, force=force)
    trainer.before_fn = (lambda: trainer.held_out(trainer.start_model())) if trainer.has_val else None
    result = trainer.fit()
    before, after, normalise, folder = trainer.before or {}, {}, {}, None
    if result.status != "interrupted":
        if trainer.has_val:
            after = trainer.held_out(trainer.model)
        if trainer.runtime.is_main:
            mean, std = trainer.train_reward_spread()
            normalise = {"mean": mean, "std": std}
            folder = write_reward_model(trainer.config.out, trainer.model, trainer.tokenizer, mean=mean, std=std,
                                        trained_on=trainer.config.data, heldout_accuracy=after.get("accuracy"))
    pairs = {name: len(items) - trainer.dropped[name] for name, items in trainer.rendered.items()}
    pairs["dropped"] = sum(trainer.dropped.values())
    if trainer.runtime.is_main:
        _report(log, before, after, pairs, normalise)
        log(f"{result.status} after {result.steps} steps in {result.seconds:.0f} s; "
            + (f"reward model -> {folder} (score with: gptlab rm-score {folder} --prompt ... --reply ...)" if folder
               else f"checkpoint {result.checkpoint}"))
    return RMResult(result, before, after, pairs, normalise, folder)


def _report(log: Callable[[str], None], before: dict, after: dict, pairs: dict, normalise: dict) -> None:
    """Held-out accuracy with its interval before -> after, the margin, and the normalisation saved."""
    if "val" in pairs:
        log(f"held-out pairs: {pairs['val']:,} (trained on {pairs['train']:,})")

    def accuracy(figures: dict) -> str:
        return f"{figures['accuracy']:.3f} [{figures['accuracy_low']:.3f}, {figures['accuracy_high']:.3f}]"

    if before and after:
        log(f"held-out accuracy (95% interval): {accuracy(before)} before -> {accuracy(after)} after")
        log(f"held-out reward margin: {before['margin']:.3f} before -> {after['margin']:.3f} after")
    elif after:
        log(f"held-out accuracy (95% interval): {accuracy(after)}; reward margin {after['margin']:.3f}")
    if normalise:
        log(f"train replies' rewards: mean {normalise['mean']:.3f}, std {normalise['std']:.3f} (scores are saved "
            "normalised by these)")
