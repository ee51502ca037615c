"""`gptlab sample`, `eval`, `chat` and `serve` run unchanged on a mixture-of-experts model folder: each prints (or
answers) what the Python API, or a brute-force per-token computation, gives for the same MoE model."""

import io
import sys
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from gptlab.chat import ChatFormat, add_chat_tokens
from gptlab.cli.main import main
from gptlab.data.prepare import PrepareConfig, prepare_shards
from gptlab.infer import Engine, EngineConfig, SamplingConfig
from gptlab.infer.generate import generate
from gptlab.model import GPT, preset
from gptlab.model.io import load_model, save_model
from gptlab.serve.app import build_app
from gptlab.tokenizer import Tokenizer
from tests.chat.reference import reference_reply
from tests.eval.test_cli_eval import TEXT, brute_force_bpb, number_after, write_documents

GREETING = [{"role": "user", "content": "Good morrow, sir."}]


def save_moe(folder: Path, tokenizer: Tokenizer) -> Path:
    """moe-tiny (4 experts, top 2, both layers sparse) with weights spread wide enough that tokens pick different experts."""
    torch.manual_seed(0)
    model = GPT(preset("moe-tiny", vocab_size=tokenizer.vocab_size, block_size=128))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    assert model.config.is_moe and len(model.moe_layers()) == 2
    save_model(model, folder)
    tokenizer.save(folder / "tokenizer")
    return folder


@pytest.fixture(scope="module")
def moe_chat(prepared, tmp_path_factory) -> Path:
    """An MoE model folder with the chat tokens: what sample, chat and serve read."""
    return save_moe(tmp_path_factory.mktemp("moe_chat"), add_chat_tokens(Tokenizer.load(prepared / "tokenizer")))


def test_sample_on_an_moe_model_prints_generate(moe_chat, capsys):
    assert main(["sample", "--checkpoint", str(moe_chat), "--prompt", "ROMEO:", "--max-new-tokens", "6", "--seed", "0"]) == 0
    model, tokenizer = load_model(moe_chat), Tokenizer.load(moe_chat / "tokenizer")
    ids = tokenizer.encode("ROMEO:")
    stops = ChatFormat(tokenizer).stop_tokens  # a chat model's sample ends at its end-of-turn too
    config = SamplingConfig(max_new_tokens=6, seed=0, stop_tokens=stops, vocab_size=tokenizer.vocab_size)
    assert capsys.readouterr().out == tokenizer.decode(ids + generate(model, [ids], config)[0]) + "\n"


def test_eval_on_an_moe_model_prints_brute_force_bits_per_byte(tmp_path, capsys):
    documents = [TEXT * (3 + i) + f"document {i}\n" for i in range(8)]
    tokenizer = Tokenizer.train(documents, vocab_size=300)
    prepare_shards([str(write_documents(tmp_path / "corpus", documents))], tokenizer, tmp_path / "data",
                   PrepareConfig(val=0.25, shard_tokens=1000, seed=0, progress=False))
    folder = save_moe(tmp_path / "model", tokenizer)
    assert main(["eval", "--checkpoint", str(folder), "--data", str(tmp_path / "data"), "--batch-size", "2",
                 "--seq-len", "16", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    loss, bpb, tokens = brute_force_bpb(load_model(folder).eval(), tokenizer, tmp_path / "data", 2, 16)
    assert float(number_after("bits per byte", out)) == pytest.approx(bpb, abs=6e-5)
    assert float(number_after("loss", out)) == pytest.approx(loss, abs=6e-5)


def test_chat_on_an_moe_model_prints_the_greedy_reply(moe_chat, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(GREETING[0]["content"] + "\n"))
    assert main(["chat", str(moe_chat), "--temperature", "0", "--max-tokens", "10", "--device", "cpu"]) == 0
    reply = reference_reply(moe_chat, GREETING, 10)
    assert reply.strip()
    assert capsys.readouterr().out == reply + "\n"


def test_serve_on_an_moe_model_answers_the_greedy_reply(moe_chat):
    model, tokenizer = load_model(moe_chat).eval(), Tokenizer.load(moe_chat / "tokenizer")
    with Engine(model, EngineConfig(slots=1)) as engine:
        client = TestClient(build_app(engine, tokenizer, ChatFormat(tokenizer), "tiny-moe"))
        response = client.post("/v1/chat/completions", json={"model": "tiny-moe", "messages": GREETING, "temperature": 0,
                                                             "max_tokens": 10})
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == reference_reply(moe_chat, GREETING, 10)


def test_export_hf_of_an_moe_model_folder_loads_in_transformers_with_equal_logits(moe_chat, tmp_path, capsys):
    import transformers

    assert main(["export", "hf", str(moe_chat), str(tmp_path / "hf")]) == 0
    assert "MixtralForCausalLM" in capsys.readouterr().out  # moe-tiny: no QK-norm, every layer sparse, renormalised
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    model = load_model(moe_chat).eval()
    idx = torch.tensor([Tokenizer.load(moe_chat / "tokenizer").encode("ROMEO: what news?")])
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], reference(idx).logits, atol=2e-5, rtol=1e-5)
