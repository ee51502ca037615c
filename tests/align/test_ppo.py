"""The PPO trainer: checkpoints that are chat models, micro-batches and ranks that change nothing, exact resume in
the middle of a rollout, learning on held-out prompts within the KL target, and mistakes caught before compute."""

import dataclasses
import json
import shutil

import pytest
import torch

from gptlab.align.rl.ppo import PPOConfig, PPOTrainer, run_ppo
from gptlab.cli.main import main
from gptlab.model.io import load_model
from gptlab.train.optim import OptimizerConfig
from gptlab.train.schedule import ScheduleConfig

from .conftest import TWO_RANKS, ranks_stdout


def ppo_config(model, out, **changes) -> PPOConfig:
    config = PPOConfig(
        init_from=str(model), out=str(out), task="arithmetic[digits=1]", rollout_prompts=8, minibatches=2, ppo_epochs=2,
        micro_batch=4, seq_len=48, max_new_tokens=6, max_steps=2, device="cpu", precision="fp32",
        optimizer=OptimizerConfig(lr=1e-2, weight_decay=0.0), schedule=ScheduleConfig(kind="constant", warmup_steps=0),
        checkpoint_every=1, log_every=1, eval_examples=4, eval_samples=2, train_examples=50,
    )
    return dataclasses.replace(config, **changes)


def parity_reward(examples, texts):
    """A reward that differs between completions, so advantages are not all alike."""
    return [float(len(text) % 2) for text in texts], {}


def fit(config, reward=parity_reward, **kwargs):
    trainer = PPOTrainer(config, log=lambda *_: None, **kwargs)
    trainer.score = reward
    return trainer, trainer.fit()


def test_a_ppo_checkpoint_is_a_chat_model_with_the_value_model_beside_it(chat_model, tmp_path):
    from safetensors.torch import load_file

    from gptlab.align.start import find_init

    for value_model in ("separate", "shared"):
        _, result = fit(ppo_config(chat_model, tmp_path / value_model, value_model=value_model))
        assert result.status == "finished" and result.steps == 2
        policy = load_model(result.checkpoint)  # what gptlab chat, serve and eval load
        start = load_model(chat_model)
        assert any(not torch.equal(a, b) for a, b in zip(policy.state_dict().values(), start.state_dict().values()))
        assert find_init(str(tmp_path / value_model)) == result.checkpoint
        if value_model == "separate":  # the reward model's layout: a model folder and its score head
            load_model(result.checkpoint / "value")
            head = load_file(result.checkpoint / "value/score_head.safetensors")
        else:
            head = load_file(result.checkpoint / "value_head.safetensors")
        assert set(head) == {"weight", "bias"} and head["weight"].shape == (1, start.config.n_embd)
        assert (result.checkpoint / "tokenizer").is_dir()


def test_the_step_does_not_depend_on_micro_batches(chat_model, tmp_path):
    _, small = fit(ppo_config(chat_model, tmp_path / "two", micro_batch=2))
    _, large = fit(ppo_config(chat_model, tmp_path / "four", micro_batch=4))
    assert small.losses == pytest.approx(large.losses, rel=1e-5, abs=1e-7)
    first = torch.load(small.checkpoint / "optimizer.pt")["state"][0]["exp_avg"]
    second = torch.load(large.checkpoint / "optimizer.pt")["state"][0]["exp_avg"]
    torch.testing.assert_close(first, second, rtol=1e-4, atol=1e-7)
    assert first.abs().sum() > 0


def test_ppo_resumes_exactly_in_the_middle_of_a_rollout(chat_model, tmp_path):
    config = ppo_config(chat_model, tmp_path / "straight", max_steps=6, checkpoint_every=3, keep_last=3, kl_target=1.0, kl_horizon=16)
    _, straight = fit(config)
    saved = json.loads((tmp_path / "straight/checkpoints/step_000003/trainer_state.json").read_text())
    assert saved["loader"][0]["buffer"] is not None  # step 4 is the rollout's last minibatch: it is saved whole
    assert saved["loader"][0]["beta"] != config.kl_coef  # the adaptive β moved, and is saved
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed/checkpoints/step_000006")
    _, resumed = fit(dataclasses.replace(config, out=str(tmp_path / "resumed")))
    assert resumed.losses == straight.losses[3:]
    assert (tmp_path / "resumed/completions.jsonl").read_text() == (tmp_path / "straight/completions.jsonl").read_text()


