"""Supervised fine-tuning (SFT): a base model learns to answer in the chat format.

    gptlab sft --init runs/shakespeare/train --data "task:arithmetic[n=20000], chats.jsonl@2" --out runs/sft

The pretraining Trainer runs underneath, unchanged: checkpoints, exact resume,
DDP, bf16, compile, metrics and the loss plot. What differs is the data and the
start: the base model's tokenizer gains the chat tokens (gptlab.chat.format),
the model's embedding and output rows grow for them (gptlab.model.resize), and
batches are rendered conversations whose targets are the assistant's tokens only
(gptlab.chat.loader), packed several to a row or padded one per row. The loss
is the mean over every assistant token of the step, however they fall into
micro-batches and ranks (gptlab.train.trainer).

Evaluation: val loss on held-out conversations (`val_fraction` of every file and
dataset, the `test` split of every task), and accuracy on the tasks' held-out
examples by greedy generation and their verifiers (gptlab.eval.chat).

Entropy: the mean entropy, in nats, of the model's next-token distribution at the
assistant tokens, logged as `val_entropy` at each evaluation (over the val batches;
one more forward of them, nothing on the train path) and as `entropy` on each step's
line when training sees its logits (fused_loss false, or compile): under the fused
loss the train step never holds the logits, and materialising them would cost what
the fusion saves. Falling towards 0 while val loss rises is the model growing sure
of wrong answers; a tuned model's entropy far below its base's says its sampling
has lost variety (the GRPO/PPO start that leaves little to explore).

Not here: reading sources (gptlab.chat.data), the loop itself (gptlab.train).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from gptlab.align.finetune.overfit import epochs_warning, overfitting_warning
from gptlab.align.logprobs import IGNORE, token_entropy
from gptlab.align.start import resolve_start
from gptlab.chat import ChatFormat
from gptlab.chat.data import Mixture, MixtureConfig
from gptlab.chat.loader import ConversationLoader, ConversationLoaderConfig
from gptlab.eval.loss import LOGIT_BYTES
from gptlab.model import GPT
from gptlab.runtime import GptlabError
from gptlab.runtime.device import resolve_precision
from gptlab.train.config import TrainConfig
from gptlab.train.optim import OptimizerConfig
from gptlab.train.schedule import ScheduleConfig
from gptlab.train.trainer import Trainer, TrainResult


@dataclass(frozen=True, kw_only=True)
class SFTConfig(TrainConfig):
    """TrainConfig's fields (data is a mixture spec, init_from the base model), and these."""

    data: str = ""  # conversations: a mixture of .jsonl files, hf:DATASET and task:NAME parts (gptlab.chat.data)
    init_from: str = ""  # the base model: a run, checkpoint or model folder (--init)
    tokenizer: str = ""  # the base model's tokenizer, when it has none saved with it (the chat tokens are added)

    val_fraction: float = 0.05  # held out of every file and dataset for val loss (tasks: their test split)
    on_error: str = "skip"  # malformed conversations: skip (counted, reported) | refuse (stop at the first)
    rows: str = "pack"  # pack (several conversations per row, each seeing only itself) | pad (one per row)
    tasks: str = "auto"  # built-in tasks whose held-out accuracy is measured (auto: the mixture's task: parts; none)
    task_every: int = 0  # steps between task accuracy evaluations (0: only before and after)
    task_examples: int = 100  # held-out examples per task and evaluation

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rows not in ("pack", "pad"):
            raise GptlabError(f"unknown rows {self.rows!r}; use pack or pad")
        if self.task_every < 0 or self.task_examples < 1:
            raise GptlabError(f"task_every must be 0 or more and task_examples at least 1, got {self.task_every}, {self.task_examples}")

    def eval_tasks(self) -> list:
        """The tasks to measure: the mixture's task: parts with their settings (auto), or those named."""
        return mixture_tasks(self.data, self.tasks)


