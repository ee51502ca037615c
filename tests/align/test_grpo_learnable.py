"""GRPO robust to its start: the probe's pass rates against the same seeded samples drawn one prompt at a time, the
learnable filter, the refusal that leaves nothing behind, resume and 2 ranks keeping the probe's pool, and the
per-token entropy against token_entropy on the same batch."""

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch

from gptlab.align.logprobs import IGNORE, token_entropy
from gptlab.align.rl import grpo
from gptlab.align.rl.grpo import GRPOTrainer, load_grpo_task, run_grpo
from gptlab.align.rl.learnable import PROBE_STREAM, StartProbe, nothing_learned
from gptlab.align.rl.rollout import rollout
from gptlab.cli.main import main
from gptlab.model.io import load_model
from gptlab.runtime import GptlabError

from .conftest import TWO_RANKS, ranks_stdout
from .test_grpo import grpo_config, parity_reward


def by_operand(examples, texts):
    """Right for every sample when the first operand is 0-2, never when it is 7-9, and by the completion's length
    parity otherwise: prompts the start always, never and sometimes gets right."""
    rewards = []
    for example, text in zip(examples, texts):
        first = int(example.question.split()[2])  # "What is 3 + 4?"
        rewards.append(1.0 if first <= 2 else 0.0 if first >= 7 else float(len(text) % 2))
    return rewards, {}


def learnable_config(model, out, **changes):
    settings = {"prompt_filter": "learnable", "probe_samples": 4, "probe_prompts": 100, "prompts_per_step": 2, "max_steps": 1,
                "micro_batch": 4}
    return grpo_config(model, out, **{**settings, **changes})


def fit(config, reward=by_operand, **kwargs):
    trainer = GRPOTrainer(config, log=kwargs.pop("log", lambda *_: None), **kwargs)
    trainer.score = reward
    return trainer, trainer.fit()


def brute_pass_rates(chat_model, trainer, config) -> tuple[list, list[float]]:
    """The distinct train questions, and each one's pass rate, sampling it alone with its own seeded requests."""
    candidates, seen = [], set()
    for example in trainer.task.examples("train", config.train_examples):
        if example.question not in seen:
            seen.add(example.question)
            candidates.append(example)
    seed = int(np.random.SeedSequence([config.seed, PROBE_STREAM]).generate_state(1)[0])
    model, chat, rates = load_model(chat_model), trainer.chat, []
    for index, example in enumerate(candidates):
        prompt = chat.prompt([{"role": "user", "content": example.question}])
        (group,) = rollout(model, [prompt], trainer.sampling, samples=config.probe_samples, seed=seed, slots=1, keys=[index])
        texts = [chat.tokenizer.decode([t for t in c.tokens if t not in chat.stop_tokens]) for c in group]
        rewards, _ = by_operand([example] * len(texts), texts)
        rates.append(sum(reward > 0 for reward in rewards) / len(rewards))
    return candidates, rates


@pytest.mark.parametrize("probe_prompts", [100, 3])
def test_learnable_filter_keeps_exactly_the_prompts_with_a_pass_rate_between_0_and_1(chat_model, tmp_path, probe_prompts):
    """All candidates probed at once, or 3 at a time until 3 are kept (the pool refilled from further examples)."""
    lines: list[str] = []
    config = learnable_config(chat_model, tmp_path / "run", probe_prompts=probe_prompts)
    trainer, result = fit(config, log=lines.append)
    candidates, rates = brute_pass_rates(chat_model, trainer, config)
    assert {0.0, 1.0} <= set(rates) and any(0 < rate < 1 for rate in rates)  # all three kinds, so the filter is tested
    probed = len(candidates)
    if probe_prompts < len(candidates):  # the first whole block in which probe_prompts are learnable
        probed = next(end for end in range(probe_prompts, len(candidates) + probe_prompts, probe_prompts)
                      if sum(0 < rate < 1 for rate in rates[:end]) >= probe_prompts)
        assert probed < len(candidates)  # it stopped early: a refill case, not the whole split
    wanted = [example.question for example, rate in zip(candidates[:probed], rates) if 0 < rate < 1]
    assert [example.question for example in trainer.pool] == wanted
    always, never = sum(rate == 1 for rate in rates[:probed]), sum(rate == 0 for rate in rates[:probed])
    assert (f"start: {always} of {probed} train prompts always right, {never} never, {len(wanted)} in between; "
            f"mean pass rate {np.mean(rates[:probed]):.2f} (4 samples each)") in lines
    shown = [json.loads(line)["question"] for line in (tmp_path / "run/completions.jsonl").read_text().splitlines()]
    assert shown and set(shown) <= set(wanted) and result.status == "finished"


