"""Writing GGUF (gptlab.export.gguf): the file read back with llama.cpp's own reader (gguf.GGUFReader) holds every
tensor and key as gptlab has them; what llama.cpp cannot compute is refused in one line, and nothing is left behind.
llama.cpp running the file: tests/export/test_gguf_llamacpp.py."""

import dataclasses

import gguf
import numpy as np
import pytest
import torch

from gptlab.chat import END, add_chat_tokens, chat_template
from gptlab.cli.main import main
from gptlab.export import gguf as gguf_module
from gptlab.export.gguf import write_gguf
from gptlab.model import GPT, preset
from gptlab.model.config import MoEConfig
from gptlab.runtime import GptlabError
from gptlab.tokenizer import SentencePieceTokenizer, Tokenizer
from gptlab.tokenizer.formats import byte_to_unicode
from gptlab.tokenizer.sp_train import train_sentencepiece

TEXT = "ROMEO:\nBut, soft! what light through yonder window breaks?\n  It's the east, and Juliet is the sun. 1234"


@pytest.fixture(scope="module")
def tokenizer(prepared):
    return add_chat_tokens(Tokenizer.load(prepared / "tokenizer"))


def tiny(name: str, tokenizer, **overrides) -> GPT:
    """A tiny model whose norms and biases are not their init values, so a swapped or dropped one shows."""
    torch.manual_seed(0)
    model = GPT(preset(name, **{"vocab_size": tokenizer.vocab_size, "block_size": 64, **overrides})).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    return model


def read(path):
    reader = gguf.GGUFReader(path)
    return reader, {tensor.name: tensor for tensor in reader.tensors}


def field(reader, key):
    return reader.fields[key].contents()