def mixture_tasks(data: str, tasks: str) -> list:
    """tasks="auto": the task: parts of the mixture spec `data`, with their settings; "none"; or names, comma-separated."""
    from gptlab.chat.data import load_task

    if tasks == "none":
        return []
    if tasks == "auto":
        parts = [part for part in MixtureConfig.from_spec(data).parts if part.kind == "task"]
        unique = {(part.source, part.task_options): part for part in parts}
        return [load_task(source.removeprefix("task:"), options) for source, options in unique]
    return [load_task(name.strip()) for name in tasks.split(",") if name.strip()]


def sft_cpu() -> SFTConfig:
    """About 2.5 minutes on 2 CPU cores: the demo's fine-tuning of its Shakespeare model on two built-in tasks.

    Single digits and common words are tokens the Shakespeare model knows; 2-digit numbers are rare
    tokens whose embeddings it barely trained, so 1-digit sums are what it can learn in minutes.
    """
    return SFTConfig(
        data="task:arithmetic[n=20000,digits=1], task:spelling[n=20000]",
        optimizer=OptimizerConfig(lr=3e-3, weight_decay=0.0, betas=(0.9, 0.95)),
        schedule=ScheduleConfig(kind="cosine", warmup_steps=10, min_lr_ratio=0.0),
        batch_tokens=2048,
        micro_batch=16,
        seq_len=128,
        max_steps=240,
        eval_every=80,
        eval_batches=10,
        checkpoint_every=120,
    )


TOOL_MIXTURE = ("task:arithmetic[n=40000,digits=4,min_digits=2,ops=+*,tools=1,work=0]@2, "
                "task:arithmetic[n=5000,digits=4,ops=+*,work=0], task:word_problems[n=5000], task:compute[n=3000]")


def sft_tools() -> SFTConfig:
    """Tool use on 2 CPU cores: the demo's base model learns to hand sums and products to the calculator.

    Most of the mixture is multi-digit sums and products answered through the calculator (what the model must
    learn is to copy the question's numbers into the call, and the result out); a little is the same questions
    answered without it (what to do when no tool is offered), word problems and Python questions. Copying
    4-digit numbers needs far more steps than the demo's one-digit sums: 1,500 of 2,048 tokens (docs/tools.md).
    """
    return dataclasses.replace(sft_cpu(), data=TOOL_MIXTURE, max_steps=1500, eval_every=250, checkpoint_every=500)


SFT_PRESETS = {"sft-cpu": sft_cpu, "sft-tools": sft_tools}


