"""`gptlab train`: a preset, then dotted overrides (--model.n_layer 6 --optimizer.lr 1e-3 --data DIR).

Under torchrun every rank runs this same command:
    torchrun --nproc_per_node=8 -m gptlab.cli.main train --preset gpt2-124m-fineweb --data data/edu10B
"""

from __future__ import annotations

import argparse


def register(stages) -> None:
    parser = stages.add_parser(
        "train",
        help="train a GPT on prepared shards (resumes from OUT/checkpoints)",
        description="Options: --preset NAME, then any TrainConfig field as a dotted override, e.g. --data DIR "
        "--out DIR --max_steps 2000 --model.n_layer 6 --optimizer.lr 1e-3 --precision bf16 --compile true.",
    )
    parser.add_argument("--preset", default="shakespeare-cpu", help="shakespeare-cpu (default) or gpt2-124m-fineweb")
    parser.add_argument("--no-resume", action="store_true", help="start from scratch even if OUT has checkpoints")
    parser.set_defaults(handler=run, accepts_overrides=True)


def run(args: argparse.Namespace) -> int:
    from gptlab.pipeline import hellaswag_fn, text_sampler
    from gptlab.runtime.config import apply_overrides
    from gptlab.runtime.device import init_runtime, shutdown_runtime
    from gptlab.train import Trainer, train_preset

    config = apply_overrides(train_preset(args.preset), args.overrides)
    runtime = init_runtime(config.device)
    try:
        trainer = Trainer(
            config, runtime=runtime, sample_fn=text_sampler(config.tokenizer, config.sample_tokens),
            task_fn=hellaswag_fn(config), resume=not args.no_resume,
        )
        result = trainer.fit()
        if runtime.is_main:
            print(f"{result.status} after {result.steps} steps in {result.seconds:.0f} s; checkpoint {result.checkpoint}")
    finally:
        shutdown_runtime(runtime)
    return 0 if result.status != "interrupted" else 130
