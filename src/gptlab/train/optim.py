"""The optimizer a run builds: its config, the parameter groups GPT training uses, and the recipe that makes it.

`impl` picks AdamW's implementation: the readable reference (gptlab.train.adamw, `impl="gptlab"`)
or torch's; training runs torch's fused AdamW kernel by default (`impl="auto"`, on CPU and CUDA),
which a test proves equal to the reference within float rounding: one kernel over every
tensor, 6x faster than a Python loop for a 30M-parameter model on 2 CPU cores
(bench/train_throughput.py).

Weight decay applies to matrices (dim >= 2): linear weights and, unless
`decay_embeddings` is off, the embeddings; never to biases or norm weights.
`kind="muon"` trains the blocks' matrices with Muon instead (gptlab.train.muon).
The recipe (class, groups, options) lets gptlab.parallel build the optimizer whole or sharded.
Not here: the update rules (gptlab.train.adamw, gptlab.train.muon), the learning-rate schedule (gptlab.train.schedule).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from gptlab.parallel.wrap import OptimizerRecipe
from gptlab.runtime import GptlabError
from gptlab.train.adamw import AdamW
from gptlab.train.muon import MuonAdamW

FUSED_DEVICES = ("cpu", "cuda")  # where torch.optim.AdamW(fused=True) has a kernel
IMPLEMENTATIONS = ("auto", "gptlab", "torch", "fused", "foreach")


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    lr: float = 6e-4  # the peak; the schedule scales it
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW's moment decays (beta1, beta2)
    eps: float = 1e-8  # added to the denominator
    weight_decay: float = 0.1  # decoupled decay of the matrices
    decay_embeddings: bool = True  # decay the embedding tables too
    impl: str = "auto"  # auto (fused where torch has it: CPU, CUDA; else foreach) | gptlab (the readable reference) | torch | fused | foreach
    kind: str = "adamw"  # adamw | muon (Muon for the blocks' matrices, AdamW for the rest: gptlab.train.muon)
    muon_lr: float = 0.02  # muon: the peak learning rate of the hidden matrices (the schedule scales it alike)
    muon_momentum: float = 0.95  # muon: the momentum of its (Nesterov) buffer
    muon_precision: str = "auto"  # muon: Newton-Schulz in bf16 (as torch.optim.Muon) | fp32 | auto (bf16 on CUDA, fp32 on CPU: 4x faster here)
    embedding_lr: float = 0.0  # peak lr of the embedding tables (0: lr); nanochat and modded-nanogpt give them far more
    head_lr: float = 0.0  # peak lr of an untied output head (0: lr)

    def __post_init__(self) -> None:
        if self.impl not in IMPLEMENTATIONS:
            raise GptlabError(f"unknown optimizer impl {self.impl!r}; use one of {', '.join(IMPLEMENTATIONS)}")
        if self.kind not in ("adamw", "muon"):
            raise GptlabError(f"unknown optimizer kind {self.kind!r}; use adamw or muon")
        if self.muon_precision not in ("auto", "bf16", "fp32"):
            raise GptlabError(f"muon_precision must be auto, bf16 or fp32, got {self.muon_precision!r}")
        if self.kind == "muon" and (self.impl not in ("auto", "gptlab") or self.muon_lr <= 0 or not 0 <= self.muon_momentum < 1):
            raise GptlabError(f"muon needs impl auto or gptlab, muon_lr above 0 and muon_momentum in [0, 1); got {self.impl}, "
                              f"{self.muon_lr}, {self.muon_momentum}")
        if self.embedding_lr < 0 or self.head_lr < 0:
            raise GptlabError(f"embedding_lr and head_lr must be 0 (same as lr) or above, got {self.embedding_lr}, {self.head_lr}")
        if self.lr < 0 or self.eps < 0 or self.weight_decay < 0 or not all(0 <= beta < 1 for beta in self.betas) or len(self.betas) != 2:
            raise GptlabError(f"bad optimizer settings: lr={self.lr} betas={self.betas} eps={self.eps} weight_decay={self.weight_decay}")


def parameter_groups(model: nn.Module, weight_decay: float, decay_embeddings: bool = True) -> list[dict]:
    """Two groups: matrices that decay, and the rest (biases, norm weights) that do not."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay, seen = [], [], set()
    for parameter in model.parameters():
        if not parameter.requires_grad or id(parameter) in seen:
            continue
        seen.add(id(parameter))
        is_matrix = parameter.dim() >= 2 and (decay_embeddings or id(parameter) not in embeddings)
        (decay if is_matrix else no_decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def muon_groups(model: nn.Module, config: OptimizerConfig) -> list[dict]:
    """The blocks' matrices for Muon (their lr muon_lr, as a ratio to the schedule's peak), the rest as for AdamW."""
    hidden = [p for p in model.transformer["h"].parameters() if p.requires_grad and p.dim() == 2]
    chosen = {id(p) for p in hidden}
    rest = parameter_groups(model, config.weight_decay, config.decay_embeddings)
    for group in rest:
        group["params"] = [p for p in group["params"] if id(p) not in chosen]
    ratio = config.muon_lr / config.lr if config.lr else 0.0
    return [{"params": hidden, "muon": True, "lr_ratio": ratio, "weight_decay": config.weight_decay}, *rest]


def own_lr_groups(model: nn.Module, groups: list[dict], config: OptimizerConfig) -> list[dict]:
    """Move the embedding tables and the output head into groups of their own when they have an lr of their own.

    Each keeps its weight decay; its `lr_ratio` (lr over the peak) rides the schedule like every group's.
    """
    embeddings = [m.weight for m in model.modules() if isinstance(m, nn.Embedding)]
    head = getattr(model, "lm_head", None)
    heads = [head.weight] if head is not None and all(head.weight is not e for e in embeddings) else []
    for own_lr, params in ((config.embedding_lr, embeddings), (config.head_lr, heads)):
        chosen = {id(p) for p in params}
        if not own_lr or not chosen or not config.lr:
            continue
        for group in list(groups):
            mine = [p for p in group["params"] if id(p) in chosen]
            if mine:
                group["params"] = [p for p in group["params"] if id(p) not in chosen]
                groups.append({**group, "params": mine, "lr_ratio": own_lr / config.lr})
    return [group for group in groups if group["params"]]


def optimizer_recipe(model: nn.Module, config: OptimizerConfig, device_type: str = "cpu") -> OptimizerRecipe:
    """The optimizer's class, parameter groups and options, to build whole or sharded (gptlab.parallel.wrap)."""
    if config.kind == "muon":
        bf16 = config.muon_precision == "bf16" or (config.muon_precision == "auto" and device_type == "cuda")
        dtype = torch.bfloat16 if bf16 else torch.float32
        return OptimizerRecipe(MuonAdamW, own_lr_groups(model, muon_groups(model, config), config),
                               {"momentum": config.muon_momentum, "betas": config.betas, "eps": config.eps, "ns_dtype": dtype})
    groups = own_lr_groups(model, parameter_groups(model, config.weight_decay, config.decay_embeddings), config)
    if config.impl == "gptlab":
        return OptimizerRecipe(AdamW, groups, {"lr": config.lr, "betas": config.betas, "eps": config.eps})
    fusable = device_type in FUSED_DEVICES
    if config.impl == "fused" and not fusable:
        raise GptlabError(f"optimizer impl 'fused' needs one of {', '.join(FUSED_DEVICES)}; use auto, gptlab or foreach on {device_type}")
    impl = ("fused" if fusable else "foreach") if config.impl == "auto" else config.impl
    extra = {"fused": True} if impl == "fused" else {"foreach": True} if impl == "foreach" else {}
    return OptimizerRecipe(torch.optim.AdamW, groups, {"lr": config.lr, "betas": config.betas, "eps": config.eps, **extra})


def build_optimizer(model: nn.Module, config: OptimizerConfig, device_type: str = "cpu") -> torch.optim.Optimizer:
    optimizer_class, groups, options = optimizer_recipe(model, config, device_type)
    return optimizer_class(groups, **options)