def test_run_ppo_logs_what_trl_users_watch_and_measures_before_and_after(chat_model, tmp_path):
    lines = []
    result = run_ppo(ppo_config(chat_model, tmp_path / "run", max_steps=2, reward="verifier"), log=lines.append)
    assert {"arithmetic_accuracy", "heldout_reward"} <= set(result.before) and set(result.before) == set(result.after)
    assert any(line.startswith("before: held-out reward") for line in lines)
    assert any(line.startswith("change on the same 4 held-out questions") for line in lines)
    metrics = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert {"reward", "non_score_reward", "kl", "entropy", "value_loss", "policy_loss", "explained_variance", "clipfrac",
            "value_clipfrac", "approx_kl", "length", "stopped", "beta"} <= set(metrics[0])
    assert metrics[0]["approx_kl"] == pytest.approx(0.0, abs=1e-10)  # the first minibatch is on-policy: ratio 1
    record = json.loads((tmp_path / "run/completions.jsonl").read_text().splitlines()[0])
    assert set(record) == {"step", "rollout", "question", "completion", "reward"}


def test_a_few_steps_raise_the_exact_expected_reward_on_held_out_prompts_within_the_kl_target(chat_model, tmp_path):
    from .test_grpo import exact_expected_reward, first_vowel

    config = ppo_config(chat_model, tmp_path / "run", max_steps=20, rollout_prompts=32, minibatches=1, micro_batch=32,
                        checkpoint_every=0, kl_coef=0.1, kl_target=2.0, kl_horizon=64, optimizer=OptimizerConfig(lr=1e-2, weight_decay=0.0))
    trainer = PPOTrainer(config, log=lambda *_: None)
    trainer.score = first_vowel
    held_out = trainer.task.examples("test", 20)
    before = exact_expected_reward(load_model(chat_model), trainer, held_out)
    trainer.fit()
    after = exact_expected_reward(trainer.model.policy, trainer, held_out)
    metrics = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert after > before + 0.05, (before, after)
    # The adaptive controller (Ziegler et al.) answers KL above the target by raising beta at most 20% of the way per
    # horizon, so KL may pass the target for a step or two (2.02 on an AMD EPYC): it must stay near it, not under it.
    assert max(m["kl"] for m in metrics) < 1.25 * 2.0


def test_ppo_cli_runs_and_refuses_wrong_inputs_with_one_line_leaving_nothing(chat_model, prepared, tmp_path, capsys):
    small = ["--rollout-prompts", "4", "--minibatches", "1", "--ppo-epochs", "1", "--micro-batch", "4", "--max-new-tokens", "4",
             "--eval-examples", "2", "--eval-samples", "1", "--device", "cpu", "--train-examples", "20"]
    assert main(["ppo", "--init", str(chat_model), "--out", str(tmp_path / "run"), "--max-steps", "1", "--value-model", "shared", *small]) == 0
    assert (tmp_path / "run/checkpoints/step_000001/value_head.safetensors").is_file()
    capsys.readouterr()
    out = tmp_path / "refused"
    for args, message in [
        (["--init", str(tmp_path / "missing")], "missing"),
        (["--init", str(chat_model), "--reward", "no_such_file.py:score"], "no_such_file.py"),
        (["--init", str(chat_model), "--reward", "verifier*x"], "verifier*x"),
        (["--init", str(prepared / "tokenizer")], "not a chat model"),
        (["--init", str(chat_model), "--value-init", str(chat_model)], "not a reward model"),
        (["--init", str(chat_model), "--batch-tokens", "64"], "PPO does not use it"),
        (["--init", str(chat_model), "--value-model", "tied"], "unknown value_model"),
    ]:
        assert main(["ppo", *args, "--out", str(out), *small]) != 0
        printed = capsys.readouterr()
        assert message in printed.err and "Traceback" not in printed.err and len(printed.err.strip().splitlines()) == 1, printed.err
        assert "before:" not in printed.out  # refused before the held-out measurement: no compute spent
        assert not out.exists()


PPO_DDP_SCRIPT = """
import sys
from gptlab.runtime.device import init_runtime, shutdown_runtime
from tests.align.test_ppo import fit, ppo_config
runtime = init_runtime("cpu")
_, result = fit(ppo_config(sys.argv[1], sys.argv[2], minibatches=1, micro_batch=2), runtime=runtime)
print(f"rank {runtime.rank} status {result.status}")
shutdown_runtime(runtime)
"""


