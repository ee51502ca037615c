"""Training: AdamW, schedules, the Trainer (single process or DDP), checkpoints, metrics, presets.

Uses the model, the data loader and the evaluation; nothing imports it but the CLI and the pipeline.
"""

from gptlab.train.config import PRESETS, TrainConfig, train_preset
from gptlab.train.trainer import Trainer, TrainResult

__all__ = ["PRESETS", "TrainConfig", "TrainResult", "Trainer", "train_preset"]
