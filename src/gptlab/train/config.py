"""The training configuration (one dataclass of component configs) and its named presets.

Every field can be overridden from the command line (`--model.n-layer 6`,
`--optimizer.lr 1e-3`); the resolved config is saved with every checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from gptlab.model import ModelConfig, preset
from gptlab.model.accounting import count_params
from gptlab.parallel import ParallelConfig
from gptlab.runtime import GptlabError
from gptlab.runtime.config import flag
from gptlab.train.optim import OptimizerConfig
from gptlab.train.schedule import ScheduleConfig


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    data: str = ""  # a folder made by `gptlab data prepare`
    out: str = ""  # the run's folder ("": a new runs/train-DATE-TIME)
    tokenizer: str = ""  # the data's tokenizer (folder or name), checked against the data and saved in checkpoints
    init_from: str = ""  # start from these weights: gpt2, a Hugging Face folder, a checkpoint or run folder
    model: ModelConfig = field(default_factory=lambda: preset("gpt2-mini"))  # the architecture (--model.*)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)  # AdamW (--optimizer.*)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)  # the learning-rate schedule (--schedule.*)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)  # how ranks share the work under torchrun (--parallel.*)
    batch_tokens: int = 8192  # tokens per optimizer step, all ranks and micro-steps together
    micro_batch: int = 16  # sequences per forward pass on each rank (0: auto, the largest that fits the free memory)
    seq_len: int = 256  # tokens per sequence
    max_steps: int = 1000  # optimizer steps of the whole run
    grad_clip: float = 1.0  # clip the gradient norm to this (0: no clipping)
    precision: str = "auto"  # auto | fp32 | bf16 | fp16 (fp16 uses a GradScaler)
    compile: bool = False  # torch.compile the training step
    activation_checkpointing: bool = False  # keep only each block's input, recompute the block in backward: less memory, ~1/3 more compute
    fused_loss: bool = True  # head + cap + cross-entropy fused in chunks (gptlab.model.loss; not with compile); false: the plain path
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    seed: int = 1337  # seeds the weights, dropout and random batches
    loader_mode: str = "sequential"  # sequential (the shards in order) | random (nanoGPT's random windows)
    eval_every: int = 100  # steps between val evaluations (0: only at the end)
    eval_batches: int = 20  # val batches per evaluation during training
    sample_every: int = 0  # steps between printed samples (0: only at the end)
    sample_tokens: int = 200  # tokens per printed sample (0: no samples, not even at the end)
    hellaswag_every: int = 0  # steps between HellaSwag evaluations (0: never); needs a tokenizer
    hellaswag_path: str = ""  # the official validation jsonl (default: the cached download)
    hellaswag_limit: int = 0  # examples per evaluation (0: all 10,042)
    checkpoint_every: int = 500  # steps between checkpoints (one is always saved at the end)
    keep_last: int = 2  # step checkpoints kept (the best by val loss is kept too)
    log_every: int = 10  # steps between metric lines
    mfu_peak: str = "auto"  # peak FLOP/s for MFU: auto (the GPU's datasheet), a100 | h100 | h200 | cpu, or a number
    time_limit: float = 0.0  # seconds of training, all resumes together, after which to stop (0: none); the schedule follows the share spent
    tensorboard: bool = False  # also log to TensorBoard (OUT/tensorboard)
    wandb: str = ""  # a project name turns Weights & Biases on
    trackio: str = ""  # a project name turns trackio on (local-first, W&B's API; stored under $TRACKIO_DIR)

    def __post_init__(self) -> None:
        for name in ("batch_tokens", "seq_len", "max_steps", "eval_batches", "keep_last", "log_every"):
            if getattr(self, name) < 1:
                raise GptlabError(f"{flag(name)} must be at least 1, got {getattr(self, name)}")
        for name in ("micro_batch", "eval_every", "sample_every", "sample_tokens", "hellaswag_every", "hellaswag_limit", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise GptlabError(f"{flag(name)} must be 0 or more, got {getattr(self, name)}")
        if self.loader_mode not in ("sequential", "random"):
            raise GptlabError(f"unknown --loader-mode {self.loader_mode!r}; use sequential or random")
        if self.time_limit < 0 or self.grad_clip < 0:
            raise GptlabError(f"--time-limit and --grad-clip must be 0 or more, got {self.time_limit} and {self.grad_clip}")
        if self.seq_len > self.model.block_size:
            raise GptlabError(self._seq_len_problems())

    def _seq_len_problems(self) -> str:
        """Every flag a --seq-len longer than the model's context needs changed, in one message."""
        if self.init_from:  # the model's context is the one of the weights it starts from
            return (f"--seq-len {self.seq_len} is longer than the context of the model it starts from ({self.init_from}: "
                    f"block_size {self.model.block_size}); pass --seq-len {self.model.block_size} or less")
        fixes = [f"--model.block-size {self.seq_len}"]
        per_pass = self.seq_len * max(self.micro_batch, 1)
        batch = ""
        if self.batch_tokens % per_pass:
            rounded = max(1, round(self.batch_tokens / per_pass)) * per_pass
            fixes.append(f"--batch-tokens {rounded}")
            batch = (f", and a batch of {self.batch_tokens:,} tokens does not divide by --micro-batch {self.micro_batch} x "
                     f"--seq-len {self.seq_len} = {per_pass:,}")
        return (f"--seq-len {self.seq_len} is longer than the model's context (--model.block-size {self.model.block_size}){batch}; "
                f"set {' and '.join(fixes)} (or a shorter --seq-len)")

    def sequences_per_rank(self, world_size: int) -> int:
        """Sequences each rank trains on per optimizer step, all its micro-steps together."""
        if self.batch_tokens % (self.seq_len * world_size):
            raise GptlabError(f"batch of {self.batch_tokens:,} tokens does not divide by seq_len {self.seq_len} x "
                              f"world {world_size} = {self.seq_len * world_size:,}; change --batch-tokens or --seq-len")
        return self.batch_tokens // (self.seq_len * world_size)

    def accumulation_steps(self, world_size: int) -> int:
        """Micro-steps per optimizer step; the batch must divide exactly."""
        if not self.micro_batch:
            raise GptlabError("micro_batch 0 (auto: chosen from the free memory) is for gptlab train and sft; "
                              "pass --micro-batch N")
        per_pass = self.micro_batch * self.seq_len * world_size
        if self.batch_tokens % per_pass:
            raise GptlabError(
                f"batch of {self.batch_tokens:,} tokens does not divide by micro_batch {self.micro_batch} x "
                f"seq_len {self.seq_len} x world {world_size} = {per_pass:,}; change --batch-tokens or --micro-batch"
            )
        return self.batch_tokens // per_pass


