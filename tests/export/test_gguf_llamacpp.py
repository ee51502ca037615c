"""GGUF files in llama.cpp itself (llama-cpp-python, built from source by `make install-dev` / .ci/run): it encodes
text to gptlab's ids, its logits are gptlab's within each type's rounding, and its greedy completion is gptlab's.

Tolerances, of the largest |logit| (about 4 on these tiny models), against the worst measured over the
architectures: f32 2e-4 (measured 1.6e-5: the same numbers summed in another order, GELU through llama.cpp's f16 table),
f16 5e-3 (6.5e-4: llama.cpp also rounds the activations to f16 for an f16 matmul), q8_0 5e-2 (1.3e-2: 8-bit weights,
8-bit activations in its dot products).
"""

import numpy as np
import pytest
import torch
from llama_cpp import Llama

from gptlab.chat import ChatFormat, add_chat_tokens
from gptlab.data.corpus import shakespeare_documents
from gptlab.export.gguf import write_gguf
from gptlab.model import GPT, preset
from gptlab.tokenizer import SentencePieceTokenizer, Tokenizer
from gptlab.tokenizer.sp_train import train_sentencepiece

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


def load(path) -> Llama:
    return Llama(str(path), n_ctx=64, n_batch=64, logits_all=True, verbose=False, n_threads=1, seed=0)


def llama_cpp_logits(llm: Llama, ids: list[int]) -> torch.Tensor:
    llm.reset()
    llm.eval(ids)
    return torch.from_numpy(np.array(llm.scores[: len(ids)], dtype=np.float32))


def gptlab_logits(model: GPT, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids]))
    logits = logits[0] if isinstance(logits, tuple) else logits
    return logits[0, :, : model.config.vocab_size].float()


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4", "o200k"])
def test_llama_cpp_encodes_text_to_gptlab_ids_with_each_split_pattern(tmp_path, pattern):
    tokenizer = Tokenizer.train(shakespeare_documents()[:1] + TEXTS, vocab_size=400, pattern=pattern)
    llm = load(write_gguf(tiny("gpt2-tiny", tokenizer.vocab_size), tokenizer, tmp_path / "m.gguf", type="f32"))
    try:
        for text in TEXTS:
            assert llm.tokenize(text.encode(), add_bos=False, special=False) == tokenizer.encode_ordinary(text), text
            assert llm.detokenize(tokenizer.encode_ordinary(text)) == text.encode()
    finally:
        llm.close()


def test_llama_cpp_encodes_text_to_gptlab_ids_with_sentencepiece(tmp_path):
    tokenizer = SentencePieceTokenizer(train_sentencepiece(shakespeare_documents()[:1] + TEXTS, vocab_size=500))
    llm = load(write_gguf(tiny("llama-tiny", tokenizer.vocab_size), tokenizer, tmp_path / "m.gguf", type="f32"))
    try:
        for text in TEXTS:
            assert llm.tokenize(text.encode(), add_bos=False, special=False) == tokenizer.encode_ordinary(text), text
    finally:
        llm.close()


@pytest.mark.parametrize("kind", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize(("name", "overrides"), PRESETS)
def test_llama_cpp_logits_agree_with_gptlab_within_the_types_rounding(tokenizer, tmp_path, name, overrides, kind):
    model = tiny(name, tokenizer.vocab_size, **overrides)
    ids = tokenizer.encode_ordinary(TEXTS[0])[:48]
    llm = load(write_gguf(model, tokenizer, tmp_path / "m.gguf", type=kind))
    try:
        ours, theirs = gptlab_logits(model, ids), llama_cpp_logits(llm, ids)
    finally:
        llm.close()
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
    llm = load(write_gguf(model, tokenizer, tmp_path / "m.gguf", type="f32"))
    try:
        llm.reset()
        llm.eval(prompt)
        theirs = list(prompt)
        for _ in range(24):
            theirs.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            llm.eval([theirs[-1]])
    finally:
        llm.close()
    assert theirs == ours


def test_llama_cpp_renders_the_chat_template_as_gptlab_renders_a_conversation(tokenizer, tmp_path):
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    model = tiny("gpt2-tiny", tokenizer.vocab_size)
    llm = load(write_gguf(model, tokenizer, tmp_path / "m.gguf", type="f16"))
    try:
        metadata = llm.metadata
        eot = llm.detokenize([llm.token_eos()], special=True).decode()
        formatter = Jinja2ChatFormatter(metadata["tokenizer.chat_template"], eos_token=eot, bos_token=eot)
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who is Romeo?"}]
        prompt = formatter(messages=messages).prompt
        ids = llm.tokenize(prompt.encode(), add_bos=False, special=True)
    finally:
        llm.close()
    assert ids == ChatFormat(tokenizer).prompt(messages)
