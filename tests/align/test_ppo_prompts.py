"""PPO's prompts from files, datasets and tasks (gptlab.align.rl.prompts): every source form read into the expected
conversations, held out by val_fraction or a test split, too-long prompts dropped and counted, a run against a
reward model whose held-out reward matches an independent greedy decode, and mistakes refused in one line."""

import dataclasses
import json
import math
import sys

import pytest
import torch

from gptlab.align.rl.ppo import PPOTrainer, run_ppo
from gptlab.align.rl.prompts import Prompt, load_prompts, reward_change
from gptlab.cli.main import main
from gptlab.model.io import load_model

from .test_ppo import ppo_config

USER = [{"role": "user", "content": "Name a colour."}]
SYSTEM_USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a fruit."}]


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def prompts_of(spec, **options) -> list[tuple]:
    return [(list(p.messages), p.reply) for p in load_prompts(spec, **options).train]


def test_prompts_read_text_messages_conversations_and_pairs_from_jsonl(tmp_path):
    rows = [
        {"prompt": "Name a colour."},
        {"prompt": SYSTEM_USER},
        {"messages": [*USER, {"role": "assistant", "content": "Red."}, {"role": "user", "content": "Another?"},
                      {"role": "assistant", "content": "Blue."}]},
        {"prompt": "Name a colour.", "chosen": "Red.", "rejected": "Dog."},
        {"chosen": [*SYSTEM_USER, {"role": "assistant", "content": "Pear."}],
         "rejected": [*SYSTEM_USER, {"role": "assistant", "content": "Car."}]},
    ]
    conversation = [*USER, {"role": "assistant", "content": "Red."}, {"role": "user", "content": "Another?"}]
    assert prompts_of(write_jsonl(tmp_path / "p.jsonl", rows)) == [
        (USER, ""), (SYSTEM_USER, ""), (conversation, "Blue."), (USER, "Red."), (SYSTEM_USER, "Pear.")]


def test_prompts_read_a_local_dataset_in_ultrafeedbacks_shape_by_split(tmp_path):
    datasets = pytest.importorskip("datasets")

    def row(question, good, bad):
        user = {"role": "user", "content": question}
        chosen, rejected = [user, {"role": "assistant", "content": good}], [user, {"role": "assistant", "content": bad}]
        return {"prompt": question, "prompt_id": str(hash(question)), "chosen": chosen, "rejected": rejected,
                "messages": chosen, "score_chosen": 8.0, "score_rejected": 3.0}

    splits = {"train_prefs": [row("Say hi.", "Hi!", "No."), row("Count to 3.", "1 2 3", "3 2 1")],
              "test_prefs": [row("Say bye.", "Bye!", "Hi.")]}
    datasets.DatasetDict({name: datasets.Dataset.from_list(rows) for name, rows in splits.items()}).save_to_disk(str(tmp_path / "uf"))
    read = load_prompts(f"hf:{tmp_path / 'uf'}[split=train_prefs]", heldout=f"hf:{tmp_path / 'uf'}[split=test_prefs]")
    assert [(list(p.messages), p.reply) for p in read.train] == [
        ([{"role": "user", "content": "Say hi."}], "Hi!"), ([{"role": "user", "content": "Count to 3."}], "1 2 3")]
    assert [p.question for p in read.val] == ["Say bye."]


def test_task_prompts_carry_their_example_and_hold_out_the_test_split():
    from gptlab.chat.tasks import get_task

    read = load_prompts("task:arithmetic[n=5,digits=1]", val_fraction=0.4)
    task = get_task("arithmetic", digits=1)
    assert [p.example for p in read.train] == task.examples("train", 5)
    assert [p.example for p in read.val] == task.examples("test", 2)  # ceil(0.4 x 5) of the test split
    assert [list(p.messages) for p in read.train] == [[{"role": "user", "content": e.question}] for e in task.examples("train", 5)]
    assert read.one_task() is not None