def shakespeare_cpu() -> TrainConfig:
    """Minutes on 2 CPU cores: a small GPT on the built-in corpus with a 4096-token BPE, the levers that won here.

    AdamW at 3e-3, with 0.07 for the embeddings and 6e-3 for the head (nanochat's kind of split); rotary positions,
    RMSNorm, ReLU^2, QK-norm, an untied head and zero-initialised output projections (modded-nanogpt, nanochat);
    4 layers of 128 in heads of 64 and 2,048 tokens a step, which beat 4 x 192 and 4,096 at equal time here.
    Muon and logit soft-capping are left off: at equal steps they gave the same bits per byte here, and they cost
    1.12x and 1.14x the step's time (docs/training.md). With --time-limit the schedule follows the budget, so any
    budget ends annealed.
    """
    return TrainConfig(
        model=preset("gpt2-mini", vocab_size=4096, n_layer=4, n_head=2, n_embd=128, block_size=128, position="rotary",
                     norm="rms", activation="relu2", qk_norm=True, tie_embeddings=False, zero_init=True),
        optimizer=OptimizerConfig(lr=3e-3, embedding_lr=0.07, head_lr=6e-3, weight_decay=0.1, betas=(0.9, 0.95)),
        schedule=ScheduleConfig(kind="cosine", warmup_steps=30, min_lr_ratio=0.1),
        batch_tokens=2048,
        micro_batch=16,
        seq_len=128,
        max_steps=1200,
        eval_every=200,
        eval_batches=20,
        checkpoint_every=500,
    )


