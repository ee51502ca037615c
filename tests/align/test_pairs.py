"""Preference pairs: every TRL format reads the same, task pairs are right against wrong, bad rows are named, batches resume."""

import json

import pytest
import torch

from gptlab.align.preference.pairs import PairLoader, PairLoaderConfig, load_pairs, parse_pair, read_pairs, render_pairs
from gptlab.chat import ChatFormat
from gptlab.chat.data import MixtureConfig, PartConfig
from gptlab.chat.tasks import get_task
from gptlab.data.match import find_model_tokenizer
from gptlab.runtime import GptlabError

PAIRS = [("What is 2 + 2?", "2 + 2 = 4", "2 + 2 = 5"), ("Spell the word \"ale\".", "a-l-e", "a-e-l")]


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


FORMATS = {
    "standard": lambda q, c, r: {"prompt": q, "chosen": c, "rejected": r},
    "conversational": lambda q, c, r: {"prompt": [user(q)], "chosen": [assistant(c)], "rejected": [assistant(r)]},
    "messages": lambda q, c, r: {"messages": [user(q)], "chosen": [assistant(c)], "rejected": [assistant(r)]},
    "implicit": lambda q, c, r: {"chosen": [user(q), assistant(c)], "rejected": [user(q), assistant(r)]},
}


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


@pytest.mark.parametrize("name", FORMATS)
def test_pairs_read_the_same_in_every_trl_format(tmp_path, name):
    path = write_jsonl(tmp_path / f"{name}.jsonl", [FORMATS[name](*pair) for pair in PAIRS])
    pairs, report = read_pairs(PartConfig(source=str(path)))
    assert report.kept == 2 and report.skipped == 0
    assert [(p.prompt, p.chosen, p.rejected) for p in pairs] == [([user(q)], c, r) for q, c, r in PAIRS]


def test_pairs_implicit_prompt_is_the_shared_leading_messages():
    system = {"role": "system", "content": "Be brief."}
    pair = parse_pair({"chosen": [system, user("hi"), assistant("hello"), user("2+2?"), assistant("4")],
                       "rejected": [system, user("hi"), assistant("hello"), user("2+2?"), assistant("5")]})
    assert pair.prompt == [system, user("hi"), assistant("hello"), user("2+2?")] and (pair.chosen, pair.rejected) == ("4", "5")


def test_pairs_read_a_local_hugging_face_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list([FORMATS["standard"](*pair) for pair in PAIRS]).save_to_disk(str(tmp_path / "prefs"))
    pairs, _ = read_pairs(PartConfig(source=f"hf:{tmp_path / 'prefs'}", n=1))
    assert [(p.prompt, p.chosen, p.rejected) for p in pairs] == [([user(PAIRS[0][0])], PAIRS[0][1], PAIRS[0][2])]


@pytest.mark.parametrize("spec", ["task:arithmetic[n=200]", "task:spelling[n=200]", "task:sorting[n=100]",
                                  "task:sorting[n=50,items=numbers]"])
def test_task_pairs_choose_a_verified_reply_over_a_wrong_one(spec):
    part = MixtureConfig.from_spec(spec).parts[0]
    pairs, report = read_pairs(part, "train", part.n)
    task = get_task(part.source.removeprefix("task:"), **dict(part.task_options))
    assert report.kept == part.n
    for example, pair in zip(task.examples("train", part.n), pairs):
        assert pair.prompt == [user(example.question)]
        assert task.verify(example, pair.chosen) and not task.verify(example, pair.rejected)
    assert read_pairs(part, "train", part.n)[0] == pairs  # the same wrong replies every time


