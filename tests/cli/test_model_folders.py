"""Every command that reads a model reads every model folder gptlab makes: checkpoints, run folders (latest or
best), Hugging Face folders; and a model's tokenizer must match the data it is evaluated on."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gptlab.cli.main import main
from gptlab.infer import SamplingConfig
from gptlab.infer.generate import generate, sample_next
from gptlab.load.checkpoints import find_checkpoint, list_checkpoints
from gptlab.model.io import load_model
from gptlab.tokenizer import Tokenizer
from gptlab.train import Trainer
from tests.train.conftest import tiny_config


@pytest.fixture(scope="module")
def run(prepared, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("models") / "run"
    Trainer(tiny_config(prepared, out, max_steps=4, eval_every=2, checkpoint_every=2, keep_last=3), log=lambda *_: None).fit()
    return out


def test_run_folders_name_their_newest_or_best_checkpoint(run, tmp_path):
    best = json.loads((run / "checkpoints" / "best.json").read_text())["checkpoint"]
    assert find_checkpoint(run) == list_checkpoints(run)[-1] == find_checkpoint(run / "latest")
    assert find_checkpoint(run / "best") == run / "checkpoints" / best
    pipeline_folder = tmp_path / "pipeline"  # `gptlab run` keeps its training run in OUT/train
    pipeline_folder.mkdir()
    (pipeline_folder / "train").symlink_to(run)
    assert find_checkpoint(pipeline_folder).name == "step_000004"
    assert find_checkpoint(tmp_path) is None


@pytest.mark.parametrize("which", ["run", "run/best", "run/latest", "run/checkpoints/step_000002"])
def test_sample_and_model_info_read_every_gptlab_model_folder(run, which, capsys):
    spec = str(run.parent / which)
    assert main(["sample", "--checkpoint", spec, "--prompt", "ROMEO:", "--max-new-tokens", "5", "--seed", "0"]) == 0
    checkpoint = find_checkpoint(spec) or Path(spec)
    model, tokenizer = load_model(checkpoint), Tokenizer.load(checkpoint / "tokenizer")
    ids = tokenizer.encode("ROMEO:")
    config = SamplingConfig(max_new_tokens=5, seed=0, stop_tokens=(tokenizer.eot_id,), vocab_size=tokenizer.vocab_size)
    assert capsys.readouterr().out == tokenizer.decode(ids + generate(model, [ids], config)[0]) + "\n"
    assert main(["model", "info", "--checkpoint", spec, "--device-peak", "cpu"]) == 0
    assert "n_layer 2" in capsys.readouterr().out


def test_eval_refuses_data_from_another_tokenizer_before_loading_weights(run, prepared, tmp_path, capsys):
    from gptlab.data.corpus import shakespeare_documents
    from gptlab.data.prepare import PrepareConfig, prepare_shards
    from gptlab.tokenizer import Tokenizer

    other = Tokenizer.train(shakespeare_documents()[6:8], vocab_size=400)
    prepare_shards("shakespeare", other, tmp_path / "other_data", PrepareConfig(val=0.1, progress=False))
    assert main(["eval", "--checkpoint", str(run), "--data", str(tmp_path / "other_data")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "prepared with another tokenizer" in err and "the tokenizer saved with" in err
    assert main(["eval", "--checkpoint", str(run / "best"), "--data", str(prepared / "data")]) == 0
    assert "bits per byte" in capsys.readouterr().out


def test_sampling_never_draws_an_id_the_tokenizer_cannot_decode():
    logits = torch.zeros(64, 1024)
    logits[:, 600:] = 50.0  # the model much prefers ids the tokenizer (512 ids) does not have
    generator = torch.Generator().manual_seed(0)
    drawn = sample_next(logits, SamplingConfig(vocab_size=512, temperature=1.0), generator)
    assert drawn.max().item() < 512
    assert sample_next(logits, SamplingConfig(vocab_size=512, temperature=0), None).max().item() < 512
    assert sample_next(logits, SamplingConfig(temperature=0), None).min().item() >= 600  # without it they would be drawn


def test_python_dash_m_gptlab_is_the_gptlab_command():
    result = subprocess.run([sys.executable, "-m", "gptlab", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.startswith("gptlab ")


def test_flags_take_underscores_as_aliases_and_unknown_ones_get_a_suggestion(run, capsys):
    assert main(["sample", "--checkpoint", str(run), "--prompt", "A", "--max_new_tokens", "3", "--seed", "0"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["sample", "--checkpoint", str(run), "--prompt", "A", "--max-new-token", "3"])
    assert exit_info.value.code == 2
    assert "did you mean --max-new-tokens?" in capsys.readouterr().err


def test_model_info_rejects_a_zero_sequence_length(run, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["model", "info", "--checkpoint", str(run), "--seq-len", "0"])
    assert exit_info.value.code == 2 and "must be at least 1, got 0" in capsys.readouterr().err



@pytest.mark.parametrize("command", ["sample", "eval", "train"])
def test_an_unknown_device_is_one_line_in_every_command(run, prepared, tmp_path, command, capsys):
    argv = {
        "sample": ["sample", "--checkpoint", str(run), "--prompt", "A"],
        "eval": ["eval", "--checkpoint", str(run), "--data", str(prepared / "data")],
        "train": ["train", "--data", str(prepared / "data"), "--out", str(tmp_path / "new")],
    }[command]
    assert main([*argv, "--device", "gpu0"]) == 1
    err = capsys.readouterr().err
    assert err == "gptlab: error: unknown device 'gpu0'; use auto, cpu, cuda, cuda:N or mps\n"
    assert not (tmp_path / "new").exists()