def gpt2_124m_fineweb() -> TrainConfig:
    """GPT-2 (124M) on FineWeb-edu sample-10BT with the GPT-3 paper's small-model hyper-parameters.

    The micro-batch is auto: 64 sequences per rank where they fit (an 80 GB GPU), fewer on smaller GPUs.

    `torchrun --nproc_per_node=8 -m gptlab.cli.main train --preset gpt2-124m-fineweb --data DIR`
    """
    return TrainConfig(
        model=preset("gpt2"),
        optimizer=OptimizerConfig(lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, impl="fused"),
        schedule=ScheduleConfig(kind="cosine", warmup_steps=715, min_lr_ratio=0.1),
        batch_tokens=524_288,
        micro_batch=0,
        seq_len=1024,
        max_steps=19_073,
        precision="bf16",
        compile=True,
        eval_every=250,
        eval_batches=20,
        sample_every=1000,
        checkpoint_every=2000,
        keep_last=3,
        log_every=1,
    )


@dataclass(frozen=True, kw_only=True)
class DepthRule:
    """What the depth dial derives from a model's size: its training tokens and its learning rate.

    By default Chinchilla's D = 20 N and AdamW's rates scaled by sqrt(the config's width / the new width). A scaling
    fit (`gptlab fit`, read by `gptlab train --from-fit FILE`) replaces them with its own laws, in its own count of N:
    tokens from the fitted N_opt(C) = k C^a inverted at N (C = (N/k)^(1/a), D = C / 6N), and lr = k N^g.
    """

    count: str = "total"  # the parameter count N the laws are stated in (gptlab.model.accounting.PARAM_CONVENTIONS)
    tokens_per_param: float = 20.0  # D / N when no law is given (Hoffmann et al., 2022)
    params_law: tuple[float, float] | None = None  # (k, a) of N_opt(C) = k C^a
    lr_law: tuple[float, float] | None = None  # (k, g) of lr = k N^g
    source: str = ""  # where the laws came from, for messages

    def __post_init__(self) -> None:
        count_params(preset("gpt2-tiny"), self.count)  # an unknown convention fails here, with the choices
        if self.tokens_per_param <= 0:
            raise GptlabError(f"tokens_per_param must be positive, got {self.tokens_per_param}")
        for name, law in (("params_law", self.params_law), ("lr_law", self.lr_law)):
            if law is not None and not (law[0] > 0 and math.isfinite(law[1])):
                raise GptlabError(f"{name} {law} of {self.source or 'the depth rule'} needs a positive coefficient and a finite exponent")
        if self.params_law is not None and self.params_law[1] <= 0:
            raise GptlabError(f"the N_opt(C) exponent of {self.source or 'the depth rule'} is {self.params_law[1]}: a law where "
                              "bigger budgets want smaller models cannot size a run; refit with more budgets")

    def tokens(self, params: float) -> float:
        """Training tokens for a model of `params` parameters (in this rule's count)."""
        if self.params_law is None:
            return self.tokens_per_param * params
        k, a = self.params_law
        try:
            return (params / k) ** (1 / a) / (6 * params)
        except OverflowError:
            raise GptlabError(f"the N_opt(C) = {k:.3g} C^{a:.3g} law of {self.source or 'the depth rule'} gives a model of "
                              f"{params:,.0f} params no finite budget; its exponent is too small to extrapolate that far "
                              "(refit with more budgets, or use a smaller --depth)") from None


