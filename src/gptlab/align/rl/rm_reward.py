"""A trained reward model read back and used: the folder format, scoring replies, and the `rm:DIR` reward.

    scorer = load_reward_model("runs/rm")                         the export in a finished run, or any checkpoint
    scorer.score(["2+3?", "2+3?"], ["5", "6"])                    -> [1.7, -1.2]   (normalised: see below)
    Rewards.from_spec("verifier,rm:runs/rm*0.5", task=task)       the same scores as a GRPO/PPO reward term

The reward of a reply is the scalar head's value at the last token of the ChatFormat rendering of the prompt's
messages + the assistant reply + its <|end|> (a prompt given as text is one user message). A rendering longer than
the model's context keeps its last block_size tokens, so the reply's end is always read.

The folder `gptlab rm` writes (DIR, also a finished run's folder itself):

    DIR/config.json, DIR/model.safetensors     the trunk: a normal gptlab model folder (its lm_head kept, unused)
    DIR/score_head.safetensors                 {"weight": (1, n_embd), "bias": (1,)}
    DIR/tokenizer/                             the chat tokenizer the model was trained with
    DIR/reward_model.json                      {"format": "gptlab-reward-model", "version": 1, "read_at": "last",
                                                "normalise": {"mean": m, "std": s}, "trained_on": ..., "heldout_accuracy": ...}
                                               written last: a folder without it is not (yet) a reward model

Scores are reported as (r - m) / s, with m and s the mean and spread of the trained model's rewards on its train
replies, so a score near 0 is an ordinary reply and the units are comparable between reward models. A run's
checkpoint (RUN/checkpoints/step_N: the ScalarModel's weights, trunk.* and head.*, and the run's config) scores too,
with m = 0, s = 1: it was saved before the normalisation was measured.

Not here: training (gptlab.align.rl.rm), the ScalarModel itself (gptlab.align.rl.scalar).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from gptlab.align.rl.scalar import ScalarModel, last_scores
from gptlab.chat import ChatFormat
from gptlab.data.match import find_model_tokenizer
from gptlab.load.checkpoints import find_checkpoint
from gptlab.model import GPT
from gptlab.model.hf import load_pretrained_directory
from gptlab.model.io import config_from_dict, save_model, save_safetensors
from gptlab.runtime import GptlabError, atomic_write_text
from gptlab.train.checkpoint import STATE_NAME, WEIGHTS_NAME, load_checkpoint, read_checkpoint_state

FORMAT = "gptlab-reward-model"
VERSION = 1
META_FILE = "reward_model.json"
HEAD_FILE = "score_head.safetensors"
FOLDER_FILES = ("config.json", "model.safetensors", HEAD_FILE, "tokenizer", META_FILE)  # what write_reward_model makes
BATCH_ROWS = 16  # replies scored per forward


def as_messages(prompt: str | list[dict]) -> list[dict]:
    """A prompt as chat messages: text is one user turn; messages are copied with only their role and content."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt:
        raise GptlabError(f"a prompt is text or a non-empty list of messages, got {prompt!r:.80}")
    return [{"role": message["role"], "content": message["content"]} for message in prompt]


def render_reply(chat: ChatFormat, prompt: str | list[dict], reply: str) -> list[int]:
    """The ids the reward is read from: the prompt's messages, the assistant reply and its <|end|>. An empty reply (a
    policy may stop at once) is the assistant's opening and <|end|>: scored, not refused as an empty message."""
    return chat.prompt(as_messages(prompt)) + chat.tokenizer.encode_ordinary(reply) + [chat.end]


