"""Conversation sources, their error reports, the seeded mixture and held-out splits (gptlab.chat.data)."""

import json
from collections import Counter
from dataclasses import dataclass

import pytest

from gptlab.chat import data
from gptlab.chat.data import Mixture, MixtureConfig, Part, PartConfig, iter_conversations, parse_mixture, read_conversations
from gptlab.chat.format import Conversation
from gptlab.chat.tool_specs import CALCULATOR
from gptlab.runtime import GptlabError


def chat(question: str, answer: str = "ok") -> list[dict]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def write_jsonl(path, lines: list) -> None:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))


@dataclass(frozen=True)
class FakeTask:
    """The gptlab.chat.tasks interface: examples(split, n) and conversation(example)."""

    test_size = 20

    def examples(self, split: str, n: int) -> list[str]:
        assert split in ("train", "test") and n is not None
        return [f"{split} {i}" for i in range(n)]

    def conversation(self, example: str) -> list[dict]:
        return chat(f"what is {example}?", example)


@pytest.fixture
def fake_task(monkeypatch):
    monkeypatch.setattr(data, "load_task", lambda name, options=(): FakeTask())


# ---------------------------------------------------------------- the spec string


def test_parse_mixture_reads_epochs_and_options():
    parts = parse_mixture("identity.jsonl@2, hf:org/name:cfg[split=test,column=conv,n=10], task:arithmetic[n=500]@0.5")
    assert parts == (
        PartConfig(source="identity.jsonl", epochs=2.0),
        PartConfig(source="hf:org/name:cfg", split="test", column="conv", n=10),
        PartConfig(source="task:arithmetic", n=500, epochs=0.5),
    )


@pytest.mark.parametrize(
    "spec, words",
    [
        ("a.jsonl@two", "epochs after @ must be a number, got 'two'"),
        ("a.jsonl@0", "epochs must be a number above 0, got 0.0"),
        ("a.jsonl[size=3]", "unknown option 'size=3'"),
        ("a.jsonl[n=x]", "n must be a whole number, got 'x'"),
        (" , ", "empty mixture"),
        ("a.jsonl[n=3", "cannot read mixture part"),
    ],
)
def test_parse_mixture_refuses_a_bad_part_naming_it(spec, words):
    with pytest.raises(GptlabError, match=None) as error:
        parse_mixture(spec)
    assert words in str(error.value)


# ---------------------------------------------------------------- reading sources


def test_read_conversations_skips_malformed_lines_and_names_them_by_file_and_line(tmp_path):
    path = tmp_path / "chats.jsonl"
    write_jsonl(
        path,
        [
            {"messages": chat("hi")},
            "{not json",
            {"text": "no messages"},
            {"messages": [{"role": "bot", "content": "x"}, {"role": "assistant", "content": "y"}]},
            {"messages": chat("q", "   ")},
            {"messages": [{"role": "user", "content": "only a question"}]},
            "",
            {"messages": chat("bye")},
        ],
    )
    conversations, report = read_conversations(PartConfig(source=str(path)))
    assert conversations == [chat("hi"), chat("bye")]
    assert (report.read, report.kept, report.skipped) == (7, 2, 5)
    lines = [problem.split(": ", 1)[0] for problem in report.problems]
    assert lines == [f"{path}:{n}" for n in (2, 3, 4, 5, 6)]
    reasons = " | ".join(report.problems)
    for words in ("not valid JSON", 'no "messages" field', "unknown role 'bot'", "empty content", "no assistant message"):
        assert words in reasons
    assert "5 malformed skipped" in report.summary()


def test_read_conversations_shows_the_first_few_problems_and_counts_the_rest(tmp_path):
    path = tmp_path / "bad.jsonl"
    write_jsonl(path, ["nope"] * 12 + [{"messages": chat("fine")}])
    conversations, report = read_conversations(PartConfig(source=str(path)))
    assert len(conversations) == 1 and report.skipped == 12
    assert len(report.problems) == data.SHOWN_PROBLEMS
    assert f"and {12 - data.SHOWN_PROBLEMS} more" in report.summary()