class SFTTrainer(Trainer):
    """The Trainer with conversations for data and a grown base model for a start (see the module docstring)."""

    command = "sft"
    entropy_sums: torch.Tensor | None = None  # (entropy sum, counted tokens) since the last metrics line, unfused only
    overfit_warned = False  # the overfitting line is said once a run

    def _check_before_compute(self, config: SFTConfig) -> SFTConfig:
        if not config.data:
            raise GptlabError("no conversations: pass --data SOURCES, e.g. chats.jsonl or task:arithmetic")
        self.start = resolve_start(config.init_from, config.tokenizer, dropout=config.model.dropout)
        self.init_path, self.base_vocab = self.start.init_path, self.start.base_vocab
        self.tokenizer, self.chat = self.start.tokenizer, self.start.chat
        self.fingerprint = self.tokenizer.fingerprint()
        config = dataclasses.replace(config, model=self.start.model_config)  # seq_len is checked against the base model's context here
        self.mixtures = load_mixtures(config, self.print)
        self.has_val = "val" in self.mixtures
        self.precision = resolve_precision(config.precision, self.runtime.device)
        config = self._fit_micro_batch(config)  # 0: auto
        self.accum = config.accumulation_steps(self.runtime.world_size)
        return self._shorten_warmup(config)

    def _make_model(self) -> GPT:
        """The base model with rows for the chat tokens, each new one the mean of the trained rows."""
        return self.start.model(self.runtime.device)

    def _loader(self, split: str) -> ConversationLoader:
        config = self.config
        return ConversationLoader(
            self.mixtures[split], self.chat,
            config=ConversationLoaderConfig(batch_size=config.micro_batch, seq_len=config.seq_len, mode=config.rows,
                                            cycle=split == "train"),
            rank=self.runtime.rank, world_size=self.runtime.world_size, device=self.runtime.device,
        )

    def _token_bytes(self) -> torch.Tensor | None:
        return None  # bits per byte of assistant turns says little; val loss is reported

    def _evaluate(self) -> None:
        """Val loss (the Trainer's), then the entropy at the same val batches' assistant tokens (val_entropy);
        once a run, a line when val loss rises while the train loss falls far below it (gptlab.align.finetune.overfit)."""
        best_before = self.state.best_val
        super()._evaluate()
        if self.val_loader is None:
            return
        warning = overfitting_warning(self.state.losses, self.state.val["loss"], best_before, self.state.step)
        if warning and not self.overfit_warned:
            self.overfit_warned = True
            self.print(warning)
        self.val_loader.reset()
        entropy = evaluate_entropy(self.model, self.val_loader, self.config.eval_batches, self.cast)
        self.metrics.log({"step": self.state.step, "val_entropy": entropy})

    def _micro_loss(self, x: torch.Tensor, y: torch.Tensor, kwargs: dict, weight: float | None) -> torch.Tensor:
        """The Trainer's loss; when this path returns logits (not fused), also their entropy at the counted tokens."""
        if self.config.fused_loss and not self.config.compile:
            return super()._micro_loss(x, y, kwargs, weight)
        with self.cast:
            logits, loss = self.wrapped(x, y, loss_reduction="mean" if weight is None else "sum", fused_loss=False, **kwargs)
        counted = y != IGNORE
        if self.entropy_sums is None:
            self.entropy_sums = torch.zeros(2, dtype=torch.float64, device=y.device)  # entropy sum, counted tokens
        self.entropy_sums[0] += token_entropy(logits[counted].detach()).sum().double()  # stays on the device: no sync
        self.entropy_sums[1] += counted.sum()
        return loss / self.accum if weight is None else loss * weight

    def _step_metrics(self) -> dict[str, float]:
        """The mean entropy over the counted tokens this rank trained on since the last metrics line."""
        sums, self.entropy_sums = self.entropy_sums, None
        return {"entropy": (sums[0] / sums[1]).item()} if sums is not None and sums[1] > 0 else {}

    def _task_every(self) -> int:
        return self.config.task_every


def load_mixtures(config: SFTConfig, log: Callable[[str], None]) -> dict[str, Mixture]:
    """The train mixture and the held-out one (when val_fraction or a task gives one), their reports logged."""
    mixture_config = MixtureConfig.from_spec(config.data, seed=config.seed, val_fraction=config.val_fraction,
                                             on_error=config.on_error)
    mixtures = {"train": Mixture.load(mixture_config, "train")}
    if config.val_fraction > 0:
        mixtures["val"] = Mixture.load(mixture_config, "val")
    for report in mixtures["train"].reports:
        log(report.summary())
    return mixtures


