"""Writing the export folder (gptlab.export.folder): OUT is the earlier export or the new one, never half of each,
and nothing the user made is touched."""

import pytest
import torch

from gptlab.export import folder as folder_module
from gptlab.export import write_hf_folder
from gptlab.model import GPT, preset
from gptlab.model.hf import load_pretrained_directory
from gptlab.runtime import GptlabError
from gptlab.tokenizer import Tokenizer


@pytest.fixture
def model_and_tokenizer(prepared):
    torch.manual_seed(0)
    return GPT(preset("gpt2-tiny", vocab_size=512, block_size=64)), Tokenizer.load(prepared / "tokenizer")


def contents(folder):
    return {path.name: path.read_bytes() for path in folder.iterdir()}


def test_write_hf_folder_writes_a_folder_that_reads_back_as_the_same_model(model_and_tokenizer, tmp_path):
    model, tokenizer = model_and_tokenizer
    written = write_hf_folder(model, tokenizer, tmp_path / "hf")
    assert (written.directory, written.architecture, written.remote_code) == (tmp_path / "hf", "GPT2LMHeadModel", False)
    assert [path.name for path in tmp_path.iterdir()] == ["hf"]  # no temporary folder left beside it
    ids = torch.tensor([tokenizer.encode("ROMEO:\nBut, soft!")])
    with torch.no_grad():
        torch.testing.assert_close(load_pretrained_directory(tmp_path / "hf")(ids)[0], model(ids)[0], rtol=0, atol=1e-5)


def test_write_hf_folder_keeps_the_earlier_export_whole_when_the_new_one_fails(model_and_tokenizer, tmp_path, monkeypatch):
    model, tokenizer = model_and_tokenizer
    write_hf_folder(model, tokenizer, tmp_path / "hf")
    before = contents(tmp_path / "hf")

    def fail_halfway(model, directory, **kwargs):
        directory.mkdir(parents=True)
        (directory / "model.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(folder_module, "export_hf", fail_halfway)
    with pytest.raises(OSError, match="disk full"):
        write_hf_folder(model, tokenizer, tmp_path / "hf", force=True)
    assert contents(tmp_path / "hf") == before
    assert [path.name for path in tmp_path.iterdir()] == ["hf"]


def test_write_hf_folder_replaces_an_earlier_export_only_with_force_and_never_the_users_files(model_and_tokenizer, tmp_path):
    model, tokenizer = model_and_tokenizer
    write_hf_folder(model, tokenizer, tmp_path / "hf")
    with pytest.raises(GptlabError, match=r"^OUT .*hf holds an earlier export \(config.json, .*\); pass --force to replace it$"):
        write_hf_folder(model, tokenizer, tmp_path / "hf")
    write_hf_folder(model, tokenizer, tmp_path / "hf", force=True)
    (tmp_path / "hf" / "notes.txt").write_text("mine")
    with pytest.raises(GptlabError, match=r"holds things this command did not make \(.*notes.txt.*\); pass a new or empty OUT$"):
        write_hf_folder(model, tokenizer, tmp_path / "hf", force=True)
    assert (tmp_path / "hf" / "notes.txt").read_text() == "mine"
