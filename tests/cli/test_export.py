"""`gptlab export hf`: transformers loads the folder and gives gptlab's ids and logits; and the way back in."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import transformers

from gptlab.cli.main import main
from gptlab.infer import SamplingConfig, generate
from gptlab.load.checkpoints import list_checkpoints
from gptlab.model.io import load_model
from gptlab.tokenizer import Tokenizer
from gptlab.train import Trainer
from gptlab.train.config import shakespeare_cpu
from tests.train.conftest import tiny_config

pytestmark = pytest.mark.usefixtures("hf_modules_cache")  # transformers' copy of remote code under tmp (tests/conftest.py)

TEXT = "ROMEO:\nBut, soft! what light through yonder window breaks?<|endoftext|>JULIET:\nAy me!"


@pytest.fixture(scope="module")
def run(prepared, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "run"
    Trainer(tiny_config(prepared, out, max_steps=2, eval_every=0, checkpoint_every=0), log=lambda *_: None).fit()
    return out


@pytest.fixture(scope="module")
def recipe_run(prepared, tmp_path_factory) -> Path:
    """A real tiny run with the default recipe's model switches (rotary, RMSNorm, QK-norm, ReLU², untied, zero_init)."""
    out = tmp_path_factory.mktemp("export") / "recipe"
    model = dataclasses.replace(shakespeare_cpu().model, vocab_size=512, n_layer=2, n_head=2, n_embd=32, block_size=32)
    Trainer(tiny_config(prepared, out, model=model, max_steps=2, eval_every=0, checkpoint_every=0), log=lambda *_: None).fit()
    return out


def test_export_hf_gives_transformers_gptlabs_ids_and_logits(run, tmp_path, capsys):
    assert main(["export", "hf", str(run), str(tmp_path / "hf")]) == 0
    assert "as GPT2LMHeadModel" in capsys.readouterr().out
    checkpoint = list_checkpoints(run)[-1]
    ours, tokenizer = load_model(checkpoint).eval(), Tokenizer.load(checkpoint / "tokenizer")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ids = tokenizer.encode(TEXT, allowed_special="all")
    assert hf_tokenizer(TEXT)["input_ids"] == ids
    assert hf_tokenizer.decode(ids) == TEXT and hf_tokenizer.eos_token_id == tokenizer.eot_id
    x = torch.tensor([ids[:32]])
    with torch.no_grad():
        expected, _ = ours(x)
        logits = theirs(x).logits
    torch.testing.assert_close(logits, expected[..., : ours.config.vocab_size], rtol=1e-5, atol=1e-5)


def test_export_hf_default_recipe_run_loads_with_trust_remote_code_same_logits_and_greedy_ids(recipe_run, tmp_path, capsys):
    assert main(["export", "hf", str(recipe_run), str(tmp_path / "hf")]) == 0
    assert "as custom code (GptlabForCausalLM: load with trust_remote_code=True)" in capsys.readouterr().out
    checkpoint = list_checkpoints(recipe_run)[-1]
    ours, tokenizer = load_model(checkpoint).eval(), Tokenizer.load(checkpoint / "tokenizer")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    ids = tokenizer.encode(TEXT, allowed_special="all")
    assert hf_tokenizer(TEXT)["input_ids"] == ids
    x = torch.tensor([ids[:24]])
    with torch.no_grad():
        expected, _ = ours(x)
        logits = theirs(x).logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
    (greedy,) = generate(ours, [ids[:8]], SamplingConfig(max_new_tokens=16, temperature=0))
    out = theirs.generate(torch.tensor([ids[:8]]), max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert out[0, 8:].tolist() == greedy
    assert main(["sample", "--checkpoint", str(tmp_path / "hf"), "--prompt", "ROMEO:", "--max-new-tokens", "4", "--seed", "1"]) == 0
    assert main(["sample", "--checkpoint", str(recipe_run), "--prompt", "ROMEO:", "--max-new-tokens", "4", "--seed", "1"]) == 0
    from_hf, from_run = capsys.readouterr().out.split("\n")[:2]
    assert from_hf == from_run  # and back into gptlab: the same model


def test_export_hf_force_replaces_a_custom_code_export(recipe_run, run, tmp_path, capsys):
    """An earlier export's modeling files count as its own: --force replaces them, here with a GPT-2 export."""
    out = tmp_path / "hf"
    assert main(["export", "hf", str(recipe_run), str(out)]) == 0
    assert main(["export", "hf", str(run), str(out)]) == 1
    assert "pass --force" in capsys.readouterr().err
    assert main(["export", "hf", str(run), str(out), "--force"]) == 0
    assert not (out / "modeling_gptlab.py").exists() and json.loads((out / "config.json").read_text())["model_type"] == "gpt2"


def test_export_hf_refuses_to_mix_with_other_files_and_replaces_only_with_force(run, tmp_path, capsys):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "README.md").write_text("mine")
    assert main(["export", "hf", str(run), str(out)]) == 1
    assert "holds things this command did not make (README.md)" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["README.md"]
    (out / "README.md").unlink()
    assert main(["export", "hf", str(run), str(out)]) == 0
    before = (out / "model.safetensors").read_bytes()
    assert main(["export", "hf", str(run), str(out)]) == 1
    assert "pass --force" in capsys.readouterr().err
    assert main(["export", "hf", str(run), str(out), "--force"]) == 0
    assert (out / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no temporary folder left behind


def test_an_exported_folder_is_a_model_every_command_reads(run, prepared, tmp_path, capsys):
    """Back in: sample, eval (its tokenizer is found and checked against the data) and --init-from."""
    main(["export", "hf", str(run), str(tmp_path / "hf")])
    capsys.readouterr()
    assert main(["sample", "--checkpoint", str(tmp_path / "hf"), "--prompt", "ROMEO:", "--max-new-tokens", "4", "--seed", "1"]) == 0
    assert main(["sample", "--checkpoint", str(run), "--prompt", "ROMEO:", "--max-new-tokens", "4", "--seed", "1"]) == 0
    from_hf, from_run = capsys.readouterr().out.split("\n")[:2]
    assert from_hf == from_run
    assert main(["eval", "--checkpoint", str(tmp_path / "hf"), "--data", str(prepared / "data"), "--device", "cpu"]) == 0
    assert main(["model", "info", "--checkpoint", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    args = ["train", "--init-from", str(tmp_path / "hf"), "--data", str(prepared / "data"), "--out", str(tmp_path / "tuned"),
            "--seq-len", "32", "--micro-batch", "4", "--batch-tokens", "128", "--max-steps", "1", "--precision", "fp32",
            "--device", "cpu", "--optimizer.lr", "0"]
    assert main(args) == 0
    tuned = load_model(list_checkpoints(tmp_path / "tuned")[-1])
    base = load_model(list_checkpoints(run)[-1])
    for name, tensor in base.state_dict().items():
        assert torch.equal(tuned.state_dict()[name], tensor), name
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert config["model_max_length"] == base.config.block_size
