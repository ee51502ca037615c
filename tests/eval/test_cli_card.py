"""`gptlab eval MODEL --suite core|chat --judge URL`: the report card printed and saved equals the Python API's;
its output folder is claimed as gptlab's run folders are; wrong input is one line and leaves nothing behind."""

import json
import shutil

import pytest

from gptlab.cli.main import main
from gptlab.eval.card import Card
from gptlab.eval.tasks.core import evaluate_task
from gptlab.model.io import load_model
from gptlab.tokenizer import Tokenizer

from .test_judge import fake_judge, user_text  # noqa: F401  (the fixture, shared)

SCIENCE = [("What do plants need to make food?", ["sunlight", "sand", "noise"], 0),
           ("Which is a liquid at room temperature?", ["iron", "water", "salt"], 1),
           ("What pulls objects toward the Earth?", ["magnetism", "friction", "gravity"], 2),
           ("Which animal lays eggs?", ["chicken", "cow", "dog"], 0),
           ("What is frozen water called?", ["steam", "ice", "rain"], 1),
           ("Which planet do we live on?", ["Mars", "Venus", "Earth"], 2)]
PASSAGES = [("The cat sat on the warm", "mat"), ("She opened the door and stepped into the", "room"),
            ("He drank a glass of cold", "water"), ("The sun rises in the", "east")]


def write_tasks(folder):
    folder.mkdir(parents=True, exist_ok=True)
    science = folder / "science.jsonl"
    science.write_text("".join(json.dumps({"id": f"s{i}", "query": f"Question: {q}\nAnswer:", "choices": c, "gold": g, "question": q})
                               + "\n" for i, (q, c, g) in enumerate(SCIENCE)))
    passages = folder / "passages.jsonl"
    passages.write_text("".join(json.dumps({"id": f"p{i}", "context": c, "continuation": w}) + "\n" for i, (c, w) in enumerate(PASSAGES)))
    return science, passages


def core_args(model, science, passages, *extra):
    return ["eval", str(model), "--suite", "core", "--tasks", "arc_easy,lambada", "--task-data", f"arc_easy={science}",
            "--task-data", f"lambada={passages}", "--shots", "2", "--precision", "fp32", *extra]


def test_eval_core_card_equals_the_python_api_and_is_saved_with_every_question(chat_model, tmp_path, capsys):
    science, passages = write_tasks(tmp_path / "data")
    assert main(core_args(chat_model, science, passages, "--out", str(tmp_path / "card"))) == 0
    printed = capsys.readouterr().out
    card = Card.load(tmp_path / "card" / "eval.json")
    model, tokenizer = load_model(chat_model), Tokenizer.load(chat_model / "tokenizer")
    records = [json.loads(line) for line in science.read_text().splitlines()]
    row, examples = evaluate_task(model, "arc_easy", records, tokenizer.encode_ordinary, shots=2, seed=1234)
    assert card.rows[0] == row and [r.task for r in card.rows] == ["arc_easy", "lambada"]
    assert card.aggregates[0].name == "CORE-style (2 tasks)" and card.text().splitlines()[2] in printed
    saved = [json.loads(line) for line in (tmp_path / "card" / "examples.jsonl").read_text().splitlines()]
    assert len(saved) == len(SCIENCE) + len(PASSAGES)
    assert [s["fewshot_ids"] for s in saved if s["task"] == "arc_easy"] == [e["fewshot_ids"] for e in examples]
    assert card.settings["data"]["arc_easy"]["sha256"] and card.settings["shots"] == 2 and card.settings["seed"] == 1234


def test_eval_of_a_runs_model_saves_its_card_in_the_run_for_its_report(chat_model, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(chat_model, run / "checkpoints" / "step_000010")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 10, "loss": 3.0, "tokens": 100, "elapsed": 1.0}) + "\n")
    science, passages = write_tasks(tmp_path / "data")
    assert main(core_args(run, science, passages, "--limit", "3")) == 0
    assert Card.load(run / "eval-core" / "eval.json").rows[0].n == 3
    assert main(["runs", "report", str(run)]) == 0
    assert "Report card" in (run / "report.html").read_text() and "arc_easy" in (run / "report.html").read_text()
    # the same command again replaces its own card; other settings are refused, --force replaces
    assert main(core_args(run, science, passages, "--limit", "3")) == 0
    assert main(core_args(run, science, passages, "--limit", "2")) == 1
    assert "other settings" in capsys.readouterr().err and Card.load(run / "eval-core" / "eval.json").rows[0].n == 3
    assert main(core_args(run, science, passages, "--limit", "2", "--force")) == 0
    assert Card.load(run / "eval-core" / "eval.json").rows[0].n == 2