def test_a_start_with_nothing_to_learn_is_refused_in_one_line_leaving_no_run_folder(chat_model, tmp_path, capsys):
    """A reward that is 0 for every sample: no prompt has reward spread, so no gradient."""
    never = tmp_path / "never.py"
    never.write_text("def never(prompts, completions, **columns):\n    return [0.0 for _ in completions]\n")
    small = ["--prompts-per-step", "2", "--group-size", "2", "--micro-batch", "4", "--max-new-tokens", "4",
             "--eval-examples", "2", "--eval-samples", "2", "--device", "cpu", "--precision", "fp32", "--train-examples", "20",
             "--max-steps", "2", "--log-every", "1", "--reward", f"{never}:never"]
    out = tmp_path / "run"
    assert main(["grpo", "--init", str(chat_model), "--out", str(out), *small]) == 1  # the preset filters: learnable
    printed = capsys.readouterr()
    assert printed.err.count("\n") == 1 and "Traceback" not in printed.err
    distinct = len({example.question for example in load_grpo_task("arithmetic[digits=1]").examples("train", 20)})
    assert f"the start leaves nothing to learn: only 0 of {distinct} train prompts" in printed.err
    assert "--prompt-filter none to train anyway" in printed.err and "arithmetic[digits=2]" in printed.err
    assert f"start: 0 of {distinct} train prompts always right, {distinct} never, 0 in between; mean pass rate 0.00" in printed.out
    assert not out.exists()
    assert main(["grpo", "--init", str(chat_model), "--out", str(out), *small, "--prompt-filter", "none"]) == 0
    printed = capsys.readouterr().out
    assert "warning: the start leaves nothing to learn" in printed
    assert "the start left nothing to learn: in all 2 rollouts" in printed  # the closing summary
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [record["zero_spread"] for record in records if "zero_spread" in record] == [1.0, 1.0]


def test_fewer_learnable_prompts_than_a_step_takes_are_refused_leaving_no_run_folder(chat_model, tmp_path):
    config = learnable_config(chat_model, tmp_path / "run", prompts_per_step=16, micro_batch=8, train_examples=20)
    trainer = GRPOTrainer(config, log=lambda *_: None)
    trainer.score = by_operand
    with pytest.raises(GptlabError, match=r"only \d+ of \d+ train prompts .* fewer than prompts_per_step 16"):
        trainer.fit()
    assert not (tmp_path / "run").exists()


def test_the_closing_line_names_a_run_that_had_nothing_to_learn_only_when_every_rollout_was_flat():
    assert nothing_learned(3, 3).startswith("the start left nothing to learn: in all 3 rollouts")
    assert nothing_learned(2, 3) is None and nothing_learned(0, 0) is None


def test_a_run_on_the_learnable_prompts_is_not_called_one_with_nothing_to_learn(chat_model, tmp_path):
    trainer, _ = fit(learnable_config(chat_model, tmp_path / "run", max_steps=2))
    loader = trainer.train_loader
    assert loader.rollout == 2 and loader.flat < loader.rollout  # the kept prompts' groups have reward spread
    assert nothing_learned(loader.flat, loader.rollout) is None