def test_read_conversations_refuse_raises_on_the_first_malformed_line(tmp_path):
    path = tmp_path / "chats.jsonl"
    write_jsonl(path, [{"messages": chat("hi")}, {"messages": [{"role": "user", "content": "q"}]}, "{bad"])
    with pytest.raises(GptlabError) as error:
        read_conversations(PartConfig(source=str(path)), on_error="refuse")
    assert str(error.value).startswith(f"{path}:2: ") and "no assistant message" in str(error.value)


def test_read_conversations_reads_a_folder_and_a_glob_in_name_order_and_stops_at_n(tmp_path):
    (tmp_path / "chats").mkdir()
    write_jsonl(tmp_path / "chats" / "b.jsonl", [{"messages": chat("b1")}, {"messages": chat("b2")}])
    write_jsonl(tmp_path / "chats" / "a.jsonl", [{"messages": chat("a1")}])
    (tmp_path / "chats" / "README.txt").write_text("not conversations")
    expected = [chat("a1"), chat("b1"), chat("b2")]
    assert read_conversations(PartConfig(source=str(tmp_path / "chats")))[0] == expected
    assert read_conversations(PartConfig(source=str(tmp_path / "chats" / "*.jsonl")))[0] == expected
    assert read_conversations(PartConfig(source=str(tmp_path / "chats"), n=2))[0] == expected[:2]


def test_read_conversations_refuses_a_file_that_is_not_jsonl(tmp_path):
    (tmp_path / "chats.txt").write_text("hello")
    with pytest.raises(GptlabError, match="conversations are read from .jsonl files"):
        read_conversations(PartConfig(source=str(tmp_path / "chats.txt")))


@pytest.mark.parametrize("layout", ["save_to_disk", "parquet"])
def test_read_conversations_reads_a_local_dataset_and_names_bad_rows_by_index(tmp_path, layout):
    datasets = pytest.importorskip("datasets")
    rows = [
        {"messages": chat("one")},
        {"messages": [{"role": "user", "content": "two"}, {"role": "assistant", "content": ""}]},
        {"messages": chat("three")},
    ]
    dataset = datasets.Dataset.from_list(rows)
    folder = tmp_path / "dataset"
    if layout == "save_to_disk":
        dataset.save_to_disk(str(folder))
    else:
        folder.mkdir()
        dataset.to_parquet(str(folder / "train.parquet"))
    conversations, report = read_conversations(PartConfig(source=f"hf:{folder}"))
    assert conversations == [chat("one"), chat("three")]
    assert report.skipped == 1 and report.problems[0].startswith(f"hf:{folder} row 1: ")
    with pytest.raises(GptlabError, match="no 'conversations' column"):
        read_conversations(PartConfig(source=f"hf:{folder}", column="conversations"))


def test_read_task_makes_n_train_examples_and_holds_out_its_test_split(fake_task):
    config = MixtureConfig.from_spec("task:fake[n=8]", val_fraction=0.25)
    train, val = Mixture.load(config, "train"), Mixture.load(config, "val")
    assert sorted(c[1]["content"] for c in iter_conversations(train)) == sorted(f"train {i}" for i in range(8))
    assert sorted(c[1]["content"] for c in iter_conversations(val)) == ["test 0", "test 1"]


def test_read_task_without_n_is_refused_with_the_fix(fake_task):
    with pytest.raises(GptlabError, match=r"task:fake\[n=5000\]"):
        Mixture.load(MixtureConfig.from_spec("task:fake"))


def test_read_task_builds_a_real_built_in_task_when_present():
    pytest.importorskip("gptlab.chat.tasks")
    mixture = Mixture.load(MixtureConfig.from_spec("task:arithmetic[n=30]", val_fraction=0.1))
    assert len(mixture) == 30 and mixture.reports[0].val == 3


# ---------------------------------------------------------------- conversations that offer tools

CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2 + 3"}'}}]}  # fmt: skip
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "5"}


