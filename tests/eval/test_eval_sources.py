"""Evaluation data loaders on fixtures the tests write (never the network): native rows against lm-evaluation-harness's own
prompt templates, the shared shape, JSONL and parquet, hf: folders, pinned revisions, MMLU's CSV folder, DCLM's bundle."""

import ast
import csv
import importlib.util
import json
import socket
import zipfile
from pathlib import Path

import pytest
import yaml

from gptlab.data.sources import HuggingFaceSource, SourceOptions
from gptlab.eval.tasks import bundle as bundle_module
from gptlab.eval.tasks.native import DATASETS
from gptlab.eval.tasks.sources import load_task_records, read_bundle
from gptlab.runtime import GptlabError

datasets = pytest.importorskip("datasets")
lm_eval = pytest.importorskip("lm_eval")
from lm_eval.utils import apply_template  # noqa: E402

LM_EVAL_TASKS = Path(lm_eval.__file__).parent / "tasks"

ARC_ROWS = [
    {"id": "Mercury_1", "question": "Which gas do plants take in?", "choices": {"text": ["oxygen", "carbon dioxide", "helium"], "label": ["A", "B", "C"]},
     "answerKey": "B"},
    {"id": "NYSED_2", "question": "What melts ice fastest?", "choices": {"text": ["salt", "sand", "sawdust", "stone"], "label": ["1", "2", "3", "4"]},
     "answerKey": "1"},
]
NATIVE_ROWS = {
    "arc_easy": ARC_ROWS,
    "arc_challenge": ARC_ROWS,
    "piqa": [{"goal": "To open a jar,", "sol1": "twist the lid.", "sol2": "paint the lid.", "label": 0},
             {"goal": "Dry wet shoes", "sol1": "in the freezer", "sol2": "with newspaper inside", "label": 1}],
    "boolq": [{"passage": "Cats are mammals.", "question": "is a cat a mammal", "label": 1, "idx": 0},
              {"passage": "The sun is a star.", "question": "is the sun a planet", "label": 0, "idx": 1}],
    "openbookqa": [{"id": "7-980", "question_stem": "The sun is responsible for", "answerKey": "D",
                    "choices": {"text": ["puppies", "rain", "snow", "plants sprouting"], "label": ["A", "B", "C", "D"]}}],
    "commonsense_qa": [{"id": "075e", "question": "Where do you keep milk? ", "answerKey": "C",
                        "choices": {"text": ["shelf", "oven", "fridge", "drawer", "car"], "label": ["A", "B", "C", "D", "E"]}}],
    "mmlu": [{"question": " What is 2 + 2?", "subject": "elementary_mathematics", "choices": ["3", "4", "5", "6"], "answer": 1}],
    "hellaswag": [{"ind": 24, "activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he",
                   "endings": ["is using wrap to wrap a pair of skis.", "starts pulling up roofing [title] on a roof.", "is ripping level tiles off.",
                               "is holding a rubik's cube."], "label": "3"}],
    "copa": [{"premise": "My body cast a shadow over the grass.", "choice1": "The sun was rising.", "choice2": "The grass was cut.",
              "question": "cause", "label": 0, "idx": 0},
             {"premise": "The woman tolerated her friend's difficult behavior.", "choice1": "The woman knew her friend was going through a hard time.",
              "choice2": "The woman felt that her friend took advantage of her kindness.", "question": "effect", "label": 1, "idx": 1}],
    "winogrande": [{"sentence": "The trophy doesn't fit into the brown suitcase because _ is too large.", "option1": "the trophy",
                    "option2": "the suitcase", "answer": "1"}],
    "lambada": [{"text": "He threw the ball and the dog ran to fetch the ball"}],
}
YAMLS = {"arc_easy": "arc/arc_easy.yaml", "arc_challenge": "arc/arc_easy.yaml", "piqa": "piqa/piqa.yaml", "boolq": "super_glue/boolq/default.yaml",
         "openbookqa": "openbookqa/openbookqa.yaml", "commonsense_qa": "commonsense_qa/default.yaml", "mmlu": "mmlu/default/_default_template_yaml",
         "lambada": "lambada/lambada_openai.yaml"}


