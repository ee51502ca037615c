"""`gptlab run`, the main job, end to end on the built-in corpus (small sizes to stay fast)."""

import json

from gptlab.cli.main import main
from gptlab.data.corpus import shakespeare_files
from gptlab.model.io import load_model
from gptlab.tokenizer import Tokenizer

SMALL = [
    "--tokenizer.vocab_size", "512",
    "--train.max_steps", "12", "--train.model.n_layer", "1", "--train.model.n_embd", "32", "--train.model.n_head", "2",
    "--train.batch_tokens", "1024", "--train.micro_batch", "8", "--train.eval_every", "6", "--train.eval_batches", "2",
    "--train.checkpoint_every", "6", "--train.log_every", "1", "--train.precision", "fp32", "--sample.max_new_tokens", "20",
]


def test_run_goes_from_corpus_to_samples_and_reports_every_figure(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), *SMALL]) == 0
    log = capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["tokenizer"]["vocab_size"] == 512 and config["train"]["max_steps"] == 12 and config["out"] == str(out)

    # Tokenizer: the held-out compression printed is the real one, recomputed from the held-out works.
    tokenizer = Tokenizer.load(out / "tokenizer")
    assert tokenizer.vocab_size == 512 and tokenizer.special_tokens == {"<|endoftext|>": 511}
    held_out = shakespeare_files()[9::10]
    text = "".join(path.read_text(encoding="utf-8") for path in held_out)
    ratio = len(text.encode()) / sum(len(tokenizer.encode(path.read_text(encoding="utf-8"))) for path in held_out)
    assert f"{ratio:.2f} bytes/token" in log and ratio > 1.5

    # Data: every work once, under the tokenizer just trained.
    manifest = json.loads((out / "data" / "manifest.json").read_text())
    assert manifest["tokenizer"]["fingerprint"] == tokenizer.fingerprint()
    assert manifest["splits"]["train"]["documents"] + manifest["splits"]["val"]["documents"] == len(shakespeare_files())

    # Training: 12 steps, metrics, checkpoint with its tokenizer, the loss plot; loss went down.
    records = [json.loads(line) for line in (out / "train" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 12 and losses[-1] < losses[0]
    checkpoint = out / "train" / "checkpoints" / "step_000012"
    assert (checkpoint / "tokenizer" / "tokenizer.json").is_file() and (out / "train" / "loss.png").is_file()
    assert load_model(checkpoint).config.vocab_size == 512

    # Evaluation and sampling are reported.
    assert "val bits per byte" in log and "[7/7] sample" in log and log.rstrip().endswith("loss.png)")
