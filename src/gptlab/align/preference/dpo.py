"""Direct Preference Optimisation (DPO): a chat model learns to prefer the chosen reply of each pair.

    gptlab dpo --init runs/sft --data "task:arithmetic[n=2000,digits=1], prefs.jsonl" --out runs/dpo

With the policy π (the model trained) and the reference π_ref (the --init model, frozen), the
implicit reward of a reply is r = β · (log π(reply | prompt) − log π_ref(reply | prompt)), and
h = (log π(c) − log π_ref(c)) − (log π(r) − log π_ref(r)) for a chosen c and rejected r. Losses:

    sigmoid   −log σ(β h)                     (Rafailov et al. 2023, eq. 7)
              (1 − ε)·−log σ(β h) + ε·−log σ(−β h) with label_smoothing ε: conservative DPO,
              for labels that are wrong with probability ε
              + α·NLL(c) per token with sft_weight α: RPO (Pang et al. 2024; TRL's rpo_alpha). Plain DPO
              can widen the margin by making both replies unlikely; this keeps the chosen one likely
    ipo       (h − 1/(2β))²                   (Azar et al. 2023, eq. 17), with the log-probabilities
              averaged over the reply's tokens, as TRL does: IPO's target margin 1/(2β) is then
              per token, and long replies do not dominate

The reference log-probabilities are computed once, before training, by the --init model in eval
mode, for every train and held-out pair, and saved in the run folder (reference_logprobs.pt); a
resumed run reads them back. reference="model" keeps a frozen copy of the init model instead and
scores each batch with it (more memory and compute, the same numbers up to float rounding).

A step's loss is the mean over its pairs (batch_tokens / seq_len pairs per step). Logged per step:
chosen_reward, rejected_reward, reward_margin and reward_accuracy (the share of pairs whose chosen
reward is higher); per evaluation (eval_every), val_loss, val_margin and val_accuracy on each rank's
first eval_batches micro-batches of held-out pairs (as gptlab sft's val loss). Before and after
training, on every held-out pair: the preference accuracy of the model itself (the share of pairs
whose chosen reply it finds likelier), the mean log-prob margin; the same accuracy on a sample of the
train pairs (TRAIN_SAMPLE), with a note when the start already separates them (SEPARATED: preference
accuracy then has little room to rise, and DPO mostly widens the margins); and, for task: data, task
accuracy by greedy generation (gptlab.eval.chat), also every task_every steps.

Not here: reading and batching pairs (gptlab.align.preference.pairs), the loop (gptlab.train.trainer).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from gptlab.align.finetune.sft import chat_sampler, mixture_tasks
from gptlab.align.logprobs import token_logprobs
from gptlab.align.preference.pairs import IGNORE, PairLoader, PairLoaderConfig, load_pairs, pair_rows, render_pairs
from gptlab.align.start import refuse_fsdp, resolve_start
from gptlab.chat.data import MixtureConfig
from gptlab.model import GPT
from gptlab.runtime import GptlabError
from gptlab.runtime.device import autocast, resolve_precision
from gptlab.runtime.files import atomic_path
from gptlab.train.config import TrainConfig
from gptlab.train.optim import OptimizerConfig
from gptlab.train.schedule import ScheduleConfig
from gptlab.train.trainer import RUN_FILES, Trainer, TrainResult

LOSSES = ("sigmoid", "ipo")
REFERENCES = ("precomputed", "model")
REFERENCE_FILE = "reference_logprobs.pt"
REFERENCE_VERSION = 1
TRAIN_SAMPLE = 256  # train pairs whose preference accuracy is measured before and after training
SEPARATED = 0.95  # a start preferring the chosen reply of this share of train pairs gets a note


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, *, beta: float, kind: str = "sigmoid",
             label_smoothing: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(losses, chosen_rewards, rejected_rewards), each (B,), from (B,) log-probabilities (module docstring).

    For kind="ipo" pass each reply's mean log-probability per token; for "sigmoid" its sum.
    Rewards are β · (policy − reference), detached: they are for watching, not for gradients.
    """
    h = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    if kind == "sigmoid":
        losses = -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)
    elif kind == "ipo":
        losses = (h - 1 / (2 * beta)) ** 2
    else:
        raise GptlabError(f"unknown DPO loss {kind!r}; use one of {', '.join(LOSSES)}")
    chosen_rewards = beta * (policy_chosen - ref_chosen).detach()
    rejected_rewards = beta * (policy_rejected - ref_rejected).detach()
    return losses, chosen_rewards, rejected_rewards