def depth_model(model: ModelConfig, depth: int, head_dim: int = 64) -> ModelConfig:
    """nanochat's shape for a depth: n_layer = depth, n_embd = 64 x depth, heads of `head_dim` dimensions."""
    if depth < 1:
        raise GptlabError(f"--depth must be at least 1, got {depth}")
    return shaped_model(model, depth, 64 * depth, head_dim)


def shaped_model(model: ModelConfig, n_layer: int, n_embd: int, head_dim: int = 64) -> ModelConfig:
    """`model` with n_layer blocks of width n_embd in heads of head_dim (plain multi-head, the default MLP width)."""
    if n_layer < 1 or n_embd < 1 or head_dim < 1 or n_embd % head_dim:
        raise GptlabError(f"a model of {n_layer} layers of width {n_embd} in heads of {head_dim} dimensions is not possible: "
                          "layers and width must be positive, the width a multiple of the head size (--head-dim)")
    return replace(model, n_layer=n_layer, n_embd=n_embd, n_head=n_embd // head_dim, n_kv_head=None, mlp_hidden=None)


def scaled_optimizer(config: TrainConfig, model: ModelConfig, rule: DepthRule | None = None) -> OptimizerConfig:
    """AdamW's peak lrs (lr, embedding_lr, head_lr) for `model`: the rule's lr law, else the config's times
    sqrt(its width / the new width) (wider layers take smaller steps, as nanochat scales its AdamW rates).
    Muon's lr stays, its update being scale-free."""
    rule = rule or DepthRule()
    if rule.lr_law is not None:
        k, g = rule.lr_law
        scale = k * count_params(model, rule.count) ** g / config.optimizer.lr
    else:
        scale = math.sqrt(config.model.n_embd / model.n_embd)
    optimizer = config.optimizer
    return replace(optimizer, lr=optimizer.lr * scale, embedding_lr=optimizer.embedding_lr * scale, head_lr=optimizer.head_lr * scale)


def at_depth(config: TrainConfig, depth: int, rule: DepthRule | None = None) -> TrainConfig:
    """One dial, as nanochat's --depth: the model's size from its depth, and the rest of the run from the size.

    - shape: n_layer = depth, n_embd = 64 x depth (nanochat's aspect ratio), heads of 64 dimensions;
    - lrs: `scaled_optimizer` (sqrt width scaling, or a fitted lr law);
    - tokens: the rule's (Chinchilla's D = 20 N, or the compute-optimal D of a fitted N_opt(C));
    - batch: DeepSeek LLM's fit B = 0.292 C^0.3271 tokens (Bi et al., 2024) at the compute C = 6 N D of that
      run, rounded down to a power of two, at least one micro-batch; steps: the tokens over the batch.
    A time limit still ends the run early, annealed (the schedule follows the budget).
    """
    rule = rule or DepthRule()
    model = depth_model(config.model, depth)
    params = count_params(model, rule.count)
    tokens = rule.tokens(params)
    batch = 0.292 * (6 * params * tokens) ** 0.3271
    per_pass = config.micro_batch * config.seq_len
    batch_tokens = max(per_pass, 2 ** math.floor(math.log2(batch)) // per_pass * per_pass)
    return replace(config, model=model, optimizer=scaled_optimizer(config, model, rule), batch_tokens=batch_tokens,
                   max_steps=max(1, math.ceil(tokens / batch_tokens)))


PRESETS = {"shakespeare-cpu": shakespeare_cpu, "gpt2-124m-fineweb": gpt2_124m_fineweb}


def train_preset(name: str, **overrides) -> TrainConfig:
    if name not in PRESETS:
        raise GptlabError(f"unknown training preset {name!r}; presets: {', '.join(PRESETS)}")
    return replace(PRESETS[name](), **overrides)
