"""DPO's start measured before training: preference accuracy on the train pairs against a hand computation, and
the note when the start already separates them (it still trains: DPO can widen the margins)."""

import json

import pytest

from gptlab.align.preference.dpo import DPOTrainer, run_dpo
from gptlab.model.io import load_model

from .test_dpo import dpo_config, reply_logprob

WORDS = ["apple", "river", "stone", "cloud", "tiger", "maple", "ocean", "piano", "lemon", "candle", "forest", "silver",
         "garden", "rocket", "winter", "castle", "pepper", "meadow", "harbor", "violet", "copper", "island", "thunder", "marble"]
RAMBLE = "and then the long reply went on and on about nothing at all, and on"


def write_pairs(path, short_chosen: bool):
    """Pairs of a one-word reply and a long ramble: a random model finds the short one far likelier."""
    rows = [{"prompt": f"Say {word}.", "chosen": word if short_chosen else RAMBLE, "rejected": RAMBLE if short_chosen else word}
            for word in WORDS]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def hand_accuracy(model, trainer) -> float:
    """The share of train pairs whose chosen reply has the higher summed log-probability, one sequence at a time."""
    pairs = trainer.splits["train"].pairs
    preferred = sum(reply_logprob(model, trainer.chat, pair.prompt, pair.chosen)[0] >
                    reply_logprob(model, trainer.chat, pair.prompt, pair.rejected)[0] for pair in pairs)
    return preferred / len(pairs)


@pytest.mark.parametrize("short_chosen", [True, False])
def test_train_preference_accuracy_equals_a_hand_computation(chat_model, tmp_path, short_chosen):
    data = write_pairs(tmp_path / "pairs.jsonl", short_chosen)
    trainer = DPOTrainer(dpo_config(chat_model, tmp_path / "run", data=str(data)), log=lambda *_: None)
    model = load_model(chat_model).eval()
    measured = trainer.train_preference(model)
    assert len(trainer.splits["train"].pairs) == 18 and trainer.dropped == {"train": 0, "val": 0}  # all, fewer than the sample
    assert measured == pytest.approx(hand_accuracy(model, trainer)) and measured == (1.0 if short_chosen else 0.0)


def test_dpo_notes_a_start_that_already_separates_the_train_pairs_and_trains_anyway(chat_model, tmp_path):
    lines: list[str] = []
    data = write_pairs(tmp_path / "pairs.jsonl", short_chosen=True)
    result = run_dpo(dpo_config(chat_model, tmp_path / "run", data=str(data), max_steps=2), log=lines.append)
    notes = [line for line in lines if line.startswith("note: the start already prefers the chosen reply")]
    assert len(notes) == 1 and "in 100.0% of 18 train pairs and 100.0% held out" in notes[0]
    assert "harder pairs" in notes[0] and result.status == "finished"
    assert result.before["train_preference_accuracy"] == 1.0 and "train_preference_accuracy" in result.after
    assert any(line.startswith("train_preference_accuracy: 1.000 before DPO -> ") for line in lines)


def test_dpo_says_nothing_of_the_kind_when_the_start_does_not_separate_the_pairs(chat_model, tmp_path):
    lines: list[str] = []
    data = write_pairs(tmp_path / "pairs.jsonl", short_chosen=False)
    result = run_dpo(dpo_config(chat_model, tmp_path / "run", data=str(data), max_steps=1), log=lines.append)
    assert result.before["train_preference_accuracy"] == 0.0
    assert not any("already prefers" in line for line in lines)