def reward_rows(sequences: Sequence[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (N, T) int64 right-padded with `pad` to the longest sequence, and lengths (N,): the reward is read at
    lengths - 1. Causal attention keeps the padding after a row's end from changing its scores."""
    lengths = [len(ids) for ids in sequences]
    x = np.full((len(sequences), max(lengths)), pad, dtype=np.int64)
    for row, ids in enumerate(sequences):
        x[row, : len(ids)] = ids
    return torch.from_numpy(x), torch.tensor(lengths, dtype=torch.int64)


@torch.no_grad()
def score_sequences(model: ScalarModel, sequences: Sequence[list[int]], pad: int, *, device, batch_rows: int = BATCH_ROWS,
                    cast=None) -> torch.Tensor:
    """(N,) float32 raw rewards of token sequences (each at most the model's context), in batches, in eval mode."""
    was_training = model.training
    model.eval()
    scores = []
    for start in range(0, len(sequences), batch_rows):
        x, lengths = reward_rows(sequences[start : start + batch_rows], pad)
        if cast is None:
            values = model(x.to(device))
        else:
            with cast:
                values = model(x.to(device))
        scores.append(last_scores(values, lengths).float().cpu())
    model.train(was_training)
    return torch.cat(scores) if scores else torch.zeros(0)


class RewardScorer:
    """A reward model ready to score: its ScalarModel (eval mode), chat format and normalisation."""

    def __init__(self, model: ScalarModel, chat: ChatFormat, *, mean: float = 0.0, std: float = 1.0,
                 folder: Path | None = None, device: str | torch.device = "cpu") -> None:
        self.model, self.chat, self.mean, self.std = model.eval(), chat, mean, std
        self.folder, self.device = folder, torch.device(device)

    def score(self, prompts: Sequence[str | list[dict]], replies: Sequence[str], *, normalised: bool = True) -> list[float]:
        """One reward per (prompt, reply): (r - mean) / std, or the head's raw r with normalised=False."""
        if len(prompts) != len(replies):
            raise GptlabError(f"{len(prompts)} prompts for {len(replies)} replies; give one prompt per reply")
        context = self.model.config.block_size
        sequences = [render_reply(self.chat, prompt, reply)[-context:] for prompt, reply in zip(prompts, replies)]
        raw = score_sequences(self.model, sequences, self.chat.bos, device=self.device).tolist()
        return [(r - self.mean) / self.std for r in raw] if normalised else raw


def score_pairs(scorer: RewardScorer, spec: str, *, on_error: str = "skip") -> dict[str, float]:
    """How the reward model ranks the pairs a spec names (all of them: as `gptlab dpo --data` reads, none held out):
    pairs, accuracy (the share whose chosen reply scores higher) with its 95% Wilson interval, and the mean margin."""
    from gptlab.align.preference.pairs import load_pairs
    from gptlab.chat.data import MixtureConfig
    from gptlab.eval.stats import wilson_interval

    pairs = load_pairs(MixtureConfig.from_spec(spec, val_fraction=0.0, on_error=on_error))["train"].pairs
    prompts = [pair.prompt for pair in pairs]
    chosen = torch.tensor(scorer.score(prompts, [pair.chosen for pair in pairs]))
    rejected = torch.tensor(scorer.score(prompts, [pair.rejected for pair in pairs]))
    correct = int((chosen > rejected).sum())
    low, high = wilson_interval(correct, len(pairs))
    return {"pairs": len(pairs), "accuracy": correct / len(pairs), "accuracy_low": low, "accuracy_high": high,
            "margin": (chosen - rejected).mean().item()}


# ---------------------------------------------------------------- the folder


def write_reward_model(folder: str | Path, model: ScalarModel, tokenizer, *, mean: float, std: float,
                       trained_on: str, heldout_accuracy: float | None) -> Path:
    """Write the folder format of the module docstring into `folder` (each file atomically, reward_model.json last)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_model(model.trunk, folder)
    head = {"weight": model.head.weight.detach().float().cpu().contiguous(), "bias": model.head.bias.detach().float().cpu()}
    save_safetensors(head, folder / HEAD_FILE)
    tokenizer.save(folder / "tokenizer")
    meta = {"format": FORMAT, "version": VERSION, "read_at": "last", "normalise": {"mean": mean, "std": std},
            "trained_on": trained_on, "heldout_accuracy": heldout_accuracy}
    atomic_write_text(folder / META_FILE, json.dumps(meta, indent=1) + "\n")
    return folder


def load_reward_model(path: str | Path, device: str | torch.device = "cpu") -> RewardScorer:
    """The reward model at `path`: a folder written by `gptlab rm` (a finished run's folder is one), a run folder
    without it (its newest checkpoint), or one checkpoint. Anything else is one GptlabError saying what it is."""
    folder = Path(path).expanduser()
    if not folder.exists():
        raise GptlabError(f"no reward model at {path}: no such folder (pass the --out folder of gptlab rm)")
    if (folder / META_FILE).is_file():
        return _load_folder(folder, device)
    checkpoint = find_checkpoint(folder) or folder
    if (checkpoint / STATE_NAME).is_file() and not (checkpoint / "config.json").is_file():
        return _load_checkpoint(checkpoint, device)
    raise GptlabError(f"{path} is not a reward model (no {META_FILE}, no checkpoint of gptlab rm): train one with "
                      f"gptlab rm --init MODEL --data PAIRS --out DIR, and pass DIR")


def _chat(folder: Path, path: Path) -> ChatFormat:
    tokenizer = find_model_tokenizer(folder)
    if tokenizer is None:
        raise GptlabError(f"reward model {path} has no tokenizer/ folder; it was not written whole by gptlab rm")
    return ChatFormat(tokenizer)


def _load_folder(folder: Path, device) -> RewardScorer:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        meta = json.loads((folder / META_FILE).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise GptlabError(f"{folder / META_FILE} is not readable JSON: {error}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise GptlabError(f"{folder / META_FILE} is not a {FORMAT} version {VERSION} file; this gptlab reads that version")
    normalise = meta.get("normalise") or {}
    mean, std = float(normalise.get("mean", 0.0)), float(normalise.get("std", 1.0))
    if not (math.isfinite(mean) and math.isfinite(std) and std > 0):
        raise GptlabError(f"{folder / META_FILE}: normalise mean {mean} and std {std} must be finite, std above 0")
    model = ScalarModel(load_pretrained_directory(folder, device=device)).to(device)
    try:
        head = load_file(folder / HEAD_FILE, device=str(device))
        model.head.load_state_dict(head, strict=True)
    except (SafetensorError, OSError, RuntimeError) as error:
        raise GptlabError(f"{folder / HEAD_FILE} is missing or not a score head: {str(error).splitlines()[0]}") from None
    return RewardScorer(model, _chat(folder, folder), mean=mean, std=std, folder=folder, device=device)


def _load_checkpoint(checkpoint: Path, device) -> RewardScorer:
    """A gptlab rm checkpoint: the ScalarModel's own weights (trunk.*, head.*), the model config in its trainer state."""
    from safetensors import safe_open

    state = read_checkpoint_state(checkpoint)
    with safe_open(checkpoint / WEIGHTS_NAME, framework="pt") as handle:
        is_scalar = "head.weight" in handle.keys()
    model_config = state.get("config", {}).get("model")
    if not is_scalar or not isinstance(model_config, dict):
        raise GptlabError(f"{checkpoint} is not a checkpoint of gptlab rm (no score head); pass a reward model's folder")
    model = ScalarModel(GPT(config_from_dict(model_config))).to(device)
    load_checkpoint(checkpoint, model, device=device, restore_rng=False)
    return RewardScorer(model, _chat(checkpoint, checkpoint), folder=checkpoint, device=device)


# ---------------------------------------------------------------- as a reward


def reward_model_reward(path: str, device: str | torch.device | None = None):
    """The RewardFn of the spec term `rm:DIR`: loads the reward model once (here, so a wrong DIR fails before any
    training), then scores each batch. Device: this process's CUDA device when there is one, else the CPU."""
    from gptlab.align.rl.rewards import completion_text

    if device is None:
        device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    scorer = load_reward_model(path, device)

    def reward_model(prompts: list, completions: list, **columns) -> list[float]:
        return scorer.score(prompts, [completion_text(completion) for completion in completions])

    reward_model.scorer = scorer  # for callers that want the raw scores or the model
    return reward_model
