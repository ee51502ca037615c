"""Reward-model training: the loss against TRL's, the reward at the last token, learning, exact resume, micro-batches,
the margin column."""

import dataclasses
import json
import math
import shutil
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from gptlab.align.preference.pairs import parse_pair
from gptlab.align.rl.rm import RewardTrainer, RMConfig, bradley_terry_loss, run_rm
from gptlab.model import preset
from gptlab.runtime import GptlabError
from gptlab.train.optim import OptimizerConfig
from gptlab.train.schedule import ScheduleConfig

from .conftest import TWO_RANKS, ranks_stdout

DATA = "task:spelling[n=64,counting=0]"


def rm_config(init, out, **changes) -> RMConfig:
    config = RMConfig(
        data=DATA, init_from=str(init), out=str(out), model=preset("gpt2-tiny"), val_fraction=0.25,
        optimizer=OptimizerConfig(lr=3e-3, weight_decay=0.0), schedule=ScheduleConfig(kind="constant", warmup_steps=1),
        batch_tokens=8 * 64, micro_batch=8, seq_len=64, max_steps=4, precision="fp32", device="cpu",
        eval_every=2, checkpoint_every=2, log_every=1,
    )
    return dataclasses.replace(config, **changes)


def quiet(config, **kwargs):
    return run_rm(config, log=lambda *_: None, **kwargs)


def trl_loss(chosen, rejected, margin, coefficient):
    """TRL 1.16's RewardTrainer.compute_loss itself, called on a stand-in trainer and model: the model returns the
    given rewards as its logits (chosen rows first, as TRL's collator stacks them), so no Hugging Face model is needed."""
    from trl.trainer.reward_trainer import RewardTrainer as TRLRewardTrainer

    rewards = torch.cat([chosen, rejected])[:, None]
    stand_in = SimpleNamespace(model=SimpleNamespace(training=True), args=SimpleNamespace(center_rewards_coefficient=coefficient),
                               accelerator=SimpleNamespace(gather_for_metrics=lambda value: value, gather=lambda value: value),
                               _metrics={"train": defaultdict(list)}, _total_train_tokens=0, _tp_size=1)
    inputs = {"input_ids": torch.zeros(len(rewards), 3, dtype=torch.long), "attention_mask": torch.ones(len(rewards), 3)}
    if margin is not None:
        inputs["margin"] = margin
    return TRLRewardTrainer.compute_loss(stand_in, lambda **_: SimpleNamespace(logits=rewards), inputs)


@pytest.mark.parametrize("with_margin, coefficient", [(False, None), (True, None), (True, 0.01), (False, 0.5)])
def test_rm_loss_equals_trls_reward_trainer_in_value_and_gradient(with_margin, coefficient):
    torch.manual_seed(0)
    chosen, rejected = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    margin = torch.rand(6, dtype=torch.float64) if with_margin else None
    ours_c, ours_r = chosen.clone().requires_grad_(), rejected.clone().requires_grad_()
    ours = bradley_terry_loss(ours_c, ours_r, margin, center_coefficient=coefficient or 0.0).mean()
    ours.backward()
    trl_c, trl_r = chosen.clone().requires_grad_(), rejected.clone().requires_grad_()
    theirs = trl_loss(trl_c, trl_r, margin, coefficient)
    theirs.backward()
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-12)
    assert torch.allclose(ours_c.grad, trl_c.grad, rtol=1e-12) and torch.allclose(ours_r.grad, trl_r.grad, rtol=1e-12)


def test_rm_reward_is_the_heads_value_at_the_end_token_of_each_rendering(chat_model, tmp_path):
    """Padded batch rows against each reply scored alone, by hand: the head on the trunk's last hidden state."""
    trainer = RewardTrainer(rm_config(chat_model, tmp_path / "run"), log=lambda *_: None)
    model = trainer._make_model().eval()
    x, lengths, kwargs = trainer._loader("val").next_batch()
    losses, chosen, rejected = trainer.pair_losses(model, x, lengths, kwargs)
    pairs = trainer.splits["val"].pairs
    for row, index in enumerate(kwargs["pair_index"].tolist()):
        for reply, got in ((pairs[index].chosen, chosen[row]), (pairs[index].rejected, rejected[row])):
            ids = trainer.chat.render([*pairs[index].prompt, {"role": "assistant", "content": reply}]).ids
            assert ids[-1] == trainer.chat.end
            with torch.no_grad():
                hidden = model.trunk.hidden_states(torch.tensor([ids]))[0, -1]
                expected = hidden @ model.head.weight[0] + model.head.bias[0]
            assert got.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
        assert losses[row].item() == pytest.approx(-math.log(torch.sigmoid(chosen[row] - rejected[row]).item()), rel=1e-5)


def test_rm_steps_raise_held_out_accuracy_on_task_pairs(chat_model, tmp_path):
    config = rm_config(chat_model, tmp_path / "run", data="task:spelling[n=256,counting=0]", val_fraction=0.5,
                       batch_tokens=16 * 64, micro_batch=16, max_steps=30, eval_every=15, checkpoint_every=0)
    result = quiet(config)
    assert result.status == "finished" and result.pairs["val"] == 80
    assert result.after["accuracy"] > result.before["accuracy"] + 0.2
    assert result.after["accuracy_low"] > 0.5 > result.before["accuracy_low"]  # the 95% interval clears chance after
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [record for record in records if "loss" in record]
    assert {"accuracy", "margin", "reward_mean", "reward_std"} <= set(steps[-1])
    assert {"val_loss", "val_accuracy", "val_margin", "val_reward_mean", "val_reward_std"} <= set(records[-1])
    saved = json.loads((tmp_path / "run" / "reward_model.json").read_text())
    assert saved["heldout_accuracy"] == result.after["accuracy"] and saved["normalise"] == result.normalise


