"""Before the training loop: every check that needs no compute, the run folder claimed, and what the loop touches built.

The Trainer (gptlab.train.trainer) mixes this in; it runs once, in this order:

    _check_before_compute   data, tokenizer, --init-from, vocabulary, batch arithmetic, warmup: refused before any compute
    _claim                  the output folder, new, resumed or extended (rank 0 decides, every rank learns where to resume)
    _build                  model (random or --init-from), optimizer, GradScaler, loaders, metrics sinks

The output folder belongs to one run (gptlab.runtime.rundir): the same
settings resume it, other settings are refused unless `force` starts over. Settings are compared as the
user asked for them, so a warmup gptlab shortened to fit a short run is never a change the user made.
`extend` takes a larger max_steps and trains the run on from its last checkpoint (a finished run too):
from there the learning rate follows the longer run's schedule, so a cosine that had decayed rises
to that schedule's value at the step (re-warming, as continued pretraining does).
The model is built plain, then wrapped (torch.compile, then data parallel as --parallel.* says) for the step only.

Subclasses (SFT, DPO, GRPO in gptlab.align) replace the checks, the model, the loader and the token bytes.
Not here: loading a checkpoint to resume from (gptlab.train.resume), choosing the micro-batch (gptlab.train.micro_batch).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import torch

from gptlab.data.loader import LoaderConfig, ShardLoader
from gptlab.data.match import check_tokenizer, data_tokenizer, find_model_tokenizer, load_matching_tokenizer
from gptlab.data.shards import read_manifest
from gptlab.eval.loss import load_token_bytes
from gptlab.load.checkpoints import find_checkpoint
from gptlab.model import GPT
from gptlab.model.hf import load_pretrained_directory, pretrained_path, read_pretrained_config
from gptlab.parallel.wrap import parallelize
from gptlab.runs.machine import MACHINE_FILE
from gptlab.runs.report import REPORT_FILE
from gptlab.runs.samples import SAMPLES_FILE
from gptlab.runtime import GptlabError, atomic_write_text
from gptlab.runtime.config import field_defaults
from gptlab.runtime.device import autocast, resolve_precision, seed_everything
from gptlab.runtime.rundir import claim_run_folder, read_marker
from gptlab.train.checkpoint import resume_point
from gptlab.train.config import TrainConfig
from gptlab.train.metrics import MetricsLog
from gptlab.train.optim import optimizer_recipe

# What a run may change and still be the same run: how it is watched and where it runs, not what it computes.
# micro_batch too: auto picks it per machine, and a run resumes at its checkpoint's (gptlab.train.micro_batch).
# activation_checkpointing too: it recomputes the same numbers; parallel too: sharded optimizer states are saved
# whole, in the unsharded optimizer's format.
FREE_FIELDS = ("out", "log_every", "time_limit", "tensorboard", "wandb", "trackio", "sample_every", "sample_tokens", "device",
               "compile", "eval_every", "eval_batches", "hellaswag_every", "hellaswag_path", "hellaswag_limit",
               "checkpoint_every", "keep_last", "mfu_peak", "micro_batch", "activation_checkpointing", "parallel")
RUN_FILES = ("checkpoints", "metrics.jsonl", "loss.png", "train_config.json", "tensorboard", "wandb",
             MACHINE_FILE, SAMPLES_FILE, REPORT_FILE)


class PrepareMixin:
    """The Trainer's set-up (module docstring); it uses the Trainer's config, runtime, print and command."""

    def _check_before_compute(self, config: TrainConfig) -> TrainConfig:
        """Every mistake we can see before spending compute: data, tokenizer, vocabulary, batch arithmetic."""
        if not config.data:
            raise GptlabError("no training data: pass --data DIR (made by `gptlab data prepare`)")
        self.manifest = read_manifest(config.data)
        if "train" not in self.manifest["splits"]:
            raise GptlabError(f"{config.data} has no train split")
        self.fingerprint = self.manifest["tokenizer"]["fingerprint"]
        self.has_val = "val" in self.manifest["splits"]
        # the tokenizer saved with the data is the default: checkpoints then carry it, and samples can be read
        self.tokenizer = load_matching_tokenizer(config.data, config.tokenizer) if config.tokenizer else data_tokenizer(config.data)
        if config.init_from:
            self._check_init(config)
        vocab = self.manifest["tokenizer"]["vocab_size"]
        if vocab > config.model.vocab_size:
            raise GptlabError(
                f"the data's tokenizer has {vocab:,} ids but the model's vocabulary has {config.model.vocab_size:,}: "
                f"set --model.vocab-size {vocab}"
            )
        if vocab < config.model.vocab_size:
            self.print(f"note: the model has {config.model.vocab_size:,} ids, the data's tokenizer {vocab:,}; "
                       "the extra rows are never trained, and sampling draws only the tokenizer's ids")
        self.precision = resolve_precision(config.precision, self.runtime.device)
        if config.compile and self.runtime.device.type == "cpu" and not cpu_compiler():
            raise GptlabError("--compile true on a CPU needs a C++ compiler for torch's inductor (g++ or clang++ on PATH, "
                              "or $CXX); install one (Debian: apt-get install g++) or pass --compile false")
        config = self._fit_micro_batch(config)
        self.accum = config.accumulation_steps(self.runtime.world_size)
        return self._shorten_warmup(config)

    def _check_init(self, config: TrainConfig) -> None:
        """--init-from: its architecture is the config's, and its tokenizer (when it has one) the data's."""
        self.init_path = find_checkpoint(config.init_from) or pretrained_path(config.init_from)
        init = read_pretrained_config(self.init_path)
        ours = dataclasses.replace(config.model, dropout=init.dropout)
        if ours != init:
            changed = [f"{f.name} {getattr(init, f.name)} != {getattr(ours, f.name)}" for f in dataclasses.fields(init)
                       if getattr(init, f.name) != getattr(ours, f.name)]
            raise GptlabError(f"--init-from {config.init_from} is a model with other settings than the config's model "
                              f"({', '.join(changed)}); leave out the --model options (only --model.dropout may differ)")
        tokenizer = find_model_tokenizer(self.init_path)
        if tokenizer is not None:
            check_tokenizer(config.data, tokenizer, f"the tokenizer of --init-from {config.init_from}")
            self.tokenizer = self.tokenizer or tokenizer  # checkpoints carry it, samples use it

    def _shorten_warmup(self, config: TrainConfig) -> TrainConfig:
        warmup = config.schedule.warmup_steps
        if warmup < config.max_steps:
            return config
        shorter = max(1, config.max_steps // 10)
        self.print(f"note: a warmup of {warmup} steps is not shorter than the run ({config.max_steps} steps); "
                   f"shortened to {shorter}, a tenth of the run")
        return dataclasses.replace(config, schedule=dataclasses.replace(config.schedule, warmup_steps=shorter))

    def _claim(self) -> Path:
        """Rank 0 names the folder (a new one when --out is empty) and claims it; every rank learns where to resume."""
        config = self.config
        resume_from = None
        if self.runtime.is_main:
            out = Path(config.out) if config.out else new_run_folder()
            if not config.out:
                self.print(f"no --out given: training into {out} (pass --out {out} to resume this run)")
            if self.extend:
                self._check_extension(out)
            folder = claim_run_folder(out, command=self.command, config=dataclasses.asdict(dataclasses.replace(config, out=str(out))),
                                      ours=self.run_files, free=FREE_FIELDS + (("max_steps",) if self.extend else ()),
                                      force=self.force, fresh=not self.resume,
                                      legacy=lambda path: (path / "train_config.json").is_file(),
                                      defaults=field_defaults(type(config)),
                                      asked=dataclasses.asdict(dataclasses.replace(self.asked, out=str(out))),
                                      hints={"max_steps": "pass --extend to train it on to the new --max-steps"})
            self.folder = folder
            resume_from = resume_point(out, self.print) if folder.status == "resume" else None
            atomic_write_text(out / "train_config.json", json.dumps(dataclasses.asdict(dataclasses.replace(config, out=str(out))), indent=1) + "\n")
            shared = [str(out), str(resume_from) if resume_from else None]
        else:
            shared = [None, None]
        if self.runtime.distributed:
            torch.distributed.broadcast_object_list(shared, src=0)
        self.config = dataclasses.replace(config, out=shared[0])
        return Path(shared[1]) if shared[1] else None

    def _check_extension(self, out: Path) -> None:
        """--extend continues a run that is there, for at least the steps it had: the steps trained stay as they are."""
        if self.force or not self.resume:
            raise GptlabError("--extend continues the run in --out; it cannot be combined with --force or --no-resume")
        record = read_marker(out) if out.is_dir() else None
        if record is None or record.get("command") != self.command:
            raise GptlabError(f"--extend continues a `gptlab {self.command}` run, but {out} holds none; leave out --extend to start one")
        before = record.get("config", {}).get("max_steps")
        if isinstance(before, int) and self.config.max_steps < before:
            raise GptlabError(f"--extend lengthens a run: --max-steps {self.config.max_steps} is fewer than the run's {before} steps; "
                              "pass a larger --max-steps")

    def _loader(self, split: str) -> ShardLoader:
        config = self.config
        return ShardLoader(
            config.data,
            split,
            config=LoaderConfig(batch_size=config.micro_batch, seq_len=config.seq_len, mode=config.loader_mode, seed=config.seed),
            rank=self.runtime.rank,
            world_size=self.runtime.world_size,
            device=self.runtime.device,
            fingerprint=self.fingerprint,
        )

    def _build(self) -> None:
        """Model (random or --init-from weights), optimizer, scaler, loaders, metrics: everything the loop touches."""
        config, device = self.config, self.runtime.device
        seed_everything(config.seed)
        self.model = self._make_model().set_activation_checkpointing(config.activation_checkpointing)
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.precision == "fp16")
        self.train_loader = self._loader("train")
        self.val_loader = self._loader("val") if self.has_val else None
        self.token_bytes = self._token_bytes() if self.val_loader is not None else None
        self.wrapped, self.optimizer = self._wrap(self.model)
        self.cast = autocast(device, self.precision)
        self.metrics = MetricsLog(config.out, self.runtime.is_main, config.tensorboard, config.wandb, dataclasses.asdict(config),
                                  trackio_project=config.trackio)

    def _make_model(self) -> GPT:
        """The model to train: random, or the --init-from weights."""
        model = GPT(self.config.model).to(self.runtime.device)
        if self.config.init_from:
            model.load_state_dict(load_pretrained_directory(self.init_path, device=self.runtime.device).state_dict())
        return model

    def _token_bytes(self) -> torch.Tensor | None:
        """Bytes per token id, for val bits per byte."""
        return load_token_bytes(self.config.data, self.runtime.device)

    def _task_every(self) -> int:
        """Steps between the task_fn's evaluations (0: never)."""
        return self.config.hellaswag_every

    def _wrap(self, model: GPT) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """compile, then data parallel as --parallel.* says (gptlab.parallel), and the optimizer (sharded or not):
        the wrapped module is used for the training step only."""
        config, runtime = self.config, self.runtime
        wrapped: torch.nn.Module = model
        if runtime.distributed:
            if config.parallel.fsdp and not self.fsdp_ok:
                raise GptlabError(f"gptlab {self.command} does not support --parallel.fsdp; use --parallel.shard-optimizer zero1 "
                                  "to shard the optimizer state")
        if config.compile:
            wrapped = torch.compile(model)
        device_ids = [runtime.local_rank] if runtime.device.type == "cuda" else None
        return parallelize(wrapped, lambda: optimizer_recipe(model, config.optimizer, runtime.device.type), config.parallel,
                           distributed=runtime.distributed, device_ids=device_ids, blocks=model.transformer["h"],
                           precision=self.precision)


def cpu_compiler() -> str | None:
    """The C++ compiler torch.compile's CPU code would be built with: $CXX, else c++, g++ or clang++ on PATH."""
    import os
    import shutil

    names = [os.environ["CXX"]] if os.environ.get("CXX") else ["c++", "g++", "clang++"]
    return next((found for name in names if (found := shutil.which(name))), None)


def new_run_folder(root: str = "runs", suffixes: tuple[str, ...] = ("",)) -> Path:
    """runs/train-20261123-201500 (with -2, -3, ... if that exists): a training run's own folder. With `suffixes`
    (-seed1337, ...): a name none of whose suffixed folders exists, for runs that share it."""
    base = Path(root) / time.strftime("train-%Y%m%d-%H%M%S")
    path, n = base, 1
    while any(path.with_name(path.name + suffix).exists() for suffix in suffixes):
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path