def pairs_interleaved(rows: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The reference for llama.cpp's "llama" rotary layout, index by index: row 2i+j of a head is rotate-half row j*d/2+i."""
    out, d = torch.empty_like(rows), rows.shape[0] // n_heads
    for h in range(n_heads):
        for i in range(d // 2):
            for j in range(2):
                out[h * d + 2 * i + j] = rows[h * d + j * d // 2 + i]
    return out


def expected_tensors(model: GPT, architecture: str) -> dict[str, torch.Tensor]:
    """GGUF name -> the gptlab weight it must hold, written out from the model's modules (not from the writer's code)."""
    config, top = model.config, model.transformer
    vocab = config.vocab_size
    expected = {"token_embd.weight": top.wte.weight[:vocab], "output_norm.weight": top.ln_f.weight}
    if not config.tie_embeddings:
        expected["output.weight"] = model.lm_head.weight[:vocab]
    q, kv = config.n_head * config.head_dim, config.kv_heads * config.head_dim
    if architecture == "gpt2":
        expected.update({"position_embd.weight": top.wpe.weight, "output_norm.bias": top.ln_f.bias})
    for n, block in enumerate(top.h):
        blk = f"blk.{n}."
        expected[blk + "attn_norm.weight"], expected[blk + "ffn_norm.weight"] = block.ln_1.weight, block.ln_2.weight
        expected[blk + "attn_output.weight"] = block.attn.c_proj.weight
        if architecture == "gpt2":
            expected.update({blk + "attn_qkv.weight": block.attn.c_attn.weight, blk + "attn_qkv.bias": block.attn.c_attn.bias,
                             blk + "attn_output.bias": block.attn.c_proj.bias, blk + "attn_norm.bias": block.ln_1.bias,
                             blk + "ffn_norm.bias": block.ln_2.bias, blk + "ffn_up.weight": block.mlp.c_fc.weight,
                             blk + "ffn_up.bias": block.mlp.c_fc.bias, blk + "ffn_down.weight": block.mlp.c_proj.weight,
                             blk + "ffn_down.bias": block.mlp.c_proj.bias})
            continue
        weight = block.attn.c_attn.weight
        wq, wk, wv = weight[:q], weight[q:q + kv], weight[q + kv:]
        if architecture == "llama":
            wq, wk = pairs_interleaved(wq, config.n_head), pairs_interleaved(wk, config.kv_heads)
        expected.update({blk + "attn_q.weight": wq, blk + "attn_k.weight": wk, blk + "attn_v.weight": wv})
        if config.qk_norm:
            expected.update({blk + "attn_q_norm.weight": block.attn.q_norm.weight, blk + "attn_k_norm.weight": block.attn.k_norm.weight})
        if hasattr(block.mlp, "experts_fc"):
            hidden = config.expert_hidden
            expected.update({blk + "ffn_gate_inp.weight": block.mlp.router.weight,
                             blk + "ffn_gate_exps.weight": block.mlp.experts_fc[:, :hidden], blk + "ffn_up_exps.weight": block.mlp.experts_fc[:, hidden:],
                             blk + "ffn_down_exps.weight": block.mlp.experts_proj})
        else:
            hidden = config.hidden_dim
            expected.update({blk + "ffn_gate.weight": block.mlp.c_fc.weight[:hidden], blk + "ffn_up.weight": block.mlp.c_fc.weight[hidden:],
                             blk + "ffn_down.weight": block.mlp.c_proj.weight})
    return {name: tensor.detach().float() for name, tensor in expected.items()}


ARCHITECTURES = [("gpt2-tiny", {}, "gpt2"), ("llama-tiny", {}, "llama"), ("llama-tiny", {"qk_norm": True}, "qwen3"),
                 ("moe-tiny", {}, "llama"), ("moe-tiny", {"qk_norm": True}, "qwen3moe")]


@pytest.mark.parametrize(("name", "overrides", "architecture"), ARCHITECTURES)
def test_write_gguf_stores_every_tensor_exactly_when_f32(tokenizer, tmp_path, name, overrides, architecture):
    model = tiny(name, tokenizer, **overrides)
    reader, tensors = read(write_gguf(model, tokenizer, tmp_path / "m.gguf", type="f32"))
    assert field(reader, "general.architecture") == architecture
    expected = expected_tensors(model, architecture)
    assert sorted(tensors) == sorted(expected)
    for name, tensor in tensors.items():
        assert tensor.tensor_type == gguf.GGMLQuantizationType.F32, name
        assert tuple(tensor.shape.tolist()) == tuple(reversed(expected[name].shape)), name  # GGUF lists the innermost first
        assert np.array_equal(tensor.data.reshape(expected[name].shape), expected[name].numpy()), name


@pytest.mark.parametrize("kind", ["f16", "q8_0"])
def test_write_gguf_rounds_matrices_to_the_type_and_keeps_vectors_and_the_router_f32(tokenizer, tmp_path, kind):
    model = tiny("moe-tiny", tokenizer, qk_norm=True)
    _, tensors = read(write_gguf(model, tokenizer, tmp_path / "m.gguf", type=kind))
    expected = expected_tensors(model, "qwen3moe")
    stored = gguf.GGMLQuantizationType.F16 if kind == "f16" else gguf.GGMLQuantizationType.Q8_0
    for name, tensor in tensors.items():
        want = expected[name]
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(want.shape)
        if want.dim() == 1 or name.endswith("ffn_gate_inp.weight"):
            assert tensor.tensor_type == gguf.GGMLQuantizationType.F32 and np.array_equal(values, want.numpy()), name
        elif kind == "f16":  # IEEE half, round to nearest even, as torch's
            assert tensor.tensor_type == stored and np.array_equal(values, want.half().float().numpy()), name
        else:  # q8_0: blocks of 32 along a row, each w ~ scale * round(w / scale), scale = max|block| / 127 (an f16)
            assert tensor.tensor_type == stored, name
            blocks = want.reshape(-1, 32)
            step = blocks.abs().amax(dim=1, keepdim=True) / 127
            error = (torch.from_numpy(values).reshape(-1, 32) - blocks).abs()
            # half a step from rounding, plus the f16 scale's own rounding (2^-11 relative) times up to 127 steps
            assert (error <= step * (0.5 + 127 / 2048) + 1e-12).all(), name


def test_write_gguf_writes_the_model_shape_keys(tokenizer, tmp_path):
    model = tiny("moe-tiny", tokenizer, qk_norm=True)
    reader, _ = read(write_gguf(model, tokenizer, tmp_path / "m.gguf"))
    config = model.config
    keys = {"context_length": 64, "embedding_length": 32, "block_count": 2, "attention.head_count": 4, "attention.head_count_kv": 2,
            "rope.dimension_count": config.head_dim, "attention.key_length": config.head_dim, "expert_count": 4,
            "expert_used_count": 2, "expert_feed_forward_length": 64, "vocab_size": tokenizer.vocab_size}
    for key, value in keys.items():
        assert field(reader, f"qwen3moe.{key}") == value, key
    assert field(reader, "qwen3moe.rope.freq_base") == pytest.approx(config.rope_theta)
    assert field(reader, "qwen3moe.attention.layer_norm_rms_epsilon") == pytest.approx(config.norm_eps)
    assert field(reader, "general.file_type") == gguf.LlamaFileType.MOSTLY_F16
    gpt2, _ = read(write_gguf(tiny("gpt2-tiny", tokenizer), tokenizer, tmp_path / "g.gguf", type="q8_0"))
    assert field(gpt2, "gpt2.feed_forward_length") == 128 and field(gpt2, "gpt2.attention.layer_norm_epsilon") == pytest.approx(1e-5)
    assert field(gpt2, "general.file_type") == gguf.LlamaFileType.MOSTLY_Q8_0


def test_write_gguf_carries_the_byte_level_tokenizer_special_ids_and_chat_template(tokenizer, tmp_path):
    model = tiny("gpt2-tiny", tokenizer, vocab_size=tokenizer.vocab_size + 3)  # three rows past the tokenizer's ids
    reader, _ = read(write_gguf(model, tokenizer, tmp_path / "m.gguf"))
    table = byte_to_unicode()
    specials = {i: text for text, i in tokenizer.special_tokens.items()}
    tokens = [specials.get(i) or "".join(table[b] for b in tokenizer.vocab[i]) for i in range(tokenizer.vocab_size)]
    assert field(reader, "tokenizer.ggml.tokens") == tokens + [f"[PAD{i}]" for i in range(tokenizer.vocab_size, tokenizer.vocab_size + 3)]
    assert field(reader, "tokenizer.ggml.token_type") == [3 if i in specials else 1 for i in range(tokenizer.vocab_size)] + [5] * 3
    assert field(reader, "tokenizer.ggml.merges") == [" ".join("".join(table[b] for b in part) for part in pair) for pair in tokenizer.merges]
    assert (field(reader, "tokenizer.ggml.model"), field(reader, "tokenizer.ggml.pre")) == ("gpt2", "llama-bpe")  # gpt4 pattern
    eot = tokenizer.eot_id
    assert [field(reader, f"tokenizer.ggml.{key}_token_id") for key in ("bos", "eos", "eot")] == [eot, eot, tokenizer.special_tokens[END]]
    assert field(reader, "tokenizer.ggml.add_bos_token") is False
    assert field(reader, "tokenizer.chat_template") == chat_template()


@pytest.fixture(scope="module")
def sentencepiece():
    from gptlab.data.corpus import shakespeare_documents

    return SentencePieceTokenizer(train_sentencepiece(shakespeare_documents()[:1], vocab_size=400))


def test_write_gguf_carries_sentencepiece_pieces_scores_and_types(sentencepiece, tmp_path):
    model = tiny("llama-tiny", sentencepiece)
    reader, _ = read(write_gguf(model, sentencepiece, tmp_path / "m.gguf"))
    pieces = sentencepiece.model.pieces
    assert field(reader, "tokenizer.ggml.model") == "llama"
    assert field(reader, "tokenizer.ggml.tokens") == [piece.text for piece in pieces]
    assert field(reader, "tokenizer.ggml.scores") == pytest.approx([piece.score for piece in pieces])
    assert field(reader, "tokenizer.ggml.token_type") == [piece.kind for piece in pieces]
    assert [field(reader, f"tokenizer.ggml.{key}_token_id") for key in ("bos", "eos", "unknown")] == [1, 2, 0]
    assert field(reader, "tokenizer.ggml.add_space_prefix") is True
    assert "tokenizer.chat_template" not in reader.fields  # not a chat model


REFUSED = [
    ("gpt2-tiny", {"position": "rotary", "norm": "rms", "qk_norm": True, "activation": "relu2"},
     "--model.position rotary, --model.norm rms, --model.activation relu2, --model.qk-norm true have no GGUF/llama.cpp equivalent"),
    ("llama-tiny", {"logit_softcap": 15.0}, "--model.logit-softcap 15.0 has no GGUF/llama.cpp equivalent"),
    ("llama-tiny", {"attn_window": 16, "window_pattern": "SL"}, "--model.attn-window 16 (--model.window-pattern SL) has"),
    ("moe-tiny", {"moe": MoEConfig(n_experts=4, top_k=2, score="sigmoid", n_shared=1)}, "--model.moe.score sigmoid, --model.moe.n-shared 1 have"),
    ("moe-tiny", {"moe": MoEConfig(n_experts=4, top_k=2, normalize=False)}, "--model.moe.normalize false has"),
    ("llama-tiny", {"qk_norm": True, "bias": True}, "--model.qk-norm true with --model.bias true --model.qkv-bias false has"),
]


@pytest.mark.parametrize(("name", "overrides", "message"), REFUSED)
def test_write_gguf_refuses_in_one_line_what_llama_cpp_cannot_compute(tokenizer, tmp_path, name, overrides, message):
    model = tiny(name, tokenizer, **overrides)
    with pytest.raises(GptlabError, match="^cannot export this .* model as GGUF: ") as error:
        write_gguf(model, tokenizer, tmp_path / "out" / "m.gguf")
    assert message in str(error.value) and "\n" not in str(error.value)
    assert list(tmp_path.iterdir()) == []


def test_write_gguf_refuses_a_trained_routing_bias(tokenizer, tmp_path):
    model = tiny("moe-tiny", tokenizer)
    with torch.no_grad():
        model.moe_layers()[0].route_bias[0] = 0.5
    with pytest.raises(GptlabError, match=r"--model.moe.bias-update 0.0 \(a trained routing bias\) has no GGUF"):
        write_gguf(model, tokenizer, tmp_path / "m.gguf")


def test_write_gguf_refuses_tokenizers_llama_cpp_would_encode_differently(tokenizer, sentencepiece, tmp_path):
    model = tiny("gpt2-tiny", tokenizer)
    custom = Tokenizer(tokenizer.vocab, tokenizer.merges, tokenizer.special_tokens, pattern=r"\w+|\s+|[^\w\s]+")
    with pytest.raises(GptlabError, match=r"split pattern \(custom\) has no llama.cpp pre-tokenizer"):
        write_gguf(model, custom, tmp_path / "m.gguf")
    with pytest.raises(GptlabError, match=r"^the tokenizer has \d+ ids but the model only 300; pass the model's own tokenizer"):
        write_gguf(tiny("gpt2-tiny", tokenizer, vocab_size=300), tokenizer, tmp_path / "m.gguf")
    squeezing = dataclasses.replace(sentencepiece.model, normalizer=dataclasses.replace(sentencepiece.model.normalizer, remove_extra_whitespaces=True))
    with pytest.raises(GptlabError, match="remove_extra_whitespaces has no llama.cpp equivalent"):
        write_gguf(tiny("llama-tiny", sentencepiece), SentencePieceTokenizer(squeezing), tmp_path / "m.gguf")
    with pytest.raises(GptlabError, match="^unknown GGUF type 'q4_0'; use one of f32, f16, q8_0$"):
        write_gguf(model, tokenizer, tmp_path / "m.gguf", type="q4_0")
    assert list(tmp_path.iterdir()) == []


def test_write_gguf_replaces_only_a_gguf_file_and_only_with_force(tokenizer, tmp_path):
    model = tiny("gpt2-tiny", tokenizer)
    out = write_gguf(model, tokenizer, tmp_path / "m.gguf", type="f32")
    before = out.read_bytes()
    with pytest.raises(GptlabError, match="holds an earlier GGUF file; pass --force to replace it$"):
        write_gguf(model, tokenizer, out)
    assert write_gguf(model, tokenizer, out, type="f32", force=True).read_bytes() == before
    (tmp_path / "notes.gguf").write_text("mine")
    with pytest.raises(GptlabError, match="exists and is not a GGUF file; pass a new path"):
        write_gguf(model, tokenizer, tmp_path / "notes.gguf", force=True)
    with pytest.raises(GptlabError, match="is a folder; pass the path of the .gguf file"):
        write_gguf(model, tokenizer, tmp_path, force=True)
    assert (tmp_path / "notes.gguf").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "notes.gguf"]


def test_write_gguf_keeps_the_earlier_file_whole_when_writing_fails(tokenizer, tmp_path, monkeypatch):
    model = tiny("gpt2-tiny", tokenizer)
    before = write_gguf(model, tokenizer, tmp_path / "m.gguf").read_bytes()

    def fail(name, tensor, type):
        raise OSError("disk full")

    monkeypatch.setattr(gguf_module, "encode_tensor", fail)
    with pytest.raises(OSError, match="disk full"):
        write_gguf(model, tokenizer, tmp_path / "m.gguf", force=True)
    with pytest.raises(OSError, match="disk full"):
        write_gguf(model, tokenizer, tmp_path / "new" / "m.gguf")
    assert (tmp_path / "m.gguf").read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["m.gguf"]


def test_export_gguf_cli_writes_the_file_and_an_ollama_modelfile(chat_model, tmp_path, capsys):
    out = tmp_path / "chat.gguf"
    assert main(["export", "gguf", str(chat_model), str(out), "--type", "q8_0", "--modelfile"]) == 0
    printed = capsys.readouterr().out
    assert "as GGUF q8_0 (llama.cpp architecture gpt2)" in printed and "ollama create NAME -f" in printed
    reader, _ = read(out)
    assert field(reader, "tokenizer.chat_template") == chat_template()
    modelfile = (tmp_path / "chat.Modelfile").read_text()
    assert modelfile.startswith("FROM ./chat.gguf\nTEMPLATE \"\"\"<|endoftext|>{{ if .System }}<|system|>{{ .System }}<|end|>{{ end }}")
    assert 'PARAMETER stop "<|end|>"' in modelfile
    assert main(["export", "gguf", str(chat_model), str(out), "--modelfile"]) == 1
    assert capsys.readouterr().err.strip().endswith("holds an earlier GGUF file; pass --force to replace it")
    assert main(["export", "gguf", str(chat_model), str(out), "--modelfile", "--force"]) == 0


def test_export_gguf_cli_refuses_a_missing_model_and_a_bad_type_in_one_line(tmp_path, capsys):
    assert main(["export", "gguf", str(tmp_path / "nowhere"), str(tmp_path / "m.gguf")]) == 1
    error = capsys.readouterr().err
    assert error.startswith("gptlab: error: ") and "nowhere" in error and error.count("\n") == 1
    with pytest.raises(SystemExit):
        main(["export", "gguf", str(tmp_path / "nowhere"), str(tmp_path / "m.gguf"), "--type", "q4_k"])
    assert "invalid choice: 'q4_k'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_export_gguf_cli_refuses_the_demo_recipe_in_one_line_naming_its_options(tokenizer, tmp_path, capsys):
    from gptlab.model.io import save_model

    model = tiny("gpt2-tiny", tokenizer, position="rotary", norm="rms", qk_norm=True, activation="relu2", tie_embeddings=False)
    save_model(model, tmp_path / "recipe")
    tokenizer.save(tmp_path / "recipe" / "tokenizer")
    assert main(["export", "gguf", str(tmp_path / "recipe"), str(tmp_path / "out" / "m.gguf")]) == 1
    error = capsys.readouterr().err
    assert error.startswith("gptlab: error: cannot export this gpt2 model as GGUF: --model.position rotary, --model.norm rms, "
                            "--model.activation relu2, --model.qk-norm true have no GGUF/llama.cpp equivalent") and error.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe"]


def test_export_gguf_cli_refuses_an_out_where_the_modelfile_goes_before_writing_anything(chat_model, tmp_path, capsys):
    """OUT x.Modelfile with --modelfile: both files would be one; refused in one line, nothing written."""
    out = tmp_path / "x.Modelfile"
    assert main(["export", "gguf", str(chat_model), str(out), "--modelfile"]) == 1
    error = capsys.readouterr().err
    assert error == (f"gptlab: error: OUT {out} is where --modelfile writes the Modelfile; name the GGUF file "
                     f"{tmp_path / 'x.gguf'} (the Modelfile then goes to {out})\n")
    assert list(tmp_path.iterdir()) == []
    assert main(["export", "gguf", str(chat_model), str(tmp_path / "x.gguf"), "--modelfile"]) == 0  # as the line says
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.Modelfile", "x.gguf"]


def test_export_gguf_that_fails_on_the_modelfile_leaves_no_gguf_file_behind(tokenizer, tmp_path, monkeypatch):
    model = tiny("gpt2-tiny", tokenizer)

    def fail(gguf_path, tokenizer, *, force=False):
        raise OSError("disk full")

    monkeypatch.setattr(gguf_module, "write_modelfile", fail)
    with pytest.raises(OSError, match="disk full"):
        gguf_module.export_gguf(model, tokenizer, tmp_path / "new" / "m.gguf", modelfile=True)
    assert list(tmp_path.iterdir()) == []


def test_export_gguf_cli_refuses_a_tokenizer_other_than_the_models_of_the_same_size(chat_model, tmp_path, capsys):
    """--tokenizer is checked by fingerprint, as --draft is: another tokenizer with the model's vocabulary size is refused."""
    own = Tokenizer.load(chat_model / "tokenizer")
    from gptlab.data.corpus import shakespeare_documents

    other = add_chat_tokens(Tokenizer.train(shakespeare_documents()[6:8], vocab_size=512))  # other works, the same size
    assert other.vocab_size == own.vocab_size and other.fingerprint() != own.fingerprint()
    other.save(tmp_path / "other")
    out = tmp_path / "m.gguf"
    assert main(["export", "gguf", str(chat_model), str(out), "--tokenizer", str(tmp_path / "other")]) == 1
    error = capsys.readouterr().err
    assert error.startswith(f"gptlab: error: --tokenizer {tmp_path / 'other'} is not the tokenizer saved with {chat_model} "
                            f"(fingerprint {other.fingerprint()}, {other.vocab_size:,} ids; the model's: {own.fingerprint()}")
    assert error.endswith("leave out --tokenizer to use the model's own\n") and error.count("\n") == 1
    assert not out.exists()
    assert main(["export", "gguf", str(chat_model), str(out), "--tokenizer", str(chat_model / "tokenizer")]) == 0