@TWO_RANKS
def test_two_gloo_ranks_train_as_one_process(chat_model, tmp_path, align_two_ranks):
    """Each rank samples its half of the prompts alike (seeds are per prompt), whitening and the minibatch mean are
    over both ranks' tokens: 2 ranks end with the policy and value weights of 1 process."""
    from safetensors.torch import load_file

    from gptlab.load.checkpoints import list_checkpoints

    fit(ppo_config(chat_model, tmp_path / "single", minibatches=1, micro_batch=4))
    assert ranks_stdout(align_two_ranks, "ppo").count("status finished") == 2
    single, ddp = (list_checkpoints(folder)[-1] for folder in (tmp_path / "single", align_two_ranks / "ppo" / "ddp"))
    start = load_file(chat_model / "model.safetensors")
    for file in ("model.safetensors", "value/model.safetensors", "value/score_head.safetensors"):
        ours, theirs = load_file(ddp / file), load_file(single / file)
        for name in theirs:
            # AdamW divides each gradient by its own running size, so the ranks' other summation order moves a weight
            # whose gradient is near zero by up to ~1.3e-5 (measured on an Intel Xeon, where torch's CPU kernels take
            # other paths than on an AMD EPYC); a wrong split of the batch moves every weight by about the lr, 1e-2
            torch.testing.assert_close(ours[name], theirs[name], rtol=1e-4, atol=1e-4)
    assert any(not torch.equal(load_file(single / "model.safetensors")[name], start[name]) for name in start)  # it trained


def test_ppo_scores_with_a_reward_model_and_starts_its_value_model_from_it(chat_model, tmp_path):
    from safetensors.torch import load_file

    from gptlab.align.rl.rm_reward import load_reward_model, write_reward_model
    from gptlab.align.rl.scalar import ScalarModel
    from gptlab.tokenizer import Tokenizer

    torch.manual_seed(3)
    rm = ScalarModel(load_model(chat_model))
    folder = write_reward_model(tmp_path / "rm", rm, Tokenizer.load(chat_model / "tokenizer"), mean=0.0, std=1.0,
                                trained_on="test", heldout_accuracy=None)
    config = ppo_config(chat_model, tmp_path / "run", max_steps=1, reward=f"rm:{folder}", value_init=str(folder),
                        optimizer=OptimizerConfig(lr=0.0, weight_decay=0.0))
    trainer = PPOTrainer(config, log=lambda *_: None)
    result = trainer.fit()
    head = load_file(result.checkpoint / "value/score_head.safetensors")  # lr 0: still the reward model's head
    torch.testing.assert_close(head["weight"], rm.head.weight.detach())
    record = json.loads((tmp_path / "run/completions.jsonl").read_text().splitlines()[0])
    expected = load_reward_model(folder).score([record["question"]], [record["completion"]])[0]
    assert record["reward"] == pytest.approx(expected, rel=1e-5, abs=1e-6)


SPREAD = 20.0
KL_TARGET = 10.0  # nats per completion: the policy may move that far to chase the reward


def test_a_few_steps_raise_a_reward_models_score_on_held_out_prompts_within_the_kl_target(chat_model, tmp_path):
    """RLHF's loop end to end: a reward model (a scalar head on the chat model's trunk, its head drawn at random so the
    reward is one the policy can chase) scores the rollouts through `rm:DIR`; its mean score on held-out prompts,
    over the same seeded samples before and after, rises while the logged KL stays under the target."""
    from gptlab.align.rl.ppo import heldout_reward
    from gptlab.align.rl.rm_reward import write_reward_model
    from gptlab.align.rl.scalar import ScalarModel
    from gptlab.tokenizer import Tokenizer

    torch.manual_seed(0)
    rm = ScalarModel(load_model(chat_model))
    with torch.no_grad():
        rm.head.weight.mul_(SPREAD)  # a spread of rewards across replies worth chasing (a fresh head's is tiny)
    folder = write_reward_model(tmp_path / "rm", rm, Tokenizer.load(chat_model / "tokenizer"), mean=0.0, std=1.0,
                                trained_on="test", heldout_accuracy=None)
    config = ppo_config(chat_model, tmp_path / "run", max_steps=40, rollout_prompts=32, minibatches=1, micro_batch=32,
                        checkpoint_every=0, kl_coef=0.1, kl_target=KL_TARGET, kl_horizon=64, reward=f"rm:{folder}",
                        eval_examples=16, eval_samples=16, optimizer=OptimizerConfig(lr=1e-2, weight_decay=0.0))
    trainer = PPOTrainer(config, log=lambda *_: None)
    before = heldout_reward(trainer, load_model(chat_model))
    trainer.fit()
    after = heldout_reward(trainer, trainer.model.policy)
    metrics = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert after > before + 1.0, (before, after)  # 20.9 -> 24.2 when written
    assert max(m["kl"] for m in metrics if "kl" in m) < KL_TARGET