def test_read_conversations_keeps_a_lines_tools_and_drops_unknown_message_fields(tmp_path):
    path = tmp_path / "chats.jsonl"
    calling = {"role": "assistant", "content": "Let me add.", "tool_calls": CALL["tool_calls"], "weight": 0}
    answer = {"role": "assistant", "content": "5"}
    write_jsonl(path, [{"messages": [*chat("2 + 3?")[:1], calling, RESULT, answer], "tools": [CALCULATOR]}, {"messages": chat("plain")},
                       {"messages": chat("bad tools"), "tools": "calculator"}])  # fmt: skip
    conversations, report = read_conversations(PartConfig(source=str(path)))
    assert [c.tools for c in conversations] == [(CALCULATOR,), ()]
    assert conversations[0] == [*chat("2 + 3?")[:1], {key: calling[key] for key in ("role", "content", "tool_calls")}, RESULT, answer]
    assert report.skipped == 1 and '"tools" must be a list of declarations' in report.problems[0]


def test_parse_conversation_keeps_the_tools_a_conversation_carries():
    parsed = data.parse_conversation(Conversation(chat("hi"), tools=[{"type": "function"}]))
    assert parsed == chat("hi") and parsed.tools == ({"type": "function"},)
    assert data.parse_conversation(chat("hi"), [{"type": "function"}]).tools == ({"type": "function"},)


def test_read_conversations_keeps_tool_calls_and_tool_results(tmp_path):
    path = tmp_path / "chats.jsonl"
    messages = [chat("2 + 3?")[0], CALL, RESULT, {"role": "assistant", "content": "2 + 3 = 5"}]
    write_jsonl(path, [{"messages": messages, "tools": [CALCULATOR]}])
    conversations, _ = read_conversations(PartConfig(source=str(path)), on_error="refuse")
    assert conversations == [messages] and conversations[0].tools == (CALCULATOR,)


@pytest.mark.parametrize("spec", ["task:word_problems[n=2000]", "task:arithmetic[n=50,digits=4,min_digits=3,ops=+*,tools=1]",
                                  "task:compute[n=50]"])  # fmt: skip
def test_mixture_load_keeps_a_tool_tasks_conversations_and_their_tools(spec):
    from gptlab.chat.tasks import get_task

    mixture = Mixture.load(MixtureConfig.from_spec(spec, val_fraction=0.01, on_error="refuse"))
    part = parse_mixture(spec)[0]
    task = get_task(part.source.removeprefix("task:"), **dict(part.task_options))
    expected = [task.conversation(example) for example in task.examples("train", part.n)]
    assert mixture.parts[0].conversations == expected
    assert all(conversation.tools == task.toolbox for conversation in mixture.parts[0].conversations)
    assert mixture.parts[0].conversations[0][2]["role"] == "tool"


def test_mixture_load_reads_a_tool_task_without_tools_as_plain_conversations():
    mixture = Mixture.load(MixtureConfig.from_spec("task:word_problems[n=40,tools=0]", on_error="refuse"))
    assert len(mixture) == 40 and all(not c.tools and len(c) == 2 for c in mixture.parts[0].conversations)


# ---------------------------------------------------------------- the mixture


def test_mixture_epochs_repeat_whole_parts_and_draw_a_seeded_subset_for_the_fraction():
    a = [chat(f"a{i}") for i in range(10)]
    b = [chat(f"b{i}") for i in range(4)]
    mixture = Mixture([Part("a", a, 0.5), Part("b", b, 2.0)], seed=3)
    assert len(mixture) == 5 + 8
    counts = Counter(c[0]["content"] for c in iter_conversations(mixture, 0))
    assert {q: counts[q] for q in counts if q.startswith("b")} == {f"b{i}": 2 for i in range(4)}
    half = {q for q in counts if q.startswith("a")}
    assert len(half) == 5 and all(counts[q] == 1 for q in half)
    again = Mixture([Part("a", a, 0.5), Part("b", b, 2.0)], seed=3)
    assert (again.order(0) == mixture.order(0)).all() and (again.order(1) == mixture.order(1)).all()
    assert (mixture.order(0) != mixture.order(1)).any()  # reshuffled (and redrawn) each epoch
    other = Mixture([Part("a", a, 0.5), Part("b", b, 2.0)], seed=4)
    assert (other.order(0) != mixture.order(0)).any()


