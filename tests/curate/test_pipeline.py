"""`gptlab data curate` end to end: a WARC to clean shards `gptlab data prepare` accepts, resume after kill -9, refusals,
and the same stages inside datatrove's local executor."""

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from gptlab.cli.main import main
from gptlab.curate.config import CurateConfig, build_stages, load_config
from gptlab.curate.example import write_example_warc
from gptlab.curate.pii import EMAIL, IP_ADDRESS, PHONE_NUMBER
from gptlab.curate.readers import read_documents

ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
CURATED = pytest.mark.xdist_group("curate_curated")  # one worker builds the `curated` fixture once, not each worker


@pytest.fixture(scope="module")
def crawl(tmp_path_factory):
    """Three small example crawls (different seeds), as three WARC files."""
    folder = tmp_path_factory.mktemp("crawl")
    return [write_example_warc(folder / f"part{number}.warc.gz", pages=40, seed=number) for number in range(3)]


@pytest.fixture(scope="module")
def curated(crawl, tmp_path_factory):
    out = tmp_path_factory.mktemp("curated") / "out"
    assert main(["data", "curate", *map(str, crawl), "--out", str(out), "--workers", "2"]) == 0
    return out


def _rows(out):
    return [json.loads(line) for path in sorted((out / "shards").glob("*.jsonl")) for line in path.read_text().splitlines()]


@CURATED
def test_curate_report_chains_each_stages_counts_and_names_its_drops(curated):
    report = json.loads((curated / "report.json").read_text())
    stages = report["stages"]
    assert [s["name"] for s in stages] == ["extract", "language", "gopher", "repetition", "pii", "document dedup",
                                          "minhash dedup", "line dedup"]
    assert stages[0]["documents_in"] == report["read"]["documents"] and report["read"]["skipped_not_html"] > 0
    for before, after in zip(stages, stages[1:]):
        assert after["documents_in"] == before["documents_out"]
    for stage in stages:
        assert stage["documents_in"] - stage["documents_out"] == sum(stage["reasons"].values())
    assert any(r.startswith("language: ") for r in stages[1]["reasons"]) and stages[2]["reasons"] and stages[5]["reasons"]
    assert report["documents_out"] == len(_rows(curated)) == stages[-1]["documents_out"]
    assert "out: " in (curated / "report.txt").read_text() and not (curated / "work").exists()


@CURATED
def test_curated_text_is_clean_deduplicated_and_prepare_accepts_it(curated, prepared, tmp_path):
    rows = _rows(curated)
    texts = [row["text"] for row in rows]
    assert len(set(texts)) == len(texts) and len({row["id"] for row in rows}) == len(rows)
    for pattern in (EMAIL, PHONE_NUMBER, IP_ADDRESS):
        assert not any(re.search(pattern, text) for text in texts)
    assert sum("|||EMAIL_ADDRESS|||" in text for text in texts) > 0
    assert not any("We use cookies" in text for text in texts)  # boilerplate on every page: removed by line dedup
    assert all(row["language"] == "en" for row in rows)
    assert main(["data", "prepare", str(curated / "shards"), "-t", str(prepared / "tokenizer"), "--out", str(tmp_path / "tok"),
                 "--quiet"]) == 0
    manifest = json.loads((tmp_path / "tok" / "manifest.json").read_text())
    assert manifest["documents"]["kept"] == len(rows)


@CURATED
def test_curate_rerun_of_a_finished_folder_reprints_its_report(curated, crawl, capsys):
    before = (curated / "report.json").read_bytes()
    assert main(["data", "curate", *map(str, crawl), "--out", str(curated)]) == 0
    assert "finished: its report follows" in capsys.readouterr().out and (curated / "report.json").read_bytes() == before