def test_val_fraction_holds_out_the_same_rows_whatever_the_seed_and_none_twice(tmp_path):
    spec = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"Question {n}?"} for n in range(20)])
    read = load_prompts(spec, val_fraction=0.2)
    assert len(read.val) == 4 and len(read.train) == 16
    assert {p.question for p in read.val}.isdisjoint(p.question for p in read.train)
    assert [p.question for p in load_prompts(spec, val_fraction=0.2).val] == [p.question for p in read.val]


def test_reward_change_is_the_mean_difference_with_its_paired_t_interval():
    from scipy import stats

    before, after = [0.1, 0.5, 0.2, 0.9], [0.3, 0.4, 0.6, 1.0]
    differences = [b - a for a, b in zip(before, after)]
    low, high = stats.t.interval(0.95, len(differences) - 1, loc=sum(differences) / 4, scale=stats.sem(differences))
    assert reward_change(before, after) == (f"change in held-out reward on the same 4 prompts: {sum(differences) / 4:+.4f} "
                                            f"(95% CI {low:+.4f} to {high:+.4f}, paired t interval)")


def test_prompts_too_long_for_the_context_are_dropped_and_counted(chat_model, tmp_path):
    rows = [{"prompt": "Hi?"}] * 6 + [{"prompt": "word " * 200}] * 2
    lines = []
    config = ppo_config(chat_model, tmp_path / "run", task="", prompts=write_jsonl(tmp_path / "p.jsonl", rows),
                        reward=f"{tmp_path / 'r.py'}:length", val_fraction=0.0)
    (tmp_path / "r.py").write_text("def length(prompts, completions, **columns):\n    return [len(c) / 10 for c in completions]\n")
    trainer = PPOTrainer(config, log=lines.append)
    assert len(trainer.pool) == 6 and all(isinstance(p, Prompt) for p in trainer.pool)
    assert any("2 of 8 train prompts are longer than" in line for line in lines), lines


def greedy_reference(model, chat, prompts, max_new_tokens) -> list[str]:
    """Greedy replies by the plain generate loop, independent of the rollout engine the trainer measures with."""
    from gptlab.infer.generate import SamplingConfig, generate

    config = SamplingConfig(max_new_tokens=max_new_tokens, temperature=0, stop_tokens=chat.stop_tokens, vocab_size=chat.tokenizer.vocab_size)
    replies = []
    for prompt in prompts:
        (ids,) = generate(model, [chat.prompt(list(prompt.messages))], config)
        replies.append(chat.tokenizer.decode([t for t in ids if t not in chat.stop_tokens]))
    return replies


def test_ppo_trains_on_file_prompts_against_a_reward_model_and_measures_held_out_reward(chat_model, tmp_path):
    from gptlab.align.rl.rm_reward import load_reward_model, write_reward_model
    from gptlab.align.rl.scalar import ScalarModel
    from gptlab.chat import ChatFormat
    from gptlab.tokenizer import Tokenizer

    torch.manual_seed(3)
    rm = write_reward_model(tmp_path / "rm", ScalarModel(load_model(chat_model)), Tokenizer.load(chat_model / "tokenizer"),
                            mean=0.0, std=1.0, trained_on="test", heldout_accuracy=None)
    rows = [{"prompt": f"What is {n} plus {n}?"} for n in range(12)]
    rows += [{"messages": [*SYSTEM_USER, {"role": "assistant", "content": "Fig."}, {"role": "user", "content": f"And {n}?"}]} for n in range(8)]
    config = ppo_config(chat_model, tmp_path / "run", task="", prompts=write_jsonl(tmp_path / "p.jsonl", rows), reward=f"rm:{rm}",
                        val_fraction=0.2, max_steps=2)
    lines = []
    result = run_ppo(config, log=lines.append)
    assert result.status == "finished" and result.before["heldout_n"] == 4 == result.after["heldout_n"]
    assert any(line.startswith("before: held-out reward") for line in lines)
    assert any(line.startswith("change in held-out reward on the same 4 prompts") for line in lines), lines
    scorer = load_reward_model(rm)
    held = load_prompts(config.prompts, val_fraction=0.2).val
    chat = ChatFormat(Tokenizer.load(chat_model / "tokenizer"))
    for model, measured in ((load_model(chat_model), result.before), (load_model(result.train.checkpoint), result.after)):
        replies = greedy_reference(model.eval(), chat, held, config.max_new_tokens)
        expected = scorer.score([p.for_rewards for p in held], replies)
        assert measured["heldout_reward"] == pytest.approx(sum(expected) / len(expected), rel=1e-4, abs=1e-5)
    for line in (tmp_path / "run/completions.jsonl").read_text().splitlines():  # each rollout's first replies, as scored
        record = json.loads(line)
        assert math.isfinite(record["reward"]) and isinstance(record["question"], str)
    saved = json.loads((tmp_path / "run/train_config.json").read_text())  # the real settings, not GRPO's stand-ins
    assert (saved["prompts"], saved["task"], saved["reward"]) == (config.prompts, "", config.reward)