# ---------------------------------------------------------------- lm-evaluation-harness as the reference


class _TaskYaml(yaml.SafeLoader):
    """lm-eval's task YAMLs, with their `!function` tags kept as text."""


_TaskYaml.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))


def lm_eval_module(relative: str):
    """One of lm-eval's task utility files, loaded by path (importing lm_eval.tasks would index every task)."""
    spec = importlib.util.spec_from_file_location(relative.replace("/", "_"), LM_EVAL_TASKS / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lm_eval_field(template, doc):
    """A doc_to_* entry resolved as lm-eval 0.4 does: a list as is, a column by name, else a Jinja template."""
    if isinstance(template, list) or template in doc:
        return template if isinstance(template, list) else doc[template]
    text = apply_template(template, doc)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def lm_eval_reference(task: str, doc: dict) -> dict:
    """What lm-eval asks for a native row: (query, choices, gold), or winogrande's contexts, or lambada's split."""
    if task == "hellaswag":
        processed = lm_eval_module("hellaswag/utils.py").process_docs(datasets.Dataset.from_list([doc]))[0]
        return {"query": processed["query"], "choices": processed["choices"], "gold": processed["gold"]}
    if task == "copa":
        utils = lm_eval_module("super_glue/copa/utils.py")
        return {"query": utils.doc_to_text(doc), "choices": [choice[1:] for choice in utils.doc_to_choice(doc)], "gold": doc["label"]}
    if task == "winogrande":
        utils = lm_eval_module("winogrande/preprocess_winogrande.py")
        return {"context_options": utils.doc_to_choice(doc), "continuation": utils.doc_to_target(doc), "gold": utils.doc_to_text(doc)}
    config = yaml.load((LM_EVAL_TASKS / YAMLS[task]).read_text(), Loader=_TaskYaml)
    if task == "lambada":
        return {"context": lm_eval_field(config["doc_to_text"], doc), "continuation": lm_eval_field(config["doc_to_target"], doc).lstrip(" ")}
    choices = lm_eval_field(config["doc_to_choice"], doc)
    target = lm_eval_field(config["doc_to_target"], doc)
    gold = choices.index(target) if isinstance(target, str) and target in choices else int(target)
    return {"query": lm_eval_field(config["doc_to_text"], doc), "choices": choices, "gold": gold}


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# ---------------------------------------------------------------- native rows and the shared shape


@pytest.mark.parametrize("task", sorted(NATIVE_ROWS))
def test_native_rows_become_the_queries_lm_eval_asks(tmp_path, task):
    data = load_task_records(task, source=write_jsonl(tmp_path / f"{task}.jsonl", NATIVE_ROWS[task]))
    assert len(data.records) == len(NATIVE_ROWS[task])
    for record, row in zip(data.records, NATIVE_ROWS[task]):
        expected = lm_eval_reference(task, row)
        assert {key: record[key] for key in expected} == expected
        assert isinstance(record["id"], str) and record["id"]


def test_native_rows_keep_the_raw_question_and_ids(tmp_path):
    arc = load_task_records("arc_easy", source=write_jsonl(tmp_path / "arc.jsonl", ARC_ROWS)).records
    assert [record["id"] for record in arc] == ["Mercury_1", "NYSED_2"] and arc[0]["question"] == "Which gas do plants take in?"
    mmlu = load_task_records("mmlu", source=write_jsonl(tmp_path / "mmlu.jsonl", NATIVE_ROWS["mmlu"]))
    assert mmlu.records[0]["choice_texts"] == ["3", "4", "5", "6"] and mmlu.records[0]["subject"] == "elementary_mathematics"
    piqa = load_task_records("piqa", source=write_jsonl(tmp_path / "piqa.jsonl", NATIVE_ROWS["piqa"])).records
    assert [record["id"] for record in piqa] == ["piqa/1", "piqa/2"]  # no id column: named by line


def test_code_rows_follow_lm_eval_and_find_the_tested_function(tmp_path):
    humaneval = {"task_id": "HumanEval/0", "prompt": "def add(a, b):\n", "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
                 "entry_point": "add", "canonical_solution": "    return a + b\n"}
    record = load_task_records("humaneval", source=write_jsonl(tmp_path / "he.jsonl", [humaneval])).records[0]
    assert record == {"id": "HumanEval/0", "prompt": humaneval["prompt"], "entry_point": "add",
                      "tests": apply_template("{{test}}\ncheck({{entry_point}})", humaneval)}
    mbpp = {"task_id": 11, "text": "Write a function to remove the first and last occurrence of a character.", "code": "def remove_Occ(s, ch):\n    return s",
            "test_list": ["assert remove_Occ(\"hello\",\"l\") == \"heo\"", "assert len(remove_Occ(\"abcda\",\"a\")) == 3",
                          "assert remove_Occ(\"PHP\",\"P\") == \"H\""], "test_setup_code": "import math", "challenge_test_list": []}
    record = load_task_records("mbpp", source=write_jsonl(tmp_path / "mbpp.jsonl", [mbpp])).records[0]
    lm_eval_prompt = yaml.load((LM_EVAL_TASKS / "mbpp/mbpp.yaml").read_text(), Loader=_TaskYaml)["doc_to_text"]
    assert record["prompt"] == apply_template(lm_eval_prompt, mbpp).removesuffix("\n[BEGIN]\n")
    assert record["entry_point"] == "remove_Occ" and record["id"] == "MBPP/11"
    assert record["tests"] == "import math\n" + "\n".join(mbpp["test_list"])


@pytest.mark.parametrize("writer", [write_jsonl, write_parquet], ids=["jsonl", "parquet"])
def test_shared_shape_and_native_columns_are_read_from_jsonl_and_parquet(tmp_path, writer):
    shared = [{"query": "Question: 1+1?\nAnswer:", "choices": ["2", "3"], "gold": 0, "id": None}, {"query": "Q", "choices": ["a", "b"], "gold": 1, "id": "x"}]
    data = load_task_records("arc_easy", source=writer(tmp_path / f"shared.{writer.__name__[6:]}", shared))
    assert [record["gold"] for record in data.records] == [0, 1] and [record["id"] for record in data.records] == ["arc_easy/1", "x"]
    assert data.fewshot_pool == data.records and data.provenance["fewshot_split"] == "records"
    native = load_task_records("arc_easy", source=writer(tmp_path / f"native.{writer.__name__[6:]}", ARC_ROWS))
    assert [record["choices"] for record in native.records] == [row["choices"]["text"] for row in ARC_ROWS]
    import hashlib

    path = Path(native.provenance["source"])
    assert native.provenance["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest() and native.provenance["records"] == 2
    json.dumps(native.provenance)  # saved with the results: plain JSON


def test_schema_and_language_modelling_records_in_the_shared_shape(tmp_path):
    schema = [{"context_options": ["A because the cup", "A because the table"], "continuation": "was wobbly.", "gold": 1}]
    assert load_task_records("winogrande", source=write_jsonl(tmp_path / "w.jsonl", schema)).records[0]["gold"] == 1
    lm = [{"context": "the dog ran to fetch the", "continuation": "ball"}]
    assert load_task_records("lambada", source=write_jsonl(tmp_path / "l.jsonl", lm)).records[0]["continuation"] == "ball"


# ---------------------------------------------------------------- hf: sources and pinned revisions


def write_dataset(folder: Path, splits: dict[str, list[dict]]) -> Path:
    """A dataset folder with a file per split, as `datasets` reads it from hf:/path."""
    folder.mkdir()
    for split, rows in splits.items():
        write_jsonl(folder / f"{split}.jsonl", rows)
    return folder


def test_hf_folder_gives_the_eval_split_and_the_fewshot_pool(tmp_path):
    folder = write_dataset(tmp_path / "arc", {"train": ARC_ROWS[:1], "test": ARC_ROWS})
    for source in (f"hf:{folder}", folder):
        data = load_task_records("arc_easy", source=source)
        assert [record["id"] for record in data.records] == ["Mercury_1", "NYSED_2"]
        assert [record["id"] for record in data.fewshot_pool] == ["Mercury_1"]
        assert data.provenance | {"source": None} == {"task": "arc_easy", "kind": "huggingface", "source": None, "dataset": str(folder), "config": None,
                                                      "revision": None, "split": "test", "fewshot_split": "train", "records": 2, "fewshot_records": 1}
    test_only = write_dataset(tmp_path / "arc_test", {"test": ARC_ROWS})
    data = load_task_records("arc_easy", source=f"hf:{test_only}")
    assert data.fewshot_pool == [] and data.provenance["fewshot_split"] is None


def test_default_source_loads_the_pinned_revision(monkeypatch):
    import gptlab.data.sources as data_sources

    calls = []

    def fake_load_dataset(name, config, **kwargs):
        calls.append((name, config, kwargs))
        return iter(ARC_ROWS)

    monkeypatch.setattr(data_sources, "_check_hub_reachable", lambda name: None)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    data = load_task_records("arc_challenge")
    spec = DATASETS["arc_challenge"]
    assert calls == [("allenai/ai2_arc", "ARC-Challenge", {"split": split, "streaming": True, "revision": spec.revision}) for split in ("test", "train")]
    assert data.provenance["revision"] == spec.revision == "210d026faf9955653af8916fad021475a3f00453"
    assert all(len(spec.revision) == 40 for spec in DATASETS.values())  # commit SHAs, not branches that move


def test_hf_spec_parses_a_revision_and_describes_it():
    source = HuggingFaceSource("hf:org/name:cfg@0123abc", SourceOptions(split="test"))
    assert (source.name, source.config, source.revision) == ("org/name", "cfg", "0123abc")
    assert source.describe()["revision"] == "0123abc"
    branch = HuggingFaceSource("hf:org/name@refs/convert/parquet")
    assert (branch.name, branch.config, branch.revision) == ("org/name", None, "refs/convert/parquet")
    assert "revision" not in HuggingFaceSource("hf:org/name").describe()
    with pytest.raises(GptlabError, match="hf:NAME"):
        HuggingFaceSource("hf:org/name@")


def test_unreachable_hub_fails_in_one_line_naming_the_local_alternative(monkeypatch):
    import datasets.config

    with socket.socket() as probe:  # a local port nothing listens on: refused at once
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(GptlabError, match="cannot reach the Hugging Face hub") as raised:
        load_task_records("piqa")
    assert "hf:/path/to/a/dataset/directory" in str(raised.value) and "\n" not in str(raised.value)


# ---------------------------------------------------------------- MMLU's CSV folder


def write_mmlu(folder: Path) -> Path:
    rows = {"dev": [["What is 1+1?", "1", "2", "3", "4", "B"]],
            "val": [["What is 2+1?", "1", "2", "3", "4", "C"]],
            "test": [["What is 3+1?", "1", "2", "3", "4", "D"], ["Pick \"a, b\"", "a, b", "c", "d", "e", "A"]]}
    for split, lines in rows.items():
        (folder / split).mkdir(parents=True)
        for subject in ("anatomy", "astronomy"):
            with open(folder / split / f"{subject}_{split}.csv", "w", newline="", encoding="utf-8") as handle:
                csv.writer(handle).writerows(lines)
    return folder


def test_mmlu_csv_folder_reads_test_with_the_dev_pool(tmp_path):
    data = load_task_records("mmlu", source=write_mmlu(tmp_path / "mmlu"))
    assert [(record["subject"], record["gold"]) for record in data.records] == [("anatomy", 3), ("anatomy", 0), ("astronomy", 3), ("astronomy", 0)]
    assert data.records[0]["query"] == "What is 3+1?\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer:" and data.records[1]["choice_texts"][0] == "a, b"
    assert [record["gold"] for record in data.fewshot_pool] == [1, 1]
    assert data.provenance["fewshot_split"] == "dev" and data.provenance["files"] == 4 and len(data.provenance["sha256"]) == 64
    val = load_task_records("mmlu", source=tmp_path / "mmlu", split="validation")
    assert [record["gold"] for record in val.records] == [2, 2]


def test_mmlu_csv_row_with_wrong_columns_is_named_by_file_and_line(tmp_path):
    folder = write_mmlu(tmp_path / "mmlu")
    (folder / "test" / "anatomy_test.csv").write_text("What?,a,b,c,D\n", encoding="utf-8")
    with pytest.raises(GptlabError, match=r"anatomy_test.csv:1: expected 6 columns .* found 5"):
        load_task_records("mmlu", source=folder)


# ---------------------------------------------------------------- DCLM's eval bundle


def write_bundle(folder: Path) -> Path:
    """A bundle in the layout nanochat's base_eval unpacks: core.yaml, eval_meta_data.csv, eval_data/**.jsonl."""
    (folder / "eval_data" / "commonsense_reasoning").mkdir(parents=True)
    (folder / "eval_data" / "language_understanding").mkdir(parents=True)
    write_jsonl(folder / "eval_data" / "commonsense_reasoning" / "openbook_qa.jsonl",
                [{"query": "The sun is responsible for", "choices": ["puppies", "plants sprouting"], "gold": 1}])
    write_jsonl(folder / "eval_data" / "language_understanding" / "winogrande.jsonl",
                [{"context_options": ["A because the cup", "A because the table"], "continuation": "was wobbly.", "gold": 0}])
    write_jsonl(folder / "eval_data" / "language_understanding" / "jeopardy_all.jsonl",
                [{"context": "RIVERS: This river flows through Cairo", "continuation": "the Nile", "category": "rivers"}])
    (folder / "core.yaml").write_text(
        "icl_tasks:\n"
        "- label: openbook_qa\n  dataset_uri: commonsense_reasoning/openbook_qa.jsonl\n  num_fewshot: [0]\n  icl_task_type: multiple_choice\n"
        "- label: winogrande\n  dataset_uri: language_understanding/winogrande.jsonl\n  num_fewshot: [0]\n  icl_task_type: schema\n"
        "- label: jeopardy\n  dataset_uri: language_understanding/jeopardy_all.jsonl\n  num_fewshot: [10]\n  icl_task_type: language_modeling\n"
        "  continuation_delimiter: \"\\nAnswer: \"\n", encoding="utf-8")
    (folder / "eval_meta_data.csv").write_text(
        "Eval Task,Task Category,Random baseline\nopenbook_qa,commonsense reasoning,25\nwinogrande,language understanding,50\n"
        "jeopardy,world knowledge,0\n", encoding="utf-8")
    return folder


def test_read_bundle_gives_each_task_its_file_shots_delimiter_and_chance(tmp_path):
    tasks = read_bundle(write_bundle(tmp_path / "eval_bundle"))
    assert [(task.label, task.kind, task.num_fewshot, task.continuation_delimiter, task.random_baseline) for task in tasks] == [
        ("openbook_qa", "multiple_choice", 0, " ", 0.25), ("winogrande", "schema", 0, " ", 0.5), ("jeopardy", "language_modeling", 10, "\nAnswer: ", 0.0)]
    assert tasks[2].path == tmp_path / "eval_bundle" / "eval_data" / "language_understanding" / "jeopardy_all.jsonl"


def test_bundle_tasks_load_by_label_or_our_name(tmp_path):
    folder = write_bundle(tmp_path / "eval_bundle")
    openbook = load_task_records("openbookqa", source=folder)
    assert openbook.records[0]["gold"] == 1 and openbook.provenance["task"] == "openbook_qa" and openbook.provenance["random_baseline"] == 0.25
    jeopardy = load_task_records("jeopardy", source=folder)
    assert jeopardy.records[0]["continuation"] == "the Nile" and jeopardy.provenance["continuation_delimiter"] == "\nAnswer: "
    assert jeopardy.fewshot_pool == jeopardy.records and jeopardy.provenance["num_fewshot"] == 10
    with pytest.raises(GptlabError, match="has no task 'squad'; it has: openbook_qa, winogrande, jeopardy"):
        load_task_records("squad", source=folder)


def test_bundle_missing_baseline_or_data_is_refused(tmp_path):
    folder = write_bundle(tmp_path / "eval_bundle")
    (folder / "eval_meta_data.csv").write_text("Eval Task,Random baseline\nopenbook_qa,25\n", encoding="utf-8")
    with pytest.raises(GptlabError, match="no random baseline for 'winogrande'"):
        read_bundle(folder)
    write_bundle(tmp_path / "second")
    (tmp_path / "second" / "eval_data" / "language_understanding" / "winogrande.jsonl").unlink()
    with pytest.raises(GptlabError, match="winogrande.jsonl is missing"):
        read_bundle(tmp_path / "second")
    with pytest.raises(GptlabError, match="not a DCLM eval bundle: no core.yaml"):
        read_bundle(tmp_path)


def zip_folder(folder: Path, archive: Path) -> str:
    with zipfile.ZipFile(archive, "w") as bundle:
        for path in sorted(folder.rglob("*")):
            bundle.write(path, Path("eval_bundle") / path.relative_to(folder))
    return archive.as_uri()


def test_bundle_download_unpacks_into_the_cache_through_temporary_names(tmp_path, monkeypatch):
    monkeypatch.setenv("GPTLAB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(GptlabError, match="no DCLM eval bundle at .*download it"):
        bundle_module.bundle_folder()
    url = zip_folder(write_bundle(tmp_path / "made"), tmp_path / "eval_bundle.zip")
    folder = bundle_module.bundle_folder(download=True, url=url)
    assert folder == tmp_path / "cache" / "eval_bundle" and [task.label for task in read_bundle(folder)] == ["openbook_qa", "winogrande", "jeopardy"]
    assert sorted(path.name for path in (tmp_path / "cache").iterdir()) == ["eval_bundle"]  # no temporary leftovers
    assert bundle_module.bundle_folder() == folder


def test_bundle_download_of_a_broken_zip_leaves_nothing_behind(tmp_path):
    (tmp_path / "broken.zip").write_bytes(b"not a zip")
    cache = tmp_path / "cache"
    with pytest.raises(GptlabError, match="is not a zip file; nothing was kept"):
        bundle_module.download_bundle(cache / "eval_bundle", url=(tmp_path / "broken.zip").as_uri())
    assert list(cache.iterdir()) == []
    with pytest.raises(GptlabError, match="could not download the DCLM eval bundle .* put its eval_bundle/ folder at"):
        bundle_module.download_bundle(cache / "eval_bundle", url=(tmp_path / "absent.zip").as_uri())
    assert list(cache.iterdir()) == []


# ---------------------------------------------------------------- bad input, one line each


def test_bad_inputs_are_refused_in_one_line(tmp_path):
    cases = [
        (lambda: load_task_records("arc_easy", source=tmp_path / "absent.jsonl"), "arc_easy source not found: .*absent.jsonl"),
        (lambda: load_task_records("squadron"), "unknown evaluation task 'squadron'; known: arc_easy, "),
        (lambda: load_task_records("piqa", source=write_jsonl(tmp_path / "wrong.jsonl", [{"goal": "x", "answer": 1}])),
         r"wrong.jsonl:1: expected the shared multiple_choice fields \(query, choices, gold\) or piqa's native columns \(goal, sol1, sol2, label\)"),
        (lambda: load_task_records("piqa", source=write_jsonl(tmp_path / "empty.jsonl", [])), "empty.jsonl holds no records for piqa"),
        (lambda: load_task_records("piqa", source=write_jsonl(tmp_path / "gold.jsonl", [{"query": "q", "choices": ["a"], "gold": 3}])),
         "gold.jsonl:1: gold 3 does not pick one of the 1 choices"),
        (lambda: load_task_records("arc_easy", source=write_jsonl(tmp_path / "key.jsonl", [dict(ARC_ROWS[0], answerKey="E")])),
         r"key.jsonl:1: answerKey 'E' is not one of the choice labels \['A', 'B', 'C'\]"),
    ]
    (tmp_path / "broken.jsonl").write_text('{"query": "q"}\n{not json\n', encoding="utf-8")
    cases.append((lambda: load_task_records("piqa", source=tmp_path / "broken.jsonl"), "broken.jsonl:2: not valid JSON"))
    (tmp_path / "table.csv").write_text("a,b\n", encoding="utf-8")
    cases.append((lambda: load_task_records("piqa", source=tmp_path / "table.csv"), "unsupported file type '.csv'"))
    for call, message in cases:
        with pytest.raises(GptlabError, match=message) as raised:
            call()
        assert "\n" not in str(raised.value)
