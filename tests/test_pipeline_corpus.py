"""`gptlab run --corpus DIR|FILE|hf:NAME`: the whole pipeline on a user's own text, at a tiny scale; what only the
built-in corpus has (enough documents to hold some out, a prompt) derived from the text and said; wrong input
refused in one line, leaving nothing behind."""

import contextlib
import io
import json
import random
from pathlib import Path

import pytest

from gptlab.cli.main import main
from gptlab.data.shards import open_shard, split_shards
from gptlab.tokenizer import Tokenizer

from .test_pipeline import SMALL

TINY = [*SMALL, "--train.seq-len", "64", "--train.max-steps", "6", "--sft.max-steps", "2"]
WORDS = ("river stone lantern orchard whisper candle meadow harbor silver thunder garden window "
         "morning autumn feather valley compass letter bridge mountain").split()


def sentences(seed: int, lines: int = 150) -> str:
    rng = random.Random(seed)
    return "".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))).capitalize() + ".\n" for _ in range(lines))


def write_corpus(folder: Path) -> list[Path]:
    """Four text files of three kinds and a binary file; returns the text files in the order the run reads them."""
    folder.mkdir(parents=True)
    (folder / "a_notes.txt").write_text(sentences(1), encoding="utf-8")
    (folder / "b_readme.md").write_text("# Field notes\n\n" + sentences(2), encoding="utf-8")
    (folder / "c_tool.py").write_text("def add(a, b):\n    return a + b\n\n" + "".join(f"# {line}" for line in sentences(3).splitlines(True)))
    (folder / "d_diary.txt").write_text(sentences(4), encoding="utf-8")
    (folder / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x01")
    return [folder / name for name in ("a_notes.txt", "b_readme.md", "c_tool.py", "d_diary.txt")]


def run_quietly(args: list[str]) -> tuple[int, str]:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(args)
    return code, printed.getvalue()


@pytest.fixture(scope="module")
def own_run(tmp_path_factory):
    """One tiny run on a folder of the user's files, into the default folder runs/<name> (cwd: a fresh folder)."""
    root = tmp_path_factory.mktemp("own")
    files = write_corpus(root / "fieldnotes")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        code, log = run_quietly(["run", "--corpus", str(root / "fieldnotes"), *TINY])
    assert code == 0, log
    return root, files, log


def val_ids(out: Path) -> list[int]:
    return [int(i) for path, _ in split_shards(out / "data", "val") for i in open_shard(path)[1]]


@pytest.mark.xdist_group("own_run")  # one worker builds the run both tests read
def test_a_folder_of_own_files_runs_every_stage_into_runs_name(own_run):
    root, files, log = own_run
    out = root / "runs" / "fieldnotes"
    config = json.loads((out / "config.json").read_text())
    assert config["corpus"] == str(root / "fieldnotes") and config["out"] == str(Path("runs") / "fieldnotes")
    assert "skipped 1 binary file: logo.png" in log
    # four documents, fewer than val_every 10: the last is held out, said in one line with the prompt it gave
    adapted = [line for line in log.splitlines() if "adapted to this corpus:" in line]
    assert len(adapted) == 1 and "the last of its 4 documents held out" in adapted[0]
    held = files[-1].read_text(encoding="utf-8")
    prompt = " ".join(held.splitlines()[0].split()[:6])
    assert f"sample prompt {prompt!r}" in adapted[0] and config["sample"]["prompt"].strip() == prompt

    # the tokenizer saw the training files only: the same merges as training on them by hand
    tokenizer = Tokenizer.load(out / "tokenizer")
    reference = Tokenizer.train([path.read_text(encoding="utf-8") for path in files[:-1]], vocab_size=512)
    assert tokenizer.merges == reference.merges
    # the val split is exactly the held-out file
    assert val_ids(out) == [tokenizer.eot_id, *tokenizer.encode_ordinary(held)]
    manifest = json.loads((out / "data" / "manifest.json").read_text())
    assert manifest["splits"]["train"]["documents"] == 3

    # every later stage ran on it: training, evaluation, a sample from the derived prompt, SFT, chat, the cards
    assert (out / "train" / "checkpoints" / "step_000006").is_dir() and (out / "sft" / "checkpoints" / "step_000002").is_dir()
    for stage in ("[6/10] evaluate", "val bits per byte", "[7/10] sample", "[8/10] fine-tune", "[9/10] chat", "[10/10] report cards"):
        assert stage in log
    assert log.split("[7/10] sample")[1].splitlines()[1].startswith(prompt)
    assert "held-out works" not in log and "the 1 held-out documents are the val split" in log  # not Shakespeare's works
    base = json.loads((out / "train" / "eval-heldout" / "eval.json").read_text())
    assert [row["task"] for row in base["rows"]] == ["next_line", "last_word"]  # cut from the held-out file
    assert (out / "sft" / "eval-tasks" / "eval.json").is_file()


@pytest.mark.xdist_group("own_run")  # one worker builds the run both tests read
def test_the_same_command_resumes_and_another_corpus_is_refused_there(own_run, capsys):
    root, files, _ = own_run
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        code, log = run_quietly(["run", "--corpus", str(root / "fieldnotes"), *TINY])
        assert code == 0 and "resuming the run in runs/fieldnotes" in log and "already finished" in log
        before = sorted(p.relative_to(root) for p in (root / "runs").rglob("*"))
        assert main(["run", "--corpus", "shakespeare", "--out", "runs/fieldnotes", *TINY]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"holds the run on corpus {str(root / 'fieldnotes')!r}, not 'shakespeare'" in err
        assert "pass --out runs/shakespeare" in err
        files[0].write_text("an edited file\n" * 30)  # the same command on changed files: said, not mixed in
        assert main(["run", "--corpus", str(root / "fieldnotes"), *TINY]) == 1
        assert "changed since the run in runs/fieldnotes began; pass --force" in capsys.readouterr().err
        assert sorted(p.relative_to(root) for p in (root / "runs").rglob("*")) == before


def test_a_local_hugging_face_dataset_runs_through_the_same_stages(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    dataset = tmp_path / "tales"
    dataset.mkdir()
    texts = [sentences(seed, lines=60) for seed in range(24)]
    pq.write_table(pa.table({"text": texts[:12]}), dataset / "part-0.parquet")
    pq.write_table(pa.table({"text": texts[12:]}), dataset / "part-1.parquet")
    monkeypatch.chdir(tmp_path)
    code, log = run_quietly(["run", "--corpus", f"hf:{dataset}", *TINY])
    assert code == 0, log
    out = tmp_path / "runs" / "tales"
    # 24 records: every 10th held out, as on the built-in corpus; nothing about the split needed adapting
    tokenizer = Tokenizer.load(out / "tokenizer")
    assert val_ids(out) == [i for text in (texts[9], texts[19]) for i in [tokenizer.eot_id, *tokenizer.encode_ordinary(text)]]
    adapted = [line for line in log.splitlines() if "adapted to this corpus:" in line]
    assert len(adapted) == 1 and "held out" not in adapted[0] and "sample prompt" in adapted[0]
    assert "[10/10] report cards" in log and (out / "sft" / "eval-tasks" / "eval.json").is_file()


@pytest.mark.parametrize(("make", "message"), [
    (lambda root: root / "missing", "input not found"),
    (lambda root: (root / "empty").mkdir() or root / "empty", "holds no files"),
    (lambda root: write_corpus(root / "bin") and [p.unlink() for p in (root / "bin").glob("*_*")] and root / "bin",
     "holds only binary files (skipped 1 binary file: logo.png)"),
])
def test_wrong_corpus_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys, make, message):
    spec = make(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    assert main(["run", "--corpus", str(spec), *TINY]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert sorted(tmp_path.rglob("*")) == before and not (tmp_path / "runs").exists()


def test_a_held_out_text_shorter_than_one_batch_names_the_flags_that_fit_it(tmp_path, capsys):
    (tmp_path / "small").mkdir()
    for number in range(3):
        (tmp_path / "small" / f"{number}.txt").write_text(sentences(number, lines=30))
    out = tmp_path / "run"
    assert main(["run", "--corpus", str(tmp_path / "small"), "--out", str(out), *TINY]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fewer than one evaluation batch of --train.micro-batch 8 x --train.seq-len 64 + 1 = 513" in err
    fix = err.split("pass ")[1].split(",")[0].split()
    assert fix[0] == "--train.micro-batch" and not out.exists()
    assert main(["run", "--corpus", str(tmp_path / "small"), "--out", str(out), *TINY, *fix]) == 0


def test_the_fine_tuning_stage_names_its_flags_as_gptlab_run_spells_them(tmp_path, capsys):
    files = write_corpus(tmp_path / "notes")
    args = ["run", "--corpus", str(files[0].parent), "--out", str(tmp_path / "run"), *TINY,
            "--train.model.block-size", "64", "--sft.seq-len", "128", "--sft.batch-tokens", "1024"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--sft.seq-len 128 is longer than the context of the model it starts from" in err
    assert "pass --sft.seq-len 64 or less" in err


def test_a_single_file_is_cut_at_line_breaks_and_its_last_part_held_out(tmp_path):
    from gptlab.data.documents import cut_at_lines

    text = sentences(7, lines=1200)
    parts = cut_at_lines(text, 10)
    assert "".join(parts) == text and len(parts) == 10 and all(part.endswith("\n") for part in parts)
    (tmp_path / "book.txt").write_text(text)
    code, log = run_quietly(["run", "--corpus", str(tmp_path / "book.txt"), "--out", str(tmp_path / "run"), *TINY])
    assert code == 0, log
    assert "adapted to this corpus: its one document cut into 10 parts at line breaks;" in log
    tokenizer = Tokenizer.load(tmp_path / "run" / "tokenizer")
    assert val_ids(tmp_path / "run") == [tokenizer.eot_id, *tokenizer.encode_ordinary(parts[-1])]