def test_a_resumed_run_keeps_the_probes_pool_without_probing_again(chat_model, tmp_path, monkeypatch):
    config = learnable_config(chat_model, tmp_path / "straight", max_steps=3, checkpoint_every=1, keep_last=3)
    straight, result = fit(config)
    saved = json.loads((tmp_path / "straight/checkpoints/step_000001/trainer_state.json").read_text())
    assert saved["loader"][0]["pool"] == straight.kept and len(straight.kept) < len(straight.candidates)
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    for step in (2, 3):
        shutil.rmtree(tmp_path / f"resumed/checkpoints/step_00000{step}")

    def no_probe(*args, **kwargs):
        raise AssertionError("a resumed run probed the start again")

    monkeypatch.setattr(grpo, "probe_start", no_probe)
    resumed, again = fit(dataclasses.replace(config, out=str(tmp_path / "resumed")))
    assert resumed.pool == straight.pool and resumed.kept == straight.kept
    assert again.losses == result.losses[1:]
    assert (tmp_path / "resumed/completions.jsonl").read_text() == (tmp_path / "straight/completions.jsonl").read_text()


LEARNABLE_DDP_SCRIPT = """
import json, sys
from gptlab.runtime.device import init_runtime, shutdown_runtime
from tests.align.test_grpo_learnable import fit, learnable_config
runtime = init_runtime("cpu")
trainer, result = fit(learnable_config(sys.argv[1], sys.argv[2], probe_prompts=5), runtime=runtime)
print(f"rank {runtime.rank} pool " + json.dumps(trainer.kept))
shutdown_runtime(runtime)
"""


@TWO_RANKS
def test_two_gloo_ranks_probe_their_shares_and_keep_the_pool_of_one_process(chat_model, tmp_path, align_two_ranks):
    """Blocks of 5 prompts split 3 and 2 between the ranks; the gathered rewards choose one pool on both."""
    single, _ = fit(learnable_config(chat_model, tmp_path / "single", probe_prompts=5))
    stdout = ranks_stdout(align_two_ranks, "learnable")
    pools = [json.loads(line.split(" pool ", 1)[1]) for line in stdout.splitlines() if " pool " in line]
    assert len(pools) == 2 and pools[0] == pools[1] == single.kept and single.kept


def test_entropy_metric_is_the_mean_token_entropy_of_the_steps_completion_tokens(chat_model, tmp_path):
    config = grpo_config(chat_model, tmp_path / "run", max_steps=1, micro_batch=4, probe_samples=0)
    trainer = GRPOTrainer(config, log=lambda *_: None)
    trainer.score = parity_reward
    batches, take = [], trainer._step_batches

    def keep_batches():
        step, weights = take()
        batches.extend(step)
        return step, weights

    trainer._step_batches = keep_batches
    trainer.fit()
    model, total, count = load_model(chat_model), 0.0, 0  # the weights the step's forwards saw
    with torch.no_grad():
        for x, y, _ in batches:
            logits, _ = model(x)
            total += token_entropy(logits)[y != IGNORE].sum().item()
            count += (y != IGNORE).sum().item()
    metric = json.loads((tmp_path / "run/metrics.jsonl").read_text().splitlines()[0])["entropy"]
    assert len(batches) == 4 and metric == pytest.approx(total / count, rel=1e-5)
    assert 0 < metric < np.log(trainer.tokenizer.vocab_size)  # a real distribution's entropy, in nats


def test_probe_settings_are_checked_when_the_config_is_built(chat_model, tmp_path):
    with pytest.raises(GptlabError, match="unknown prompt_filter 'easy'"):
        grpo_config(chat_model, tmp_path, prompt_filter="easy")
    with pytest.raises(GptlabError, match="probe_samples must be at least 2"):
        grpo_config(chat_model, tmp_path, prompt_filter="learnable", probe_samples=1)
    assert StartProbe([[1.0, 0.0], [1.0, 1.0], [0.5, 0.5], [0.0, 0.2]]).learnable() == [0, 3]  # rewards that differ


def test_run_grpo_prints_the_start_before_the_held_out_measure(chat_model, tmp_path):
    lines: list[str] = []
    run_grpo(learnable_config(chat_model, tmp_path / "run", reward="verifier", prompt_filter="none"), log=lines.append)
    start = next(i for i, line in enumerate(lines) if line.startswith("start: "))
    assert start < next(i for i, line in enumerate(lines) if line.startswith("before: "))