def test_rm_resumes_exactly(chat_model, tmp_path):
    config = rm_config(chat_model, tmp_path / "straight")
    straight = quiet(config)
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step_000004")
    resumed = quiet(dataclasses.replace(config, out=str(tmp_path / "resumed")))
    assert resumed.status == "finished" and resumed.train.losses == straight.train.losses[2:]
    assert resumed.after["accuracy"] == straight.after["accuracy"] and resumed.normalise == straight.normalise


def test_rm_micro_batches_change_nothing(chat_model, tmp_path):
    whole = quiet(rm_config(chat_model, tmp_path / "whole", max_steps=3, eval_every=0, checkpoint_every=0,
                            center_rewards_coefficient=0.1))
    split = quiet(rm_config(chat_model, tmp_path / "split", max_steps=3, eval_every=0, checkpoint_every=0,
                            center_rewards_coefficient=0.1, micro_batch=2))
    assert split.train.losses == pytest.approx(whole.train.losses, rel=1e-5)
    assert split.after["margin"] == pytest.approx(whole.after["margin"], rel=1e-4, abs=1e-6)


def test_rm_reads_each_pairs_margin_and_trains_against_it(chat_model, tmp_path):
    path = tmp_path / "prefs.jsonl"
    rows = [{"prompt": f"Say {word}.", "chosen": word, "rejected": word[::-1], "margin": float(n % 3)}
            for n, word in enumerate(["apple", "crown", "pear", "stone", "river", "cloud", "maple", "tiger"] * 2)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    trainer = RewardTrainer(rm_config(chat_model, tmp_path / "run", data=str(path), val_fraction=0.0), log=lambda *_: None)
    model = trainer._make_model().eval()
    x, lengths, kwargs = trainer._loader("train").next_batch()
    expected = torch.tensor([trainer.splits["train"].pairs[i].margin for i in kwargs["pair_index"].tolist()])
    assert torch.equal(kwargs["margin"], expected) and expected.max() == 2.0
    losses, chosen, rejected = trainer.pair_losses(model, x, lengths, kwargs)
    assert torch.allclose(losses, -torch.nn.functional.logsigmoid(chosen - rejected - expected))


def test_rm_pairs_refuse_a_margin_that_is_not_a_number():
    assert parse_pair({"prompt": "q", "chosen": "a", "rejected": "b"}).margin == 0.0
    for bad in ("1", None, float("nan"), True):
        with pytest.raises(GptlabError, match="margin must be a finite number"):
            parse_pair({"prompt": "q", "chosen": "a", "rejected": "b", "margin": bad})


def test_rm_pairs_read_ultrafeedback_rows_whose_replies_are_whole_conversations():
    row = {"prompt": "Name a fruit.", "prompt_id": "x", "score_chosen": 8.0, "score_rejected": 3.0,
           "chosen": [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "An apple."}],
           "rejected": [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "A chair."}],
           "messages": [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "An apple."}]}
    pair = parse_pair(row)
    assert pair.prompt == [{"role": "user", "content": "Name a fruit."}] and (pair.chosen, pair.rejected) == ("An apple.", "A chair.")


def test_rm_config_refuses_bad_settings_in_one_line(chat_model, tmp_path):
    for changes, message in [({"center_rewards_coefficient": -1.0}, "center_rewards_coefficient"),
                             ({"normalise_pairs": 0}, "normalise_pairs")]:
        with pytest.raises(GptlabError, match=message):
            rm_config(chat_model, tmp_path / "run", **changes)
    with pytest.raises(GptlabError, match="none fits seq_len 8"):
        RewardTrainer(rm_config(chat_model, tmp_path / "run", seq_len=8, batch_tokens=64), log=lambda *_: None)
    with pytest.raises(GptlabError, match="--parallel.fsdp"):
        RewardTrainer(rm_config(chat_model, tmp_path / "run", parallel=dataclasses.replace(RMConfig().parallel, fsdp=True)))
    assert not (tmp_path / "run").exists()


RM_DDP_SCRIPT = """
import json, sys
from pathlib import Path
from gptlab.align.rl.rm import run_rm
from tests.align.test_rm import rm_config
result = run_rm(rm_config(Path(sys.argv[1]), Path(sys.argv[2]), micro_batch=4, max_steps=3, eval_every=0), log=lambda *_: None)
print("RESULT " + json.dumps({"losses": result.train.losses, "accuracy": result.after["accuracy"]}), flush=True)
"""


@TWO_RANKS
def test_rm_on_two_gloo_ranks_equals_one_process(chat_model, tmp_path, align_two_ranks):
    """2 ranks x 4 pairs take the same pairs per step as 1 process x 8 (position i of the order is rank i mod 2):
    the same losses, and held-out accuracy summed over the ranks' shares of the pairs."""
    single = quiet(rm_config(chat_model, tmp_path / "single", max_steps=3, eval_every=0))
    stdout = ranks_stdout(align_two_ranks, "rm")
    reports = [json.loads(line.split("RESULT ", 1)[1]) for line in stdout.splitlines() if "RESULT " in line]
    assert len(reports) == 2 and reports[0] == reports[1]
    assert reports[0]["losses"] == pytest.approx(single.train.losses, rel=1e-5)
    assert reports[0]["accuracy"] == single.after["accuracy"]
