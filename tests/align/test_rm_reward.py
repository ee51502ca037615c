"""A trained reward model read back: its folder and checkpoints score as the trainer did, rm:DIR is a reward, and
`gptlab rm` / `gptlab rm-score` run as a user runs them, with one-line errors for wrong input."""

import dataclasses
import json

import pytest
import torch

from gptlab.align.rl.rewards import Rewards
from gptlab.align.rl.rm import RewardTrainer, run_rm
from gptlab.align.rl.rm_reward import load_reward_model, reward_model_reward, score_pairs
from gptlab.cli.main import main
from gptlab.runtime import GptlabError

from .test_rm import rm_config


@pytest.fixture(scope="module")
def trained(chat_model, tmp_path_factory):
    """A reward model trained for 6 steps on spelling pairs: (its config, its run folder)."""
    out = tmp_path_factory.mktemp("rm") / "run"
    config = rm_config(chat_model, out, max_steps=6, checkpoint_every=3, eval_every=0, val_fraction=0.25)
    assert run_rm(config, log=lambda *_: None).status == "finished"
    return config, out


def test_rm_saved_folder_and_checkpoint_score_as_the_trainer_did(trained):
    config, out = trained
    trainer = RewardTrainer(config, log=lambda *_: None)
    assert trainer.fit().status == "already finished"  # restores the final checkpoint's weights into trainer.model
    x, lengths, kwargs = trainer._loader("val").next_batch()
    _, chosen, rejected = trainer.pair_losses(trainer.model.eval(), x, lengths, kwargs)
    pairs = [trainer.splits["val"].pairs[i] for i in kwargs["pair_index"].tolist()]
    prompts = [pair.prompt for pair in pairs] * 2
    replies = [pair.chosen for pair in pairs] + [pair.rejected for pair in pairs]
    expected = torch.cat([chosen, rejected])
    folder = load_reward_model(out)
    meta = json.loads((out / "reward_model.json").read_text())
    assert meta["format"] == "gptlab-reward-model" and meta["read_at"] == "last" and meta["trained_on"] == config.data
    assert (folder.mean, folder.std) == (meta["normalise"]["mean"], meta["normalise"]["std"]) and folder.std != 1.0
    assert torch.allclose(torch.tensor(folder.score(prompts, replies, normalised=False)), expected, atol=1e-5)
    normalised = torch.tensor(folder.score(prompts, replies))
    assert torch.allclose(normalised, (expected - folder.mean) / folder.std, atol=1e-4)
    checkpoint = load_reward_model(out / "checkpoints" / "step_000006")
    assert (checkpoint.mean, checkpoint.std) == (0.0, 1.0)
    assert torch.allclose(torch.tensor(checkpoint.score(prompts, replies)), expected, atol=1e-5)
    earlier = load_reward_model(out / "checkpoints" / "step_000003")
    assert not torch.allclose(torch.tensor(earlier.score(prompts, replies)), expected, atol=1e-3)


def test_rm_normalisation_centres_the_train_replies_rewards(trained):
    config, out = trained
    trainer = RewardTrainer(dataclasses.replace(config, val_fraction=0.0), log=lambda *_: None)
    pairs = trainer.splits["train"].pairs
    scores = load_reward_model(out).score([pair.prompt for pair in pairs] * 2,
                                          [pair.chosen for pair in pairs] + [pair.rejected for pair in pairs])
    scores = torch.tensor(scores, dtype=torch.float64)
    assert abs(scores.mean().item()) < 1e-4 and scores.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-4)


def test_rm_reward_term_scores_completions_in_a_rewards_spec(trained):
    _, out = trained
    scorer = load_reward_model(out)
    prompts = ['Spell the word "crown".', [{"role": "user", "content": 'Spell the word "pear".'}]]
    completions = ["c-r-o-w-n", [{"role": "assistant", "content": "p-e-a-r"}]]
    rewards = Rewards.from_spec(f"rm:{out}*2")
    scores = rewards.score(prompts, completions)
    expected = scorer.score(prompts, ["c-r-o-w-n", "p-e-a-r"])
    assert rewards.names == ["rm"] and scores.total == pytest.approx([2 * value for value in expected], rel=1e-5)
    assert reward_model_reward(str(out), device="cpu")(prompts=prompts, completions=completions) == pytest.approx(expected, rel=1e-5)