def test_eval_refuses_an_out_folder_holding_other_files_and_leaves_it_as_it_was(chat_model, tmp_path, capsys):
    science, passages = write_tasks(tmp_path / "data")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    assert main(core_args(chat_model, science, passages, "--out", str(tmp_path / "mine"))) == 1
    err = capsys.readouterr().err
    assert "notes.txt" in err and "--out" in err and "Traceback" not in err
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("extra, message", [
    (["--tasks", "arc_easy,nope"], "unknown task 'nope'"),
    (["--tasks", "arc_easy", "--task-data", "arc_easy"], "write TASK=SOURCE"),
    (["--tasks", "arc_easy", "--task-data", "arc_easy=missing.jsonl"], "missing.jsonl"),
    (["--tasks", "arc_easy", "--task-data", "lambada=x.jsonl"], "not among --tasks"),
    (["--tasks", "arc_easy", "--shots", "-1"], "shots must be a whole number"),
    (["--tasks", "arc_easy", "--bundle", "nowhere"], "not a DCLM eval bundle"),
])
def test_eval_wrong_input_is_one_line_and_leaves_no_folder(chat_model, tmp_path, capsys, monkeypatch, extra, message):
    monkeypatch.chdir(tmp_path)
    assert main(["eval", str(chat_model), "--suite", "core", *extra, "--out", "card"]) == 1
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "card").exists()


def test_eval_chat_suite_and_judge_need_a_chat_model(tmp_path, capsys, prepared):
    from gptlab.model import GPT, preset
    from gptlab.model.io import save_model

    base = tmp_path / "base"
    tokenizer = Tokenizer.load(prepared / "tokenizer")
    save_model(GPT(preset("gpt2-tiny", vocab_size=tokenizer.vocab_size, block_size=64)), base)
    tokenizer.save(base / "tokenizer")
    assert main(["eval", str(base), "--suite", "chat", "--tasks", "spelling"]) == 1
    assert "use --suite core for a base model" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        main(["eval", str(base), "--alpaca", "a.jsonl"])
    assert stopped.value.code == 2 and "go with --judge URL" in capsys.readouterr().err


def test_eval_chat_suite_card_from_the_command_line(chat_model, tmp_path):
    science, _ = write_tasks(tmp_path / "data")
    assert main(["eval", str(chat_model), "--suite", "chat", "--tasks", "arc_easy,spelling", "--task-data", f"arc_easy={science}",
                 "--limit", "4", "--out", str(tmp_path / "card")]) == 0
    card = Card.load(tmp_path / "card" / "eval.json")
    assert [(row.task, row.n, row.chance) for row in card.rows] == [("arc_easy", 4, pytest.approx(1 / 3)), ("spelling", 4, 0.0)]
    assert card.aggregates[0].name == "ChatCORE-style (2 tasks)"  # nanochat's ChatCORE is over its 6 tasks
    saved = [json.loads(line) for line in (tmp_path / "card" / "examples.jsonl").read_text().splitlines()]
    assert sorted(s["task"] for s in saved) == ["arc_easy"] * 4 + ["spelling"] * 4


def test_eval_judge_card_from_the_command_line_against_a_scripted_judge(chat_model, tmp_path, fake_judge, monkeypatch):  # noqa: F811
    alpaca = tmp_path / "alpaca.jsonl"
    alpaca.write_text("".join(json.dumps({"instruction": q, "output": "ref", "generator": "g", "dataset": "d"}) + "\n"
                              for q in ["Name a colour.", "Count to three."]))
    judge = fake_judge(lambda body, n: "Rating: [[6]]" if "Rating" in user_text(body) else "[[A]]")
    monkeypatch.setenv("GPTLAB_JUDGE_API_KEY", "secret-key")
    assert main(["eval", str(chat_model), "--judge", judge.url, "--judge-model", "j", "--alpaca", str(alpaca),
                 "--out", str(tmp_path / "card")]) == 0
    card = Card.load(tmp_path / "card" / "eval.json")
    assert [(row.task, row.metric, row.score) for row in card.rows] == [("alpaca_eval", "win_rate", 0.5), ("alpaca_eval", "grade_1_10", 6.0)]
    assert all(request["headers"]["Authorization"] == "Bearer secret-key" for request in judge.requests)
    assert "secret-key" not in (tmp_path / "card" / "eval.json").read_text() + (tmp_path / "card" / "examples.jsonl").read_text()
    assert card.settings["judge"]["url"] == judge.url


def test_eval_that_fails_after_claiming_its_folder_leaves_no_folder(chat_model, tmp_path, capsys):
    """Weights that cannot be read fail after --out is claimed (the config is read first): the new folder goes again."""
    science, passages = write_tasks(tmp_path / "data")
    broken = tmp_path / "broken"
    shutil.copytree(chat_model, broken)
    (broken / "model.safetensors").write_bytes(b"not weights")
    assert main(core_args(broken, science, passages, "--out", str(tmp_path / "card"))) == 1
    assert "Traceback" not in capsys.readouterr().err
    assert not (tmp_path / "card").exists()
