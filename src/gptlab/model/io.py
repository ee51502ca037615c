"""Model files: `DIR/config.json` (the ModelConfig fields) + `DIR/model.safetensors` (the weights).

Tied weights are stored once (lm_head.weight is wte's). Loading builds the model
from the config, then loads the weights strictly: a mismatch names the missing
and unexpected keys and any shape that differs. Files are written atomically.

Not here: optimizer and trainer state (gptlab.train), Hugging Face formats (gptlab.model.hf).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch

from gptlab.model.config import ModelConfig
from gptlab.model.gpt import GPT
from gptlab.runtime import GptlabError, atomic_path, atomic_write_text

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT_VERSION = 1


def config_from_dict(data: dict) -> ModelConfig:
    known = {field.name for field in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(data) - known - {"format_version"})
    if unknown:
        raise GptlabError(f"unknown model config fields: {', '.join(unknown)}")
    return ModelConfig(**{key: value for key, value in data.items() if key in known})


def state_dict_to_save(model: GPT) -> dict[str, torch.Tensor]:
    state = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    if model.config.tie_embeddings:
        state.pop("lm_head.weight", None)
    return state


def save_model(model: GPT, directory: str | os.PathLike) -> Path:
    """Write config.json and model.safetensors into `directory` (created if needed)."""
    directory = Path(directory)
    config = {"format_version": FORMAT_VERSION, **dataclasses.asdict(model.config)}
    save_safetensors(state_dict_to_save(model), directory / WEIGHTS_NAME, {"gptlab_format_version": str(FORMAT_VERSION)})
    atomic_write_text(directory / CONFIG_NAME, json.dumps(config, indent=1) + "\n")
    return directory


def save_safetensors(state: dict[str, torch.Tensor], path: str | os.PathLike, metadata: dict[str, str] | None = None) -> Path:
    """The one safetensors writer: a temporary name beside `path`, fsync, rename (gptlab.runtime.atomic_path)."""
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file(state, tmp, metadata={"format": "pt", **(metadata or {})})
    return Path(path)


def load_state(model: GPT, state: dict[str, torch.Tensor], source: str) -> GPT:
    """Load weights strictly, with one clear error that lists every mismatch."""
    expected = model.state_dict()
    if model.config.tie_embeddings:
        state = {**state, "lm_head.weight": state.get("lm_head.weight", state.get("transformer.wte.weight"))}
        state = {key: value for key, value in state.items() if value is not None}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = [f"{key} {tuple(state[key].shape)} != {tuple(expected[key].shape)}" for key in sorted(set(state) & set(expected)) if state[key].shape != expected[key].shape]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing keys: {', '.join(missing)}")
        if unexpected:
            parts.append(f"unexpected keys: {', '.join(unexpected)}")
        if shapes:
            parts.append(f"shape mismatches: {'; '.join(shapes)}")
        raise GptlabError(f"{source} does not match the model config: " + "; ".join(parts))
    model.load_state_dict(state, strict=True)
    return model


def load_model(directory: str | os.PathLike, *, device: str | torch.device = "cpu") -> GPT:
    """The model saved by `save_model` (a training checkpoint directory works too)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(directory)
    config_path, weights_path = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    if not config_path.is_file() or not weights_path.is_file():
        raise GptlabError(f"no model at {directory} (expected {CONFIG_NAME} and {WEIGHTS_NAME})")
    try:
        data = json.loads(config_path.read_text())
    except json.JSONDecodeError as error:
        raise GptlabError(f"{config_path} is not valid JSON: {error}") from None
    if data.get("format_version", FORMAT_VERSION) != FORMAT_VERSION:
        raise GptlabError(f"{config_path} is model format {data.get('format_version')}; this gptlab reads {FORMAT_VERSION}")
    model = GPT(config_from_dict(data))
    try:
        state = load_file(weights_path, device=str(device))
    except (SafetensorError, OSError) as error:
        raise GptlabError(f"{weights_path} is damaged or not safetensors: {error}") from None
    return load_state(model.to(device), state, str(weights_path))
