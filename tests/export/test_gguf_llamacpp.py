"""GGUF files in llama.cpp itself (llama-cpp-python, built from source by `make install-dev` / .ci/run): it encodes
text to gptlab's ids, its logits are gptlab's within each type's rounding, and its greedy completion is gptlab's.

Every call into llama.cpp runs in a child process of its own (tests/export/llamacpp_child.py, through
tests.native.in_child): a native crash in its kernels fails that test, naming the signal, and the pytest worker and
the rest of the suite go on.

Tolerances, of the largest |logit| (about 4 on these tiny models), against the worst measured over the
architectures: f32 2e-4 (measured 1.6e-5: the same numbers summed in another order, GELU through llama.cpp's f16 table),
f16 5e-3 (6.5e-4: llama.cpp also rounds the activations to f16 for an f16 matmul), q8_0 5e-2 (1.3e-2: 8-bit weights,
8-bit activations in its dot products).
"""

import pytest
import torch

from gptlab.chat import ChatFormat, add_chat_tokens
from gptlab.data.corpus import shakespeare_documents
from gptlab.export.gguf import write_gguf
from gptlab.model import GPT, preset
from gptlab.tokenizer import SentencePieceTokenizer, Tokenizer
from gptlab.tokenizer.sp_train import train_sentencepiece
from tests.export import llamacpp_child as llama
from tests.native import in_child

TEXTS = [
    "ROMEO:\nBut, soft! what light through yonder window breaks?\n\n  It's the east, and Juliet is the sun.",
    "They'll say I'm 12345 years old;\t\ttabs,   spaces   \n\n\n and CamelCaseWords, don't THEY'RE?  ",
    "Ünïcödé café — naïve 日本語の文章 😀 émoji\r\nnew line  ",
]
TOLERANCE = {"f32": 2e-4, "f16": 5e-3, "q8_0": 5e-2}  # of the largest |logit|
# gpt2 (also without biases, untied), llama (also with every bias: its q and k biases interleaved too), qwen3, qwen2,
# llama with experts (Mixtral), qwen3moe
PRESETS = [("gpt2-tiny", {}), ("gpt2-tiny", {"bias": False, "tie_embeddings": False}), ("llama-tiny", {}),
           ("llama-tiny", {"bias": True}), ("llama-tiny", {"qk_norm": True}), ("llama-tiny", {"qkv_bias": True}),
           ("moe-tiny", {}), ("moe-tiny", {"qk_norm": True})]


@pytest.fixture(scope="module")
def tokenizer(prepared):
    return add_chat_tokens(Tokenizer.load(prepared / "tokenizer"))


def tiny(name: str, vocab_size: int, **overrides) -> GPT:
    """A tiny model with its norms and biases moved off their init and its logits spread (embeddings x8), so greedy
    picks are far from ties."""
    torch.manual_seed(0)
    model = GPT(preset(name, vocab_size=vocab_size, block_size=64, **overrides)).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 1:
                parameter.add_(torch.randn_like(parameter) * 0.1)
            if name in ("transformer.wte.weight", "lm_head.weight"):
                parameter.mul_(8)
    return model


def gptlab_logits(model: GPT, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids]))
    logits = logits[0] if isinstance(logits, tuple) else logits
    return logits[0, :, : model.config.vocab_size].float()


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4", "o200k"])
def test_llama_cpp_encodes_text_to_gptlab_ids_with_each_split_pattern(tmp_path, pattern):
    tokenizer = Tokenizer.train(shakespeare_documents()[:1] + TEXTS, vocab_size=400, pattern=pattern)
    path = write_gguf(tiny("gpt2-tiny", tokenizer.vocab_size), tokenizer, tmp_path / "m.gguf", type="f32")
    ours = [tokenizer.encode_ordinary(text) for text in TEXTS]
    theirs, decoded = in_child(llama.encode, path, TEXTS, ours)
    assert theirs == ours
    assert decoded == [text.encode() for text in TEXTS]


def test_llama_cpp_encodes_text_to_gptlab_ids_with_sentencepiece(tmp_path):
    tokenizer = SentencePieceTokenizer(train_sentencepiece(shakespeare_documents()[:1] + TEXTS, vocab_size=500))
    path = write_gguf(tiny("llama-tiny", tokenizer.vocab_size), tokenizer, tmp_path / "m.gguf", type="f32")
    theirs, _ = in_child(llama.encode, path, TEXTS, [])
    assert theirs == [tokenizer.encode_ordinary(text) for text in TEXTS]


@pytest.mark.parametrize("kind", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize(("name", "overrides"), PRESETS)
def test_llama_cpp_logits_agree_with_gptlab_within_the_types_rounding(tokenizer, tmp_path, name, overrides, kind):
    model = tiny(name, tokenizer.vocab_size, **overrides)
    ids = tokenizer.encode_ordinary(TEXTS[0])[:48]
    path = write_gguf(model, tokenizer, tmp_path / "m.gguf", type=kind)
    ours, theirs = gptlab_logits(model, ids), torch.from_numpy(in_child(llama.logits, path, ids))
    assert (ours - theirs).abs().max() <= TOLERANCE[kind] * ours.abs().max()


@pytest.mark.parametrize(("name", "overrides"), [("gpt2-tiny", {}), ("llama-tiny", {}), ("moe-tiny", {}), ("moe-tiny", {"qk_norm": True})])
def test_llama_cpp_greedy_completion_equals_gptlab_when_f32(tokenizer, tmp_path, name, overrides):
    """llama.cpp decodes one token at a time from its KV cache; gptlab's reference recomputes the whole prefix."""
    model = tiny(name, tokenizer.vocab_size, **overrides)
    prompt = tokenizer.encode_ordinary("JULIET:\nO Romeo, Romeo!")
    ours = list(prompt)
    for _ in range(24):
        logits = gptlab_logits(model, ours)[-1]
        top2 = logits.topk(2).values
        assert top2[0] - top2[1] > 1e-3  # a pick far from a tie, so equal picks are a real agreement
        ours.append(int(logits.argmax()))
    path = write_gguf(model, tokenizer, tmp_path / "m.gguf", type="f32")
    assert in_child(llama.greedy, path, prompt, 24) == ours


def test_llama_cpp_renders_the_chat_template_as_gptlab_renders_a_conversation(tokenizer, tmp_path):
    path = write_gguf(tiny("gpt2-tiny", tokenizer.vocab_size), tokenizer, tmp_path / "m.gguf", type="f16")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who is Romeo?"}]
    assert in_child(llama.chat_prompt_ids, path, messages) == ChatFormat(tokenizer).prompt(messages)


def test_the_llama_cpp_in_use_is_the_portable_build_without_amx_kernels():
    """`make install-dev` builds llama.cpp for the x86-64 baseline with AVX2 (GGML_NATIVE=OFF), never for the
    building machine's own instruction sets: built natively on an Intel Xeon with AMX, its AMX path for q8_0
    weights dies at the first decode (SIGSEGV), and a wheel built natively on one CPU is not safe on another. The
    flags read here are the ones the library was compiled with, whatever CPU runs this test."""
    info = in_child(llama.system_info)
    assert "AMX_INT8 = 1" not in info and "AVX512 = 1" not in info, info