def test_rm_scoring_keeps_the_end_of_a_rendering_longer_than_the_context(trained):
    _, out = trained
    scorer = load_reward_model(out)
    context = scorer.model.config.block_size
    long_prompt = "word " * (2 * context)
    ids = scorer.chat.render([{"role": "user", "content": long_prompt}, {"role": "assistant", "content": "ok"}]).ids
    assert len(ids) > context
    with torch.no_grad():
        expected = scorer.model(torch.tensor([ids[-context:]]))[0, -1].item()
    assert scorer.score([long_prompt], ["ok"], normalised=False)[0] == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_rm_refuses_folders_that_are_no_reward_model_in_one_line(chat_model, tmp_path, trained):
    with pytest.raises(GptlabError, match="no such folder"):
        load_reward_model(tmp_path / "missing")
    with pytest.raises(GptlabError, match="is not a reward model"):
        load_reward_model(chat_model)
    with pytest.raises(GptlabError, match="is not a reward model"):
        Rewards.from_spec(f"rm:{chat_model}")
    with pytest.raises(GptlabError, match="holds no pairs"):
        score_pairs(load_reward_model(trained[1]), str(_write(tmp_path / "bad.jsonl", [{"text": "not a pair"}])))


def _write(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def test_rm_commands_train_and_score_as_a_user_runs_them(chat_model, tmp_path, capsys):
    out = tmp_path / "rm"
    args = ["rm", "--init", str(chat_model), "--data", "task:spelling[n=32,counting=0]", "--max-steps", "2",
            "--batch-tokens", "512", "--micro-batch", "4", "--seq-len", "64", "--precision", "fp32", "--device", "cpu",
            "--val-fraction", "0.25", "--center-rewards-coefficient", "0.01"]
    assert main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "held-out accuracy (95% interval)" in printed and "finished after 2 steps" in printed
    assert (out / "reward_model.json").is_file() and (out / "score_head.safetensors").is_file()
    assert main(["rm-score", str(out), "--prompt", 'Spell the word "crown".', "--reply", "c-r-o-w-n", "--reply", "c-r-w-o-n",
                 "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    expected = load_reward_model(out).score(['Spell the word "crown".'] * 2, ["c-r-o-w-n", "c-r-w-o-n"])
    assert [float(line) for line in lines] == pytest.approx(expected, abs=1e-4)
    assert main(["rm-score", str(out), "--data", "task:spelling[n=8,split=test,counting=0]", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith("pairs 8: accuracy ")


def test_rm_commands_refuse_wrong_input_in_one_line_leaving_nothing(chat_model, tmp_path, capsys):
    args = ["rm", "--data", "task:spelling[n=16,counting=0]", "--max-steps", "1", "--batch-tokens", "512", "--micro-batch", "4",
            "--seq-len", "64", "--precision", "fp32", "--device", "cpu"]
    with pytest.raises(SystemExit):
        main([*args, "--out", str(tmp_path / "none")])
    assert "--init" in capsys.readouterr().err and not (tmp_path / "none").exists()
    args = [*args, "--init", str(chat_model)]
    wrong = _write(tmp_path / "texts.jsonl", [{"text": "a document, not a pair"}] * 3)
    assert main([*args, "--data", str(wrong), "--out", str(tmp_path / "wrong")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "texts.jsonl" in err and "no valid row" in err and not (tmp_path / "wrong").exists()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert main([*args, "--out", str(foreign)]) == 1
    assert capsys.readouterr().err.count("\n") == 1 and sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    assert main(["rm-score", str(chat_model), "--prompt", "hi", "--reply", "hello", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a reward model" in err
    assert main(["rm-score", str(chat_model), "--prompt", "hi", "--device", "cpu"]) == 1
    assert "--reply" in capsys.readouterr().err
