"""GSM8K read from a local dataset the tests write (never the network): answers, replies, skipped rows, the verifier."""

import json
from decimal import Decimal

import pytest

from gptlab.chat.data import Mixture, MixtureConfig, iter_conversations
from gptlab.chat.tasks import GSM8K, TASKS, get_task
from gptlab.chat.tasks.gsm8k import final_number, read_numbers
from gptlab.runtime import GptlabError

pytest.importorskip("datasets")

TRAIN = [
    {"question": "Natalia sold clips to 48 friends in April, and half as many in May. How many in all?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips in all.\n#### 72"},
    {"question": "A shop sells 1,000 pens at $2 each. What is the revenue?",
     "answer": "The revenue is 1000*2 = <<1000*2=2000>>2000 dollars.\n#### $2,000"},
    {"question": "This row is broken.", "answer": "There is no final answer line."},
    {"question": "The temperature was 3 and fell by 5. What is it now?", "answer": "3-5 = <<3-5=-2>>-2\n#### -2"},
    {"question": "Another broken row.", "answer": "Work.\n#### seventy"},
    {"question": "Half of 7?", "answer": "7/2 = <<7/2=3.5>>3.5\n#### 3.5"},
]
TEST = [
    {"question": "What is 6 times 7?", "answer": "6*7 = <<6*7=42>>42\n#### 42"},
    {"question": "What is 10 minus 4?", "answer": "10-4 = <<10-4=6>>6\n#### 6"},
]


def write_dataset(folder, train=TRAIN, test=TEST, layout="jsonl", columns=("question", "answer")):
    """A dataset folder with train and test splits, as `datasets` reads it from hf:/path."""
    folder.mkdir()
    for split, rows in (("train", train), ("test", test)):
        rows = [{columns[0]: row["question"], columns[1]: row["answer"]} for row in rows]
        if layout == "jsonl":
            (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        else:
            import datasets

            datasets.Dataset.from_list(rows).to_parquet(str(folder / f"{split}.parquet"))
    return f"hf:{folder}"


@pytest.mark.parametrize("layout", ["jsonl", "parquet"])
def test_gsm8k_reads_answers_and_replies_and_skips_malformed_rows(tmp_path, layout):
    task = GSM8K(source=write_dataset(tmp_path / "gsm8k", layout=layout))
    train = task.examples("train", 4)
    assert [example.answer for example in train] == ["72", "2000", "-2", "3.5"]
    assert train[0].question == TRAIN[0]["question"]
    assert train[0].reply == "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips in all.\nThe answer is 72."
    assert train[1].reply == "The revenue is 1000*2 = 2000 dollars.\nThe answer is 2000."
    assert task.skipped("train") == 2 and task.skipped("test") == 0
    assert task.rows("train").problems[0].endswith("train row 2: the solution has no '#### ANSWER' line")
    assert "no number after #### (found 'seventy')" in task.rows("train").problems[1]
    assert task.test_size == 2 and [example.answer for example in task.examples("test", 2)] == ["42", "6"]
    for example in train:
        assert task.verify(example, example.reply) and task.reward(example, example.reply) == 1.0


def test_gsm8k_is_registered_and_takes_its_options_from_a_mixture_spec(tmp_path):
    source = write_dataset(tmp_path / "gsm8k", columns=("problem", "solution"))
    assert TASKS["gsm8k"] is GSM8K and get_task("gsm8k", source=source) == GSM8K(source=source)
    config = MixtureConfig.from_spec(f"task:gsm8k[n=3,source={source},question=problem,answer=solution]", val_fraction=0.5)
    train = list(iter_conversations(Mixture.load(config, "train")))
    val = list(iter_conversations(Mixture.load(config, "val")))
    assert sorted(conversation[1]["content"].rsplit(" ", 1)[-1] for conversation in train) == ["-2.", "2000.", "72."]
    assert sorted(conversation[0]["content"] for conversation in val) == sorted(row["question"] for row in TEST)


def test_gsm8k_names_a_missing_column_and_too_large_n(tmp_path):
    source = write_dataset(tmp_path / "gsm8k", columns=("problem", "answer"))
    with pytest.raises(GptlabError, match="no 'question' column"):
        GSM8K(source=source).examples("train", 1)
    task = GSM8K(source=source, question="problem")
    with pytest.raises(GptlabError, match="holds 2 examples; ask for at most that, got n=3"):
        task.examples("test", 3)
    with pytest.raises(GptlabError, match="unknown split 'val'"):
        task.examples("val", 1)
    with pytest.raises(GptlabError, match="unknown split 'val'"):
        task.skipped("val")
    with pytest.raises(GptlabError, match="must be an hf: dataset"):
        GSM8K(source="gsm8k.jsonl")


def test_gsm8k_unreachable_hub_fails_in_one_line(monkeypatch, tmp_path):
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # what a machine without network gets, at once
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(GptlabError, match="cannot load dataset 'nobody/gsm8k-nothing'") as raised:
        GSM8K(source="hf:nobody/gsm8k-nothing:main").examples("test", 1)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("response, number", [
    ("The answer is 72.", "72"),
    ("So she earns $1,234 in total.", "1234"),
    ("It costs 3.50 dollars", "3.5"),
    ("The temperature is -2 degrees", "-2"),
    ("12-5 = 7", "7"),
    ("#### 18\nCheck: 18 + 2 = 20", "18"),
    ("first 5 #### 6 then #### $1,000.00 done 9", "1000"),
    ("#### none\nso 4", "4"),
    ("1,2345", "2345"),
    ("no numbers here", None),
])
def test_gsm8k_final_number_reads_numbers_as_people_write_them(response, number):
    assert final_number(response) == (None if number is None else Decimal(number))


def test_gsm8k_verify_compares_numerically(tmp_path):
    task = GSM8K(source=write_dataset(tmp_path / "gsm8k"))
    seventy_two, two_thousand, minus_two, three_and_a_half = task.examples("train", 4)
    assert task.verify(seventy_two, "#### 72.0")
    assert task.verify(two_thousand, "That is $2,000.")
    assert task.verify(minus_two, "It is now -2.")
    assert task.verify(three_and_a_half, "3.50")
    assert not task.verify(seventy_two, "72 + 1 = 73")
    assert not task.verify(seventy_two, "I don't know")
    assert read_numbers("1.2.3 and v2") == [Decimal("1.2"), Decimal("2")]