@CURATED
def test_curate_killed_mid_run_resumes_to_the_uninterrupted_output(crawl, curated, tmp_path, capsys):
    """kill -9 once the first input is filtered; the rerun skips it and ends with the same shards and report."""
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "gptlab.cli.main", "data", "curate", *map(str, crawl), "--out", str(out), "--workers", "1"]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ONE_THREAD)
    first = out / "work" / "filtered_00000.stats.json"
    deadline = time.monotonic() + 120
    while not first.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert first.exists() and not (out / "report.json").exists()  # killed between inputs, before the end
    # the rerun in this process: only the killed run needs a process of its own (saves a start)
    assert main(command[3:]) == 0 and "inputs filtered before" in capsys.readouterr().out
    assert _rows(out) == _rows(curated)
    assert json.loads((out / "report.json").read_text())["stages"] == json.loads((curated / "report.json").read_text())["stages"]


@CURATED
def test_curate_refuses_a_folder_it_did_not_make_and_other_settings(crawl, curated, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["data", "curate", str(crawl[0]), "--out", str(tmp_path)]) == 1
    assert "not a gptlab run folder" in capsys.readouterr().err and [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    config = tmp_path / "c.toml"
    config.write_text("skip = [\"repetition\"]\n")
    assert main(["data", "curate", *map(str, crawl), "--out", str(curated), "--config", str(config)]) == 1
    assert "other settings" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "message"), [
    ("[gopher]\nmin_wordz = 3\n", "unknown fields min_wordz"),
    ("skip = [\"nothing\"]\n", "skip names unknown stages nothing"),
    ("[output]\nformat = \"csv\"\n", "output.format 'csv'"),
    ("fasttext = 3\n", "write [[fasttext]]"),
    ("[quality]\npath = \"missing.npz\"\n", "missing.npz"),
    ("[[fasttext]]\npath = \"missing.bin\"\nlabel = \"__label__bad\"\n", "missing.bin"),
    ("not toml [", "is not valid TOML"),
    ("[gopher]\nmin_words = \"50\"\n", "gopher.min_words = \"50\" is a string; give an integer"),
    ("[language]\nthreshold = true\n", "language.threshold = true is a boolean; give a number"),
    ("skip = \"pii\"\n", "skip = \"pii\" is a string; give a list of strings"),
    ("[language]\nlanguages = [\"en\", 3]\n", "language.languages = [\"en\", 3] is a list; give a list of strings"),
    ("gopher = 3\n", "gopher = 3 is an integer; write it as a table, [gopher]"),
    ("[output]\nshard_documents = 1.5\n", "output.shard_documents = 1.5 is a decimal number; give an integer"),
    ("[[fasttext]]\npath = 3\nlabel = \"__label__bad\"\n", "[[fasttext]] path = 3 is an integer; give a string"),
    ("skip = [\"extract\", \"language\", \"gopher\", \"repetition\", \"quality\", \"fasttext\", \"pii\", \"exact_dedup\", "
     "\"minhash\", \"line_dedup\"]\n", "skip leaves out every stage"),
])
def test_curate_refuses_bad_configs_in_one_line_and_leaves_nothing(crawl, tmp_path, capsys, text, message):
    config = tmp_path / "c.toml"
    config.write_text(text)
    assert main(["data", "curate", str(crawl[0]), "--out", str(tmp_path / "out"), "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not (tmp_path / "out").exists()


def test_curate_config_file_round_trips_every_stage(tmp_path):
    text = ("skip = [\"minhash\"]\n[language]\nlanguages = [\"en\", \"fr\"]\nthreshold = 0.5\n[minhash]\nbands = 32\n"
            "[[fasttext]]\npath = \"a.bin\"\nlabel = \"__label__nsfw\"\n[[fasttext]]\npath = \"b.bin\"\nlabel = \"__label__hate\"\n"
            "[output]\nformat = \"parquet\"\n")
    (tmp_path / "c.toml").write_text(text)
    config = load_config(str(tmp_path / "c.toml"))
    assert config.skip == ("minhash",) and config.language.languages == ("en", "fr") and config.minhash.bands == 32
    assert [c.label for c in config.fasttext] == ["__label__nsfw", "__label__hate"] and config.output.format == "parquet"
    assert load_config(None) == CurateConfig()


def test_curate_reads_jsonl_and_writes_parquet(tmp_path, capsys):
    from gptlab.data.corpus import shakespeare_documents

    works = shakespeare_documents()[:4]
    rows = [{"id": f"w{n}", "content": text[:20_000]} for n, text in enumerate(works)] + [{"id": "copy", "content": works[0][:20_000]}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "c.toml").write_text("text_field = \"content\"\n[output]\nformat = \"parquet\"\n")
    assert main(["data", "curate", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "out"), "--config", str(tmp_path / "c.toml")]) == 0
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "out" / "shards" / "shard_00000.parquet").to_pylist()
    assert [row["id"] for row in table] == ["w0", "w1", "w2", "w3"]  # the exact copy dropped, input order kept