@dataclass(frozen=True, kw_only=True)
class DPOConfig(TrainConfig):
    """TrainConfig's fields (data is a mixture of pairs, init_from the model to align), and these."""

    data: str = ""  # preference pairs: .jsonl files, hf:DATASET and task:NAME parts (gptlab.align.preference.pairs)
    init_from: str = ""  # the model to align, usually an SFT run (--init); also the reference model
    tokenizer: str = ""  # the model's tokenizer, when it has none saved with it
    beta: float = 0.1  # how far from the reference the policy may move: larger keeps it closer
    loss: str = "sigmoid"  # sigmoid (DPO) | ipo
    label_smoothing: float = 0.0  # sigmoid: the assumed share of mislabelled pairs (conservative DPO)
    sft_weight: float = 0.0  # adds this times the chosen replies' per-token NLL (RPO; TRL's rpo_alpha): keeps them likely
    reference: str = "precomputed"  # precomputed (once, saved with the run) | model (a frozen copy, scored each step)
    val_fraction: float = 0.05  # held out of every file and dataset (tasks: their test split)
    on_error: str = "skip"  # malformed pairs: skip (counted, reported) | refuse (stop at the first)
    tasks: str = "auto"  # built-in tasks whose accuracy is measured before and after (auto: the data's task: parts; none)
    task_examples: int = 100  # held-out examples per task and evaluation
    task_every: int = 0  # steps between task accuracy evaluations (0: only before and after), as in gptlab sft

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (math.isfinite(self.beta) and self.beta > 0):
            raise GptlabError(f"beta must be a number above 0, got {self.beta}")
        if self.loss not in LOSSES:
            raise GptlabError(f"unknown loss {self.loss!r}; use one of {', '.join(LOSSES)}")
        if not 0 <= self.label_smoothing < 0.5:
            raise GptlabError(f"label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        if self.label_smoothing and self.loss != "sigmoid":
            raise GptlabError(f"label_smoothing is for the sigmoid loss, not {self.loss}; drop it")
        if not (math.isfinite(self.sft_weight) and self.sft_weight >= 0):
            raise GptlabError(f"sft_weight must be 0 or more, got {self.sft_weight}")
        if self.reference not in REFERENCES:
            raise GptlabError(f"unknown reference {self.reference!r}; use one of {', '.join(REFERENCES)}")
        if self.task_every < 0 or self.task_examples < 1:
            raise GptlabError(f"task_every must be 0 or more and task_examples at least 1, got {self.task_every}, {self.task_examples}")

    def eval_tasks(self) -> list:
        """The tasks whose accuracy is measured: the data's task: parts (auto), those named, or none."""
        return mixture_tasks(self.data, self.tasks)


def dpo_cpu() -> DPOConfig:
    """About 1.5 minutes on 2 CPU cores: the demo's SFT model learns to prefer right sums and spellings over wrong ones.

    Measured on the demo model: held-out preference accuracy 0.568 -> 0.632 (125 pairs), but greedy
    spelling accuracy fell 0.20 -> 0.13: both replies' log-probs fall, the rejected faster (beta 0.5 did
    the same). Task accuracy is not what this preset improves.
    """
    return DPOConfig(
        data="task:arithmetic[n=2000,digits=1], task:spelling[n=2000]",
        optimizer=OptimizerConfig(lr=1e-4, weight_decay=0.0, betas=(0.9, 0.95)),
        schedule=ScheduleConfig(kind="cosine", warmup_steps=10, min_lr_ratio=0.1),
        batch_tokens=32 * 64,
        micro_batch=16,
        seq_len=64,
        max_steps=120,
        eval_every=40,
        checkpoint_every=60,
    )


DPO_PRESETS = {"dpo-cpu": dpo_cpu}


def reply_scores(sums: torch.Tensor, y: torch.Tensor, kind: str) -> torch.Tensor:
    """What the loss compares: each row's summed reply log-probability (sigmoid), or its mean per token (ipo)."""
    return sums if kind == "sigmoid" else sums / (y != IGNORE).sum(-1).clamp(min=1)


def reference_logprobs(model: GPT, rendered: list, bos: int, *, batch_size: int, device: torch.device,
                       cast=None) -> torch.Tensor:
    """The reference's (N, 2) scores of every pair, computed once before training (pair_logprobs)."""
    return pair_logprobs(model, rendered, bos, batch_size=batch_size, device=device, cast=cast)


@torch.no_grad()
def pair_logprobs(model: GPT, rendered: list, bos: int, *, batch_size: int, device: torch.device,
                  cast=None) -> torch.Tensor:
    """(N, 2) float32 summed log-probabilities of each pair's chosen and rejected reply (NaN: a dropped pair)."""
    was_training = model.training
    model.eval()
    table = torch.full((len(rendered), 2), math.nan)
    kept = [index for index, item in enumerate(rendered) if item is not None]
    for start in range(0, len(kept), batch_size):
        chunk = kept[start : start + batch_size]
        x, y = pair_rows([rendered[index] for index in chunk], bos)
        with cast or contextlib.nullcontext():
            scores = token_logprobs(model, x.to(device), y.to(device)).sum(-1).float().cpu()
        table[chunk] = torch.stack([scores[: len(chunk)], scores[len(chunk) :]], dim=1)
    model.train(was_training)
    return table


def _all_reduce(values: torch.Tensor) -> torch.Tensor:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(values)
    return values


class DPOTrainer(Trainer):
    """The Trainer with preference pairs for data and the DPO loss (see the module docstring)."""

    command = "dpo"
    run_files = (*RUN_FILES, REFERENCE_FILE)
    fsdp_ok = False  # the reference model is a copy of the policy, made after it is wrapped

    def _check_before_compute(self, config: DPOConfig) -> DPOConfig:
        refuse_fsdp(config.parallel, self.command, "its reference model is a copy of the policy's whole weights")
        if not config.data:
            raise GptlabError("no preference pairs: pass --data SOURCES, e.g. prefs.jsonl or task:arithmetic[n=2000]")
        self.start = resolve_start(config.init_from, config.tokenizer, dropout=config.model.dropout)
        self.init_path, self.tokenizer, self.chat = self.start.init_path, self.start.tokenizer, self.start.chat
        self.fingerprint = self.tokenizer.fingerprint()
        config = dataclasses.replace(config, model=self.start.model_config)  # seq_len checked against the model's context
        mixture = MixtureConfig.from_spec(config.data, seed=config.seed, val_fraction=config.val_fraction,
                                          on_error=config.on_error)
        self.splits = load_pairs(mixture)
        for report in self.splits["train"].mixture.reports:
            self.print(report.summary())
        self.rendered = {name: render_pairs(self.chat, split, config.seq_len) for name, split in self.splits.items()}
        self.dropped = {name: sum(item is None for item in items) for name, items in self.rendered.items()}
        if any(self.dropped.values()):
            self.print(f"pairs longer than seq_len {config.seq_len} + 1 tokens, dropped: " +
                       ", ".join(f"{count} of {len(self.rendered[name])} {name}" for name, count in self.dropped.items()))
        self.has_val = "val" in self.splits
        self.accum = config.accumulation_steps(self.runtime.world_size)
        self.precision = resolve_precision(config.precision, self.runtime.device)
        self.cast = autocast(self.runtime.device, self.precision)  # held_out runs before the build too
        self.tally = torch.zeros(4)
        return self._shorten_warmup(config)

    def _make_model(self) -> GPT:
        return self.start.model(self.runtime.device)

    def _loader(self, split: str) -> PairLoader:
        config = self.config
        return PairLoader(self.splits[split], self.rendered[split], self.chat,
                          config=PairLoaderConfig(batch_size=config.micro_batch, seq_len=config.seq_len, cycle=split == "train"),
                          rank=self.runtime.rank, world_size=self.runtime.world_size, device=self.runtime.device)

    def _token_bytes(self) -> torch.Tensor | None:
        return None

    def _task_every(self) -> int:
        return self.config.task_every

    def _build(self) -> None:
        """The Trainer's build, then the reference: the model is still the init model here (restore comes after)."""
        super()._build()
        self.reference_model, self.reference_table = None, {}
        if self.config.reference == "model":
            self.reference_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        else:
            self.reference_table = self._reference_table()

    def _reference_key(self) -> str:
        config = self.config
        return json.dumps({"data": config.data, "init_from": config.init_from, "seq_len": config.seq_len,
                           "seed": config.seed, "val_fraction": config.val_fraction, "tokenizer": self.fingerprint,
                           "pairs": {name: len(items) for name, items in self.rendered.items()}}, sort_keys=True)

    def _reference_table(self) -> dict[str, torch.Tensor]:
        """The saved reference log-probs of this run, or computed now by the init model and saved (rank 0)."""
        path = Path(self.config.out) / REFERENCE_FILE
        if path.is_file():
            saved = torch.load(path, map_location="cpu", weights_only=True)
            if saved.get("key") != self._reference_key():
                raise GptlabError(f"{path} was computed for other pairs or another model; use --force to start over")
            self.print(f"reference log-probs read from {path}")
            return {name: saved[name] for name in self.rendered}
        self.print(f"reference log-probs: scoring {sum(len(items) for items in self.rendered.values()):,} pairs "
                   "with the init model, once")
        table = {name: reference_logprobs(self.model, items, self.chat.bos, batch_size=2 * self.config.micro_batch,
                                          device=self.runtime.device, cast=self.cast)
                 for name, items in self.rendered.items()}
        if self.runtime.is_main:
            with atomic_path(path) as temporary:
                torch.save({"version": REFERENCE_VERSION, "key": self._reference_key(), **table}, temporary)
        return table

    def _reference_scores(self, split: str, index: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """(2B,) the reference's scores of the batch's rows, as reply_scores computes the policy's."""
        if self.reference_model is not None:
            with torch.no_grad(), self.cast:
                sums = token_logprobs(self.reference_model, x, y).sum(-1)
        else:
            table = self.reference_table[split][index.cpu()]
            sums = torch.cat([table[:, 0], table[:, 1]]).to(x.device)
        return reply_scores(sums, y, self.config.loss)

    def _pair_losses(self, model, split: str, x, y, kwargs) -> tuple[torch.Tensor, ...]:
        """(losses, chosen_rewards, rejected_rewards, the policy's summed reply log-probs) of a batch's pairs."""
        index = kwargs["pair_index"]
        with self.cast:
            sums = token_logprobs(model, x, y).sum(-1)
        policy = reply_scores(sums, y, self.config.loss)
        reference = self._reference_scores(split, index, x, y)
        B = len(index)
        config = self.config
        losses, chosen, rejected = dpo_loss(policy[:B], policy[B:], reference[:B], reference[B:], beta=config.beta,
                                            kind=config.loss, label_smoothing=config.label_smoothing)
        return losses, chosen, rejected, sums

    def _step_batches(self) -> tuple[list[tuple], list[float | None]]:
        """The step's micro-batches; each one's loss is the mean over its pairs / accum (equal-sized micro-batches)."""
        self.tally = torch.zeros(4)  # chosen reward, rejected reward, reward accuracy (sums), pairs
        return [self.train_loader.next_batch() for _ in range(self.accum)], [None] * self.accum

    def _micro_loss(self, x: torch.Tensor, y: torch.Tensor, kwargs: dict, weight: float | None) -> torch.Tensor:
        losses, chosen, rejected, sums = self._pair_losses(self.wrapped, "train", x, y, kwargs)
        counts = [chosen.sum(), rejected.sum(), (chosen > rejected).sum(), chosen.new_tensor(len(chosen))]  # on the model's device
        self.tally += torch.stack([count.detach().float() for count in counts]).cpu()
        loss = losses.mean()
        if self.config.sft_weight:  # RPO: the chosen replies' NLL per token, so DPO cannot just make both unlikely
            B = len(chosen)
            loss = loss + self.config.sft_weight * -(sums[:B] / (y[:B] != IGNORE).sum(-1).clamp(min=1)).mean()
        return loss / self.accum

    def _step_metrics(self) -> dict[str, float]:
        chosen, rejected, correct, pairs = _all_reduce(self.tally.to(self.runtime.device)).tolist()
        return {"chosen_reward": chosen / pairs, "rejected_reward": rejected / pairs,
                "reward_margin": (chosen - rejected) / pairs, "reward_accuracy": correct / pairs}

    def train_preference(self, model: GPT) -> float:
        """The share of a seeded sample of TRAIN_SAMPLE train pairs whose chosen reply the model finds likelier
        (every rank scores the same sample: no collective needed)."""
        rendered = self.rendered["train"]
        kept = [index for index, item in enumerate(rendered) if item is not None]
        order = torch.randperm(len(kept), generator=torch.Generator().manual_seed(self.config.seed))[:TRAIN_SAMPLE]
        table = pair_logprobs(model, [rendered[kept[i]] for i in order.tolist()], self.chat.bos,
                              batch_size=2 * self.config.micro_batch, device=self.runtime.device, cast=self.cast)
        return (table[:, 0] > table[:, 1]).float().mean().item() if len(table) else math.nan

    def note_separated(self, figures: dict[str, float]) -> None:
        """Say so when the start already prefers the chosen replies: DPO can still widen the margins, not much more."""
        accuracy = figures.get("train_preference_accuracy", math.nan)
        if not accuracy >= SEPARATED:
            return
        sample = min(TRAIN_SAMPLE, len(self.rendered["train"]) - self.dropped["train"])
        held = f" and {figures['preference_accuracy']:.1%} held out" if "preference_accuracy" in figures else ""
        self.print(f"note: the start already prefers the chosen reply in {accuracy:.1%} of {sample} train pairs{held}: the pairs "
                   "are already separated, so preference accuracy has little room to rise and DPO mostly widens the log-prob "
                   "margins; for a measurable change use harder pairs (e.g. task:arithmetic[digits=2]) or another --data source")

    @torch.no_grad()
    def held_out(self, model: GPT, *, reference: bool = True, batches: int | None = None) -> dict[str, float]:
        """Figures on the held-out pairs (every one, or each rank's first `batches` micro-batches: eval_batches, as
        gptlab sft's val loss): the model's preference accuracy (log π(chosen) > log π(rejected)) and mean log-prob
        margin, and with the reference, DPO's loss, reward margin and reward accuracy."""
        was_training = model.training
        model.eval()
        totals = torch.zeros(6, dtype=torch.float64)  # pairs, preferred, log-prob margin, loss, reward margin, accuracy
        for x, y, kwargs in itertools.islice(self._loader("val"), batches):
            B = len(kwargs["pair_index"])
            if reference:
                losses, chosen, rejected, sums = self._pair_losses(model, "val", x, y, kwargs)
                totals[3:] += torch.stack([losses.sum(), (chosen - rejected).sum(), (chosen > rejected).sum()]).double().cpu()
            else:
                with self.cast:
                    sums = token_logprobs(model, x, y).sum(-1)
            margins = (sums[:B] - sums[B:]).double().cpu()
            totals[:3] += torch.stack([torch.tensor(B, dtype=torch.float64), (margins > 0).sum(), margins.sum()])
        model.train(was_training)
        pairs, preferred, margin, loss, reward_margin, accuracy = _all_reduce(totals.to(self.runtime.device)).tolist()
        figures = {"pairs": pairs, "preference_accuracy": preferred / pairs, "logp_margin": margin / pairs}
        if reference:
            figures.update(loss=loss / pairs, reward_margin=reward_margin / pairs, reward_accuracy=accuracy / pairs)
        return figures

    def _evaluate(self) -> None:
        if not self.has_val:
            return
        figures, state = self.held_out(self.model, batches=self.config.eval_batches), self.state
        state.val = {"bpb": None, **figures}
        state.best_val = figures["loss"] if state.best_val is None else min(state.best_val, figures["loss"])
        self.metrics.log({"step": state.step, "val_loss": figures["loss"], "val_margin": figures["reward_margin"],
                          "val_accuracy": figures["reward_accuracy"], "val_preference_accuracy": figures["preference_accuracy"]})
        self.print(f"step {state.step:>6}: val loss {figures['loss']:.4f}, reward margin {figures['reward_margin']:.3f}, "
                   f"reward accuracy {figures['reward_accuracy']:.3f}, preference accuracy "
                   f"{figures['preference_accuracy']:.3f} ({figures['pairs']:.0f} pairs)")


@dataclass
class DPOResult:
    train: TrainResult
    before: dict[str, float] = field(default_factory=dict)  # held-out figures of the init model
    after: dict[str, float] = field(default_factory=dict)  # ... and of the aligned one
    pairs: dict[str, int] = field(default_factory=dict)  # train and val pairs, and those dropped as too long

    @property
    def status(self) -> str:
        return self.train.status


def run_dpo(config: DPOConfig, *, runtime=None, log: Callable[[str], None] = print, resume: bool = True,
            force: bool = False) -> DPOResult:
    """Align with DPO, with held-out preference and task accuracy before and after (every rank calls this)."""
    from gptlab.eval.chat import task_accuracy_fn
    from gptlab.tools.turn import tasks_own_tools

    chosen = config.eval_tasks()
    trainer = DPOTrainer(config, runtime=runtime, log=log, resume=resume, force=force,
                         sample_fn=chat_sampler(chosen[0].examples("test", 1)[0].question) if chosen else None)
    tasks = task_accuracy_fn(trainer.chat, chosen, config.task_examples, tools=tasks_own_tools(trainer.chat)) if chosen else None
    trainer.task_fn = tasks  # every task_every steps too
    def measure_start() -> dict[str, float]:
        init, figures = trainer.start.model(trainer.runtime.device), {}
        if trainer.has_val:
            figures.update(trainer.held_out(init, reference=False))
        figures["train_preference_accuracy"] = trainer.train_preference(init)
        trainer.note_separated(figures)
        if tasks is not None:
            figures.update(tasks(init))
        return figures

    trainer.before_fn = measure_start
    result = trainer.fit()
    before, after = trainer.before or {}, {}
    if result.status != "interrupted":
        if trainer.has_val:
            after.update(trainer.held_out(trainer.model, reference=False))
        after["train_preference_accuracy"] = trainer.train_preference(trainer.model)
        if tasks is not None:
            after.update(tasks(trainer.model))
    pairs = {name: len(items) - trainer.dropped[name] for name, items in trainer.rendered.items()}
    pairs["dropped"] = sum(trainer.dropped.values())
    if trainer.runtime.is_main:
        _report(log, before, after, pairs)
        log(f"{result.status} after {result.steps} steps in {result.seconds:.0f} s; checkpoint {result.checkpoint}")
    return DPOResult(result, before, after, pairs)


def _report(log: Callable[[str], None], before: dict, after: dict, pairs: dict) -> None:
    """A line per figure: before -> after, on the held-out pairs and questions."""
    shown = [key for key in before if key != "pairs" and key in after]
    if "val" in pairs:
        log(f"held-out pairs: {pairs['val']:,} (trained on {pairs['train']:,})")
    for key in shown:
        log(f"{key}: {before[key]:.3f} before DPO -> {after[key]:.3f} after")