@torch.no_grad()
def evaluate_entropy(model: torch.nn.Module, loader, n_batches: int, autocast=None) -> float:
    """Mean next-token entropy (nats) at the counted targets of `n_batches` batches (fewer if the loader runs out),
    a few rows at a time as gptlab.eval.loss does, summed over ranks; nan when nothing counts."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(2, dtype=torch.float64, device=next(model.parameters()).device)  # entropy sum, counted targets
    for _ in range(n_batches):
        try:
            x, y, *extra = loader.next_batch()
        except StopIteration:
            break
        kwargs = extra[0] if extra else {}
        rows = max(1, LOGIT_BYTES // (4 * x.shape[1] * model.config.vocab_size))
        for start in range(0, x.shape[0], rows):
            part = {key: value[start : start + rows] if torch.is_tensor(value) and value.shape[:1] == x.shape[:1] else value
                    for key, value in kwargs.items()}
            with autocast or nullcontext():
                logits, _ = model(x[start : start + rows], **part)
            counted = y[start : start + rows] != IGNORE
            sums[0] += token_entropy(logits[counted]).sum().double()
            sums[1] += counted.sum()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(sums)
    if was_training:
        model.train()
    return (sums[0] / sums[1]).item() if sums[1] > 0 else float("nan")


def chat_sampler(question: str, max_new_tokens: int = 64) -> Callable[[GPT, object], str]:
    """(model, tokenizer) -> the model's greedy answer to `question`, for the trainer's periodic samples."""
    from gptlab.infer.generate import SamplingConfig, generate

    def sample(model: GPT, tokenizer) -> str:
        chat = ChatFormat(tokenizer)
        prompt = chat.prompt([{"role": "user", "content": question}])
        room = min(max_new_tokens, model.config.block_size - len(prompt))
        config = SamplingConfig(max_new_tokens=max(room, 1), temperature=0, stop_tokens=chat.stop_tokens,
                                vocab_size=tokenizer.vocab_size)
        (ids,) = generate(model, [prompt], config, truncate=True)
        return f"{question!r} -> {tokenizer.decode(ids)!r}"

    return sample


@dataclass
class SFTResult:
    train: TrainResult
    before: dict[str, float] = field(default_factory=dict)  # task accuracies of the base model (grown, untuned)
    after: dict[str, float] = field(default_factory=dict)  # ... and of the fine-tuned one
    rows: dict[str, int] = field(default_factory=dict)  # the train loader's counts: conversations, truncated, dropped, ...
    seen: dict[str, float] = field(default_factory=dict)  # accuracy after, on questions of the training split

    @property
    def status(self) -> str:
        return self.train.status


def run_sft(config: SFTConfig, *, runtime=None, log: Callable[[str], None] = print, resume: bool = True,
            force: bool = False, flags: str = "") -> SFTResult:
    """Fine-tune, with held-out task accuracy before and after (every rank calls this under torchrun); `flags` is the
    prefix of the command's flags in its hints (gptlab run: "sft.")."""
    from gptlab.eval.chat import task_accuracy_fn
    from gptlab.tools.turn import tasks_own_tools

    chosen = config.eval_tasks()
    trainer = SFTTrainer(config, runtime=runtime, log=log, resume=resume, force=force,
                         sample_fn=chat_sampler(chosen[0].examples("test", 1)[0].question) if chosen else None)
    tasks = task_accuracy_fn(trainer.chat, chosen, config.task_examples, tools=tasks_own_tools(trainer.chat)) if chosen else None
    trainer.task_fn = tasks
    warning = epochs_warning(trainer.config, trainer.mixtures["train"], trainer.chat, flags)
    if warning:
        trainer.print(warning)
    if tasks is not None:
        trainer.before_fn = lambda: tasks(trainer.start.model(trainer.runtime.device))
    result = trainer.fit()
    before = trainer.before or {}
    after, seen = {}, {}
    if tasks is not None and result.status != "interrupted":
        after = tasks(trainer.model)
        # the same measure on questions it trained on: learning what it was taught, apart from generalising
        seen = task_accuracy_fn(trainer.chat, chosen, config.task_examples, split="train",
                               tools=tasks_own_tools(trainer.chat))(trainer.model)
    rows = dict(trainer.train_loader.stats) if hasattr(trainer, "train_loader") else {}
    if trainer.runtime.is_main:
        if rows.get("truncated") or rows.get("dropped"):
            log(f"conversations longer than seq_len {config.seq_len}: {rows['truncated']} cut at a turn boundary, "
                f"{rows['dropped']} dropped (of {rows['conversations']} served)")
        for key in after:
            log(f"{key}: {before.get(key, float('nan')):.3f} before fine-tuning -> {after[key]:.3f} after on held-out "
                f"questions ({seen[key]:.3f} on questions it trained on)")
        log(f"{result.status} after {result.steps} steps in {result.seconds:.0f} s; checkpoint {result.checkpoint}")
    return SFTResult(result, before, after, rows, seen)