def test_datatrove_local_executor_runs_the_same_stages(crawl, tmp_path):
    """Our reader and stages as datatrove steps, in its LocalPipelineExecutor over 2 tasks, give the documents
    `gptlab data curate`'s per-document phase gives."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.writers import JsonlWriter

    from gptlab.curate.datatrove_steps import GptlabReader, gptlab_steps

    config = CurateConfig()
    pipeline = [GptlabReader(list(map(str, crawl[:2]))), *gptlab_steps(config), JsonlWriter(str(tmp_path / "dt"))]
    LocalPipelineExecutor(pipeline=pipeline, tasks=2, workers=1, logging_dir=str(tmp_path / "logs")).run()
    got = sorted((json.loads(line)["id"], json.loads(line)["text"]) for path in (tmp_path / "dt").glob("*.jsonl.gz")
                 for line in gzip.open(path, "rt"))
    expected = []
    for path in crawl[:2]:
        documents = iter(read_documents(path))
        for stage in build_stages(config):
            documents = stage.run(documents)
        expected += [(document.id, document.text) for document in documents]
    assert got == sorted(expected) and len(got) > 20


def test_docs_curate_toml_lists_the_defaults():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "docs" / "curate.toml"
    assert load_config(str(path)) == CurateConfig()


def test_train_quality_then_curate_with_it_drops_what_it_learned_is_bad(tmp_path, capsys):
    """`gptlab data train-quality` on the user's own examples, then [quality] path = that file in curate."""
    import random

    from gptlab.data.corpus import shakespeare_documents

    rng = random.Random(0)
    words = " ".join(shakespeare_documents()[:3]).split()
    spam = "buy cheap tickets now best price discount offer click here free shipping deal".split()

    def prose(count):
        starts = [rng.randrange(len(words) - 120) for _ in range(count)]
        return [" ".join(words[start:start + 120]) for start in starts]

    def junk(count):
        return [" ".join(rng.choice(spam) for _ in range(120)) for _ in range(count)]

    def write(name, texts):
        (tmp_path / name).write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
        return str(tmp_path / name)

    model = tmp_path / "quality.npz"
    assert main(["data", "train-quality", write("good.jsonl", prose(60)), "--negatives", write("bad.jsonl", junk(60)),
                 "--out", str(model)]) == 0
    assert "saved" in capsys.readouterr().out
    assert main(["data", "train-quality", str(tmp_path / "good.jsonl"), "--negatives", str(tmp_path / "bad.jsonl"),
                 "--out", str(model)]) == 1  # never overwritten without --force
    assert "pass --force" in capsys.readouterr().err
    (tmp_path / "c.toml").write_text(f"skip = [\"gopher\", \"repetition\"]\n[quality]\npath = \"{model}\"\n")
    mixed = write("mixed.jsonl", prose(5) + junk(5))
    assert main(["data", "curate", mixed, "--out", str(tmp_path / "out"), "--config", str(tmp_path / "c.toml")]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    quality = next(stage for stage in report["stages"] if stage["name"] == "quality")
    assert (quality["documents_in"], quality["documents_out"], quality["reasons"]) == (10, 5, {"quality below 0.5": 5})
    assert [row["id"] for row in _rows(tmp_path / "out")] == [f"mixed.jsonl/{n}" for n in range(1, 6)]


def test_inputs_sharing_a_file_name_keep_document_ids_unique(tmp_path):
    """crawl-a/part.jsonl and crawl-b/part.jsonl without ids: each id names its input's path, not just part.jsonl."""
    from gptlab.data.corpus import shakespeare_documents

    works = shakespeare_documents()
    for folder, text in (("crawl-a", works[0]), ("crawl-b", works[1])):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "part.jsonl").write_text(json.dumps({"text": text[:20_000]}) + "\n")
    (tmp_path / "c.toml").write_text("skip = [\"repetition\"]\n")
    assert main(["data", "curate", str(tmp_path / "crawl-a"), str(tmp_path / "crawl-b"), "--out", str(tmp_path / "out"),
                 "--config", str(tmp_path / "c.toml")]) == 0
    assert [row["id"] for row in _rows(tmp_path / "out")] == ["crawl-a/part.jsonl/1", "crawl-b/part.jsonl/1"]