def test_malformed_pairs_are_named_and_skipped_or_refused(tmp_path):
    lines = [json.dumps(FORMATS["standard"](*PAIRS[0])), "{not json", json.dumps({"prompt": "hi", "chosen": "a"}),
             json.dumps({"prompt": "hi", "chosen": "same", "rejected": "same"}),
             json.dumps({"prompt": [{"role": "wizard", "content": "hi"}], "chosen": "a", "rejected": "b"})]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    pairs, report = read_pairs(PartConfig(source=str(path)))
    assert len(pairs) == 1 and report.skipped == 4
    summary = report.summary()
    for number, reason in [(2, "not valid JSON"), (3, 'no "rejected"'), (4, "the same reply"), (5, "unknown role")]:
        assert f"bad.jsonl:{number}: " in summary and reason in summary
    with pytest.raises(GptlabError, match=r"bad.jsonl:2: not valid JSON"):
        read_pairs(PartConfig(source=str(path)), on_error="refuse")


@pytest.fixture(scope="module")
def chat(chat_model):
    return ChatFormat(find_model_tokenizer(chat_model))


def test_pair_batches_hold_chosen_rows_then_rejected_with_only_the_reply_as_targets(chat, tmp_path):
    splits = load_pairs(MixtureConfig.from_spec("task:arithmetic[n=20,digits=1]"))
    rendered = render_pairs(chat, splits["train"], 64)
    loader = PairLoader(splits["train"], rendered, chat, config=PairLoaderConfig(batch_size=4, seq_len=64))
    x, y, kwargs = loader.next_batch()
    assert x.shape == y.shape and x.shape[0] == 8 and kwargs["pair_index"].shape == (4,)
    pairs = splits["train"].pairs
    for row, index in enumerate(kwargs["pair_index"].tolist()):
        for offset, reply in ((0, pairs[index].chosen), (4, pairs[index].rejected)):
            targets = y[row + offset][y[row + offset] != -100].tolist()
            assert targets == chat.tokenizer.encode_ordinary(reply) + [chat.end]


def test_pair_loader_resumes_exactly_and_ranks_share_no_pair(chat):
    splits = load_pairs(MixtureConfig.from_spec("task:arithmetic[n=30,digits=1]@1.5", seed=3))
    rendered = render_pairs(chat, splits["train"], 64)

    def loader(rank=0, world_size=1):
        return PairLoader(splits["train"], rendered, chat, config=PairLoaderConfig(batch_size=4, seq_len=64),
                          rank=rank, world_size=world_size)

    straight = loader()
    batches = [straight.next_batch() for _ in range(15)]  # past the end of an epoch (45 pairs)
    resumed = loader()
    replay = loader()
    for _ in range(7):
        replay.next_batch()
    resumed.load_state_dict(json.loads(json.dumps(replay.state_dict())))
    for x, y, kwargs in batches[7:]:
        rx, ry, rkwargs = resumed.next_batch()
        assert torch.equal(rx, x) and torch.equal(ry, y) and torch.equal(rkwargs["pair_index"], kwargs["pair_index"])
    once = load_pairs(MixtureConfig.from_spec("task:arithmetic[n=30,digits=1]"))["train"]
    rendered = render_pairs(chat, once, 64)
    served = [[i for _, _, kwargs in PairLoader(once, rendered, chat, config=PairLoaderConfig(batch_size=4, seq_len=64, cycle=False),
                                                  rank=rank, world_size=2) for i in kwargs["pair_index"].tolist()]
              for rank in (0, 1)]
    assert not set(served[0]) & set(served[1]) and sorted(served[0] + served[1]) == list(range(30))


def test_pairs_with_no_valid_row_are_refused_naming_the_first_reasons(tmp_path):
    path = tmp_path / "prefs.jsonl"
    rows = [{"prompt": "q", "chosen": "a"}, {"prompt": "q", "chosen": "a", "rejected": "a"},
            {"prompt": "q", "chosen": "", "rejected": "b"}, {"prompt": "q", "chosen": "a"}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(GptlabError) as raised:
        load_pairs(MixtureConfig.from_spec(str(path), val_fraction=0.25))
    message = str(raised.value)
    assert message.startswith("the mixture holds no pairs: no valid row in") and "conversations" not in message
    assert f'{path}:1: no "rejected" field' in message and f"{path}:2: chosen and rejected are the same reply" in message
    assert f"{path}:3: chosen is empty" in message and f"{path}:4:" not in message and "and 1 more" in message
