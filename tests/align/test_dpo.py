"""DPO end to end: the loss against its formula, learning on held-out pairs, exact resume, the reference, the CLI."""

import dataclasses
import json
import shutil
from contextlib import nullcontext

import pytest
import torch

from gptlab.align.preference import dpo
from gptlab.align.preference.dpo import DPOConfig, DPOTrainer, dpo_loss, run_dpo
from gptlab.cli.main import main
from gptlab.model import preset
from gptlab.model.io import load_model
from gptlab.runtime import GptlabError
from gptlab.train.optim import OptimizerConfig
from gptlab.train.schedule import ScheduleConfig

from .conftest import TWO_RANKS, ranks_stdout

DATA = "task:arithmetic[n=64,digits=1], task:spelling[n=64]"


def dpo_config(init, out, **changes) -> DPOConfig:
    config = DPOConfig(
        data=DATA, init_from=str(init), out=str(out), model=preset("gpt2-tiny"), val_fraction=0.25,
        optimizer=OptimizerConfig(lr=3e-3, weight_decay=0.0), schedule=ScheduleConfig(kind="constant", warmup_steps=1),
        batch_tokens=16 * 64, micro_batch=8, seq_len=64, max_steps=4, precision="fp32", device="cpu",
        eval_every=2, checkpoint_every=2, log_every=1, tasks="none",
    )
    return dataclasses.replace(config, **changes)


def quiet(config, **kwargs):
    return run_dpo(config, log=lambda *_: None, **kwargs)


def reply_logprob(model, chat, prompt, reply) -> torch.Tensor:
    """log π(reply + <|end|> | prompt), by hand: one sequence, log_softmax and a gather per reply token."""
    context = chat.prompt(prompt)
    answer = chat.tokenizer.encode_ordinary(reply) + [chat.end]
    ids = torch.tensor([context + answer])
    logits, _ = model(ids[:, :-1])
    logp = torch.log_softmax(logits[0].float(), dim=-1)
    return sum(logp[len(context) - 1 + t, token] for t, token in enumerate(answer)), len(answer)


@pytest.mark.parametrize("kind, smoothing", [("sigmoid", 0.0), ("sigmoid", 0.2), ("ipo", 0.0)])
def test_dpo_loss_equals_the_formula_on_a_tiny_model(chat_model, tmp_path, kind, smoothing):
    trainer = DPOTrainer(dpo_config(chat_model, tmp_path / "run", loss=kind, label_smoothing=smoothing, beta=0.5,
                                    reference="model"), log=lambda *_: None)
    reference = load_model(chat_model).eval()
    policy = load_model(chat_model).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    trainer.reference_model, trainer.reference_table, trainer.cast = reference, {}, nullcontext()
    x, y, kwargs = trainer._loader("val").next_batch()
    losses, chosen_rewards, _, _ = trainer._pair_losses(policy, "val", x, y, kwargs)
    pairs = trainer.splits["val"].pairs
    for row, index in enumerate(kwargs["pair_index"].tolist()):
        pair, scores = pairs[index], []
        for model in (policy, reference):
            for reply in (pair.chosen, pair.rejected):
                total, count = reply_logprob(model, trainer.chat, pair.prompt, reply)
                scores.append(total / count if kind == "ipo" else total)
        pc, pr, rc, rr = scores
        h = (pc - rc) - (pr - rr)
        if kind == "ipo":
            expected = (h - 1 / (2 * 0.5)) ** 2
        else:
            expected = -(1 - smoothing) * torch.nn.functional.logsigmoid(0.5 * h) - smoothing * torch.nn.functional.logsigmoid(-0.5 * h)
        assert losses[row].item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-6)
        assert chosen_rewards[row].item() == pytest.approx(0.5 * (pc - rc).item(), rel=1e-4, abs=1e-6)


def test_dpo_loss_is_log_two_when_policy_is_the_reference():
    logp = torch.tensor([-3.0, -7.0])
    losses, chosen, rejected = dpo_loss(logp, logp - 1, logp, logp - 1, beta=0.1)
    assert torch.allclose(losses, torch.full((2,), 0.6931), atol=1e-4) and not chosen.any() and not rejected.any()


def test_dpo_steps_raise_the_held_out_margin_and_preference_accuracy(chat_model, tmp_path):
    config = dpo_config(chat_model, tmp_path / "run", data="task:spelling[n=128,counting=0]", val_fraction=0.5,
                        max_steps=12, eval_every=0, checkpoint_every=0, beta=0.5)
    result = quiet(config)
    assert result.status == "finished" and result.pairs["val"] == 64
    assert result.after["logp_margin"] > result.before["logp_margin"] + 0.5
    assert result.after["preference_accuracy"] > result.before["preference_accuracy"]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["val_margin"] > 0 and {"reward_margin", "reward_accuracy", "chosen_reward"} <= set(records[-2])


def test_dpo_resumes_exactly_and_reuses_the_reference(chat_model, tmp_path, monkeypatch):
    config = dpo_config(chat_model, tmp_path / "straight")
    straight = quiet(config)
    assert (tmp_path / "straight" / "reference_logprobs.pt").is_file()
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step_000004")

    def recompute(*args, **kwargs):
        raise AssertionError("the reference was recomputed on resume")

    monkeypatch.setattr(dpo, "reference_logprobs", recompute)
    resumed = quiet(dataclasses.replace(config, out=str(tmp_path / "resumed")))
    assert resumed.train.losses == straight.train.losses[2:]