# Bad inputs: one line naming the file, and nothing left behind.

def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gptlab: error: ") and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(("name", "content", "message"), [
    ("junk.warc.gz", b"this is not a crawl\n" * 20, "junk.warc.gz is not a WARC file (Invalid WARC header)"),
    ("page.html", b"\x89PNG\r\n\x1a\n\x00\x00", "page.html: no documents (1 binary, not text)"),
    ("empty.jsonl", b"", "empty.jsonl: no documents (it is empty)"),
])
def test_curate_refuses_an_input_that_is_not_what_its_name_says_and_leaves_nothing(crawl, tmp_path, capsys, name, content, message):
    (tmp_path / name).write_bytes(content)
    assert main(["data", "curate", str(crawl[0]), str(tmp_path / name), "--out", str(tmp_path / "out")]) == 1
    assert message in _one_error_line(capsys) and not (tmp_path / "out").exists()


def test_curate_refuses_a_truncated_crawl_naming_it_and_leaves_nothing(crawl, tmp_path, capsys):
    data = crawl[1].read_bytes()
    (tmp_path / "half.warc.gz").write_bytes(data[:len(data) // 2])
    assert main(["data", "curate", str(tmp_path / "half.warc.gz"), "--out", str(tmp_path / "out"), "--workers", "2"]) == 1
    err = _one_error_line(capsys)
    assert f"{tmp_path / 'half.warc.gz'} is truncated: " in err and "documents, before it); download the file again" in err
    assert not (tmp_path / "out").exists()


@CURATED
def test_curate_truncated_crawl_after_others_keeps_their_work_and_resumes_once_fixed(crawl, curated, tmp_path, capsys):
    """The inputs filtered before the bad one stay; the same command, once the file is whole, ends as if nothing happened."""
    data = crawl[1].read_bytes()
    files = [tmp_path / path.name for path in crawl]
    for path, source in zip(files, crawl):
        path.write_bytes(source.read_bytes())
    files[1].write_bytes(data[:len(data) // 2])
    args = ["data", "curate", *map(str, files), "--out", str(tmp_path / "out"), "--workers", "1"]
    assert main(args) == 1
    err = _one_error_line(capsys)
    assert "part1.warc.gz is truncated" in err and "The 1 inputs filtered so far stay in" in err
    files[1].write_bytes(data)
    assert main(args) == 0
    assert _rows(tmp_path / "out") == _rows(curated)


@pytest.mark.parametrize("workers", ["0", "-2"])
def test_curate_refuses_workers_below_one(crawl, tmp_path, capsys, workers):
    assert main(["data", "curate", str(crawl[0]), "--out", str(tmp_path / "out"), "--workers", workers]) == 1
    assert f"--workers {workers}: give at least 1 process" in _one_error_line(capsys) and not (tmp_path / "out").exists()


def test_curate_resumes_a_project_moved_whole(crawl, tmp_path, capsys):
    """Inputs are recorded relative to the output folder, so the rerun after a move (or from another folder) resumes."""
    project = tmp_path / "before" / "project"
    (project / "crawl").mkdir(parents=True)
    (project / "crawl" / "part0.warc.gz").write_bytes(crawl[0].read_bytes())
    assert main(["data", "curate", str(project / "crawl"), "--out", str(project / "out"), "--workers", "1"]) == 0
    record = json.loads((project / "out" / "gptlab_run.json").read_text())
    assert record["config"]["inputs"] == ["../crawl/part0.warc.gz"]
    moved = tmp_path / "after" / "project"
    moved.parent.mkdir()
    project.rename(moved)
    capsys.readouterr()
    assert main(["data", "curate", str(moved / "crawl"), "--out", str(moved / "out")]) == 0
    assert "holds this curation, finished" in capsys.readouterr().out


def test_curate_resumes_a_folder_made_when_inputs_were_recorded_absolute(crawl, tmp_path, capsys):
    """A folder from before relative inputs (its marker holds absolute paths) resumes on the same files, not refused."""
    out = tmp_path / "out"
    assert main(["data", "curate", str(crawl[0]), "--out", str(out), "--workers", "1"]) == 0
    marker = out / "gptlab_run.json"
    record = json.loads(marker.read_text())
    record["config"]["inputs"] = [str(crawl[0].absolute())]
    marker.write_text(json.dumps(record))
    capsys.readouterr()
    assert main(["data", "curate", str(crawl[0]), "--out", str(out)]) == 0
    assert "holds this curation, finished" in capsys.readouterr().out


def test_curate_help_describes_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["data", "curate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--out DIR the curation's folder" in text and "--workers N processes" in text


def test_train_quality_refuses_the_same_set_twice_and_warns_when_held_out_accuracy_is_at_chance(tmp_path, capsys):
    import random

    from gptlab.data.corpus import shakespeare_documents

    rng = random.Random(1)
    words = " ".join(shakespeare_documents()[:3]).split()

    def write(name, count):
        starts = [rng.randrange(len(words) - 120) for _ in range(count)]
        (tmp_path / name).write_text("".join(json.dumps({"text": " ".join(words[s:s + 120])}) + "\n" for s in starts))
        return str(tmp_path / name)

    good, other = write("good.jsonl", 60), write("other.jsonl", 60)
    assert main(["data", "train-quality", good, "--negatives", good, "--out", str(tmp_path / "q.npz")]) == 1
    assert "every positive example is also a negative one (60 texts in both)" in _one_error_line(capsys)
    assert not (tmp_path / "q.npz").exists()
    assert main(["data", "train-quality", good, "--negatives", other, "--out", str(tmp_path / "q.npz")]) == 0
    captured = capsys.readouterr()
    assert "held-out accuracy" in captured.out and captured.err.startswith("gptlab: warning: the held-out accuracy ")
    assert "is at chance" in captured.err and (tmp_path / "q.npz").exists()


def test_train_quality_force_replaces_only_an_earlier_classifier(tmp_path, capsys):
    """--force replaces this command's own output: a file it did not write (an .npz of the user's) is never touched."""
    import numpy as np

    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"text": "a page"}) + "\n")
    mine = tmp_path / "mine.npz"
    np.savez(mine, weights=np.arange(3.0))
    before = mine.read_bytes()
    assert main(["data", "train-quality", str(good), "--negatives", str(good), "--out", str(mine), "--force"]) == 1
    assert f"--out {mine} exists and is not a quality classifier (it is never overwritten)" in _one_error_line(capsys)
    assert mine.read_bytes() == before