def test_a_user_reward_sees_messages_and_no_answer_for_file_prompts(chat_model, tmp_path):
    (tmp_path / "r.py").write_text(
        "SEEN = []\n"
        "def look(prompts, completions, answer, example, **columns):\n"
        "    SEEN.append((prompts, answer, example))\n"
        "    return [float(len(c)) for c in completions]\n")
    rows = [{"prompt": SYSTEM_USER}, {"prompt": "Name a colour."}] * 4
    config = ppo_config(chat_model, tmp_path / "run", task="", prompts=write_jsonl(tmp_path / "p.jsonl", rows),
                        reward=f"{tmp_path / 'r.py'}:look", val_fraction=0.0, max_steps=1)
    trainer = PPOTrainer(config, log=lambda *_: None)
    trainer.fit()
    (module,) = [m for m in sys.modules.values() if getattr(m, "__file__", None) == str((tmp_path / "r.py").resolve())]
    prompts, answers, examples = module.SEEN[-1]
    assert set(answers) == {None} and set(examples) == {None}
    assert {json.dumps(p) for p in prompts} == {json.dumps(SYSTEM_USER), json.dumps("Name a colour.")}


@pytest.mark.parametrize("case", ["missing file", "no prompt in any row", "verifier", "task and prompts", "epochs"])
def test_wrong_prompt_inputs_are_refused_in_one_line_leaving_nothing(chat_model, tmp_path, capsys, case):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"question": "Hi?"}, {"text": "no"}])
    good = write_jsonl(tmp_path / "good.jsonl", [{"prompt": "Hi?"}] * 8)
    args, message = {
        "missing file": (["--prompts", str(tmp_path / "nope.jsonl")], "nope.jsonl"),
        "no prompt in any row": (["--prompts", bad], f'{bad}:1: no "prompt" or "messages" field'),
        "verifier": (["--prompts", good, "--reward", "verifier"], "reward verifier checks a task's answers"),
        "task and prompts": (["--prompts", good, "--task", "spelling"], "give the prompts once"),
        "epochs": (["--prompts", f"{good}@2"], "prompts take no @EPOCHS"),
    }[case]
    out = tmp_path / "refused"
    small = ["--rollout-prompts", "4", "--minibatches", "1", "--micro-batch", "4", "--max-new-tokens", "4", "--device", "cpu"]
    assert main(["ppo", "--init", str(chat_model), "--out", str(out), *small, *args]) != 0
    printed = capsys.readouterr()
    assert message in printed.err and "Traceback" not in printed.err and len(printed.err.strip().splitlines()) == 1, printed.err
    assert not out.exists()


def test_the_default_task_still_applies_without_prompts(chat_model, tmp_path):
    trainer = PPOTrainer(dataclasses.replace(ppo_config(chat_model, tmp_path / "run"), task=""), log=lambda *_: None)
    assert trainer.config.task == "arithmetic[digits=1]" and trainer.task.name == "arithmetic" and trainer.prompt_splits is None
