"""`gptlab run`, the main job, end to end on the built-in corpus (a small vocabulary to stay fast)."""

import json

from gptlab.cli.main import main
from gptlab.data.corpus import shakespeare_files
from gptlab.tokenizer import Tokenizer


def test_run_trains_a_tokenizer_and_reports_held_out_compression(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), "--tokenizer.vocab_size", "512"]) == 0
    log = capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["tokenizer"]["vocab_size"] == 512 and config["out"] == str(out)
    tokenizer = Tokenizer.load(out / "tokenizer")
    assert tokenizer.vocab_size == 512 and tokenizer.special_tokens == {"<|endoftext|>": 511}
    # The measured figure is the real one: recompute it from the held-out works.
    held_out = shakespeare_files()[9::10]
    text = "".join(path.read_text(encoding="utf-8") for path in held_out)
    ratio = len(text.encode()) / sum(len(tokenizer.encode(path.read_text(encoding="utf-8"))) for path in held_out)
    assert f"{ratio:.2f} bytes/token" in log
    assert ratio > 1.5  # 512 ids already compress English well beyond one byte per token
    # The shards hold every work once, under the tokenizer just trained.
    manifest = json.loads((out / "data" / "manifest.json").read_text())
    assert manifest["tokenizer"]["fingerprint"] == tokenizer.fingerprint()
    assert manifest["splits"]["train"]["documents"] + manifest["splits"]["val"]["documents"] == len(shakespeare_files())
    assert f"train {manifest['splits']['train']['tokens']:,} tokens" in log