def test_dpo_precomputed_reference_equals_the_model_reference(chat_model, tmp_path):
    precomputed = quiet(dpo_config(chat_model, tmp_path / "precomputed", loss="ipo", max_steps=3))
    model = quiet(dpo_config(chat_model, tmp_path / "model", loss="ipo", max_steps=3, reference="model"))
    assert model.train.losses == pytest.approx(precomputed.train.losses, rel=1e-4)
    assert not (tmp_path / "model" / "reference_logprobs.pt").exists()


def test_dpo_config_refuses_bad_settings_in_one_line(chat_model, tmp_path):
    for changes, message in [({"beta": 0.0}, "beta"), ({"loss": "hinge"}, "unknown loss"),
                             ({"loss": "ipo", "label_smoothing": 0.1}, "label_smoothing"), ({"reference": "none"}, "reference")]:
        with pytest.raises(GptlabError, match=message):
            dpo_config(chat_model, tmp_path / "run", **changes)


def test_dpo_command_runs_and_refuses_bad_input_leaving_nothing(chat_model, tmp_path, capsys):
    args = ["dpo", "--init", str(chat_model), "--data", "task:arithmetic[n=32,digits=1]", "--max-steps", "2",
            "--batch-tokens", "512", "--micro-batch", "4", "--seq-len", "64", "--task-examples", "4", "--precision", "fp32",
            "--device", "cpu", "--val-fraction", "0.25"]
    assert main([*args, "--out", str(tmp_path / "dpo"), "--beta", "0.2", "--loss", "ipo"]) == 0
    out = capsys.readouterr().out
    assert "preference_accuracy" in out and "arithmetic_accuracy" in out and "finished after 2 steps" in out
    with pytest.raises(SystemExit):
        main(["dpo", "--data", "task:arithmetic[n=8]", "--out", str(tmp_path / "none")])
    assert "--init" in capsys.readouterr().err
    assert main([*args, "--data", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.jsonl" in err and not (tmp_path / "missing").exists()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert main([*args, "--out", str(foreign)]) == 1
    assert capsys.readouterr().err.count("\n") == 1 and sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


def test_dpo_sft_weight_adds_the_chosen_replies_nll_per_token(chat_model, tmp_path):
    """RPO: the micro-batch loss is DPO's mean plus α × the mean over pairs of the chosen reply's NLL per token."""
    plain = DPOTrainer(dpo_config(chat_model, tmp_path / "a", reference="model"), log=lambda *_: None)
    weighted = DPOTrainer(dpo_config(chat_model, tmp_path / "b", reference="model", sft_weight=0.7), log=lambda *_: None)
    policy = load_model(chat_model).eval()
    for trainer in (plain, weighted):
        trainer.reference_model, trainer.reference_table, trainer.cast = load_model(chat_model).eval(), {}, nullcontext()
        trainer.wrapped, trainer.accum, trainer.tally = policy, 1, torch.zeros(4)
    x, y, kwargs = plain._loader("train").next_batch()
    pairs = plain.splits["train"].pairs
    nll = [-reply_logprob(policy, plain.chat, pairs[i].prompt, pairs[i].chosen)[0] / reply_logprob(policy, plain.chat, pairs[i].prompt, pairs[i].chosen)[1]
           for i in kwargs["pair_index"].tolist()]
    expected = plain._micro_loss(x, y, kwargs, None) + 0.7 * torch.stack(nll).mean()
    assert weighted._micro_loss(x, y, kwargs, None).item() == pytest.approx(expected.item(), rel=1e-5)
    with pytest.raises(GptlabError, match="sft_weight"):
        dpo_config(chat_model, tmp_path / "c", sft_weight=-1.0)


DPO_DDP_SCRIPT = """
import sys
from pathlib import Path
from gptlab.align.preference.dpo import run_dpo
from tests.align.test_dpo import dpo_config
result = run_dpo(dpo_config(Path(sys.argv[1]), Path(sys.argv[2]), micro_batch=4, max_steps=2), log=lambda *_: None)
print(f"status {result.status} accuracy {result.after['preference_accuracy']:.6f}", flush=True)
"""


@TWO_RANKS
def test_dpo_runs_on_two_gloo_ranks_and_they_agree(align_two_ranks):
    """Each rank takes its share of pairs; held-out figures are summed over ranks, so both report the same;
    rank 0 alone writes the reference file, and the checkpoint holds both ranks' loader states."""
    import re

    from gptlab.load.checkpoints import list_checkpoints

    reports = re.findall(r"status (\w+) accuracy ([0-9.]+)", ranks_stdout(align_two_ranks, "dpo"))
    assert len(reports) == 2 and reports[0] == reports[1] and reports[0][0] == "finished"
    ddp = align_two_ranks / "dpo" / "ddp"
    assert (ddp / "reference_logprobs.pt").is_file()
    state = json.loads((list_checkpoints(ddp)[-1] / "trainer_state.json").read_text())
    assert len(state["loader"]) == 2