def test_mixture_val_split_is_disjoint_from_train_and_the_same_for_any_seed(tmp_path):
    path = tmp_path / "chats.jsonl"
    write_jsonl(path, [{"messages": chat(f"q{i}")} for i in range(40)])
    held = None
    for seed in (0, 1):
        config = MixtureConfig.from_spec(f"{path}@2", seed=seed, val_fraction=0.1)
        train = {c[0]["content"] for c in iter_conversations(Mixture.load(config, "train"))}
        val = [c[0]["content"] for c in iter_conversations(Mixture.load(config, "val"))]
        assert len(val) == 4 and len(train) == 36 and not train & set(val)
        held = held or set(val)
        assert set(val) == held
    assert len(Mixture.load(config, "train")) == 72  # epochs apply to train only


def test_mixture_load_refuses_a_val_split_without_a_fraction(tmp_path):
    path = tmp_path / "chats.jsonl"
    write_jsonl(path, [{"messages": chat("q")}])
    with pytest.raises(GptlabError, match="set val_fraction"):
        Mixture.load(MixtureConfig.from_spec(str(path)), "val")


def test_mixture_refuses_a_source_with_no_valid_conversations(tmp_path):
    path = tmp_path / "chats.jsonl"
    write_jsonl(path, ["{bad"])
    with pytest.raises(GptlabError, match="holds no conversations"):
        Mixture.load(MixtureConfig.from_spec(str(path)))


def test_mixture_with_no_valid_rows_names_the_first_reasons_by_file_and_line(tmp_path):
    path = tmp_path / "chats.jsonl"
    roles = [{"messages": [{"role": "bot", "content": f"hi {i}"}, {"role": "assistant", "content": "ok"}]} for i in range(5)]
    write_jsonl(path, roles)
    with pytest.raises(GptlabError) as raised:
        Mixture.load(MixtureConfig.from_spec(str(path)))
    message = str(raised.value)
    assert message.startswith("the mixture holds no conversations: no valid row in") and "\n" not in message
    assert [f"{path}:{line}:" in message for line in range(1, 6)] == [True, True, True, False, False]  # the first 3
    assert "'bot'" in message and "and 2 more" in message


@pytest.mark.parametrize("content, reason", [
    (b"", "no rows (an empty file?)"),
    ('{"messages": []}\n'.encode("utf-16"), "UTF-16 text (NUL bytes); save the file as UTF-8"),
    (b'{"messages": [{"role": "user", "content": "caf\xe9"}]}\n', "not UTF-8 text; save the file as UTF-8"),
])
def test_mixture_with_no_valid_rows_says_why_for_empty_and_wrongly_encoded_files(tmp_path, content, reason):
    path = tmp_path / "chats.jsonl"
    path.write_bytes(content)
    with pytest.raises(GptlabError, match="the mixture holds no conversations") as raised:
        Mixture.load(MixtureConfig.from_spec(str(path)))
    assert reason in str(raised.value) and "\n" not in str(raised.value)


def test_a_files_held_out_split_follows_its_content_not_how_its_path_is_spelled(tmp_path, monkeypatch):
    """world/sft.jsonl, ./world/sft.jsonl, its absolute path and a moved copy hold out the same conversations:
    the ceil(0.1 x 40) = 4 whose content hashes lowest (by hand below)."""
    import hashlib
    import shutil

    monkeypatch.chdir(tmp_path)
    (tmp_path / "world").mkdir()
    rows = [{"messages": chat(f"q{i}", f"a{i}")} for i in range(40)]
    write_jsonl(tmp_path / "world" / "sft.jsonl", rows)
    (tmp_path / "moved").mkdir()
    shutil.copy(tmp_path / "world" / "sft.jsonl", tmp_path / "moved" / "renamed.jsonl")

    def val(spec: str) -> set[str]:
        mixture = Mixture.load(MixtureConfig.from_spec(spec, val_fraction=0.1), "val")
        return {c[0]["content"] for c in iter_conversations(mixture)}

    digest = {row["messages"][0]["content"]: hashlib.sha256(json.dumps(row["messages"], sort_keys=True).encode()).digest()
              for row in rows}
    expected = set(sorted(digest, key=digest.get)[:4])
    for spec in ("world/sft.jsonl", "./world/sft.jsonl", str(tmp_path / "world" / "sft.jsonl"), "world/../world/sft.jsonl",
                 "moved/renamed.jsonl"):
        assert val(spec) == expected, spec
