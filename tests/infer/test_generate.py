"""Generation: the KV-cache engine against full recomputation (the nanoGPT reference), sampling, stops, errors, CLI."""

import importlib
from pathlib import Path

import pytest
import torch

from gptlab.cli.main import main
from gptlab.infer import SamplingConfig, generate, sample_next, stream
from gptlab.model import GPT, preset
from gptlab.model.io import save_model
from gptlab.runtime import GptlabError

engine = importlib.import_module("gptlab.infer.generate")  # the module: gptlab.infer.generate is also the function
PRESETS = ["gpt2-tiny", "llama-tiny"]
GREEDY = SamplingConfig(max_new_tokens=12, temperature=0)


def tiny_model(name: str = "gpt2-tiny", seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(preset(name, **overrides)).eval()


def random_prompts(lengths: list[int], vocab_size: int = 512, seed: int = 1) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=generator).tolist() for n in lengths]


def truncated_at(tokens: list[int], stop: int) -> list[int]:
    return tokens[: tokens.index(stop)] if stop in tokens else tokens


# ---------------------------------------------------------------- cache vs recomputation


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("lengths", [[7], [1], [9, 1, 4, 9], [52, 3]], ids=["single", "one-token", "batched", "fills-context"])
def test_generate_greedy_with_cache_equals_recomputation(name, lengths):
    model = tiny_model(name)
    prompts = random_prompts(lengths)  # [52, 3]: 52 + 12 new = block_size 64 exactly
    cached = generate(model, prompts, GREEDY)
    assert cached == generate(model, prompts, GREEDY, use_cache=False)
    assert [len(tokens) for tokens in cached] == [GREEDY.max_new_tokens] * len(prompts)


@pytest.mark.parametrize("name", PRESETS)
def test_generate_batched_equals_each_prompt_alone(name):
    model = tiny_model(name)
    prompts = random_prompts([11, 2, 6, 1])
    batched = generate(model, prompts, GREEDY)
    assert batched == [generate(model, [prompt], GREEDY)[0] for prompt in prompts]


def cached_and_full_logits(model, prompts, monkeypatch):
    """The tokens of a cached and an uncached generation, and the logits each step sampled from in each."""
    seen: dict[bool, list[torch.Tensor]] = {True: [], False: []}
    use_cache = True

    def recording(logits, config, generator):
        seen[use_cache].append(logits.clone())
        return real_sample_next(logits, config, generator)

    real_sample_next = engine.sample_next
    monkeypatch.setattr(engine, "sample_next", recording)
    cached = generate(model, prompts, GREEDY)
    use_cache = False
    full = generate(model, prompts, GREEDY, use_cache=False)
    return cached, full, seen[True], seen[False]


@pytest.mark.parametrize("name", PRESETS)
def test_generate_prefill_and_decode_logits_equal_full_forward(name, monkeypatch):
    """The logits each step samples from: padded batch through the KV cache vs each row rerun alone from scratch."""
    model = tiny_model(name)
    _, _, cached_logits, full_logits = cached_and_full_logits(model, random_prompts([10, 3, 1, 7]), monkeypatch)
    assert len(cached_logits) == len(full_logits) == GREEDY.max_new_tokens
    for cached, full in zip(cached_logits, full_logits):
        torch.testing.assert_close(cached, full, atol=1e-5, rtol=0)


WINDOWED = {  # sliding windows shorter than most prompts: S layers must drop the oldest cached keys
    "gpt2-window-3": dict(n_layer=3, attn_window=3, window_pattern="SL"),
    "llama-window-5-sssl": dict(n_layer=5, attn_window=5, window_pattern="SSSL"),
}


@pytest.mark.parametrize("name", WINDOWED)
def test_generate_sliding_window_left_padded_batch_equals_recomputation(name, monkeypatch):
    """Tokens and the logits each step samples from: padded batch through the KV cache vs each row rerun alone."""
    model = tiny_model(name.split("-")[0] + "-tiny", **WINDOWED[name])
    prompts = random_prompts([10, 3, 1, 7])  # left-padded to 10; windows of 3 and 5 are shorter than most prompts
    cached, uncached, cached_logits, full_logits = cached_and_full_logits(model, prompts, monkeypatch)
    assert cached == uncached
    for with_cache, full in zip(cached_logits, full_logits, strict=True):
        torch.testing.assert_close(with_cache, full, atol=1e-5, rtol=0)
    assert cached == [generate(model, [prompt], GREEDY)[0] for prompt in prompts]


def test_generate_sampling_with_cache_equals_recomputation_at_a_seed():
    model = tiny_model("llama-tiny")
    prompts = random_prompts([5, 8, 2])
    config = SamplingConfig(max_new_tokens=16, temperature=0.9, top_k=40, top_p=0.95, seed=7)
    assert generate(model, prompts, config) == generate(model, prompts, config, use_cache=False)


# ---------------------------------------------------------------- sampling


def test_generate_top_k_1_equals_greedy():
    model = tiny_model()
    prompts = random_prompts([6, 3])
    top1 = SamplingConfig(max_new_tokens=12, temperature=1.5, top_k=1, seed=3)
    assert generate(model, prompts, top1) == generate(model, prompts, GREEDY)


def test_generate_top_p_tiny_equals_greedy():
    model = tiny_model("llama-tiny")
    prompts = random_prompts([6, 3])
    nucleus = SamplingConfig(max_new_tokens=12, temperature=1.0, top_p=1e-6, seed=3)
    assert generate(model, prompts, nucleus) == generate(model, prompts, GREEDY)


def test_generate_sampling_is_reproducible_with_a_seed_and_differs_across_seeds():
    model = tiny_model()
    prompts = random_prompts([4, 9])

    def sample(seed):
        return generate(model, prompts, SamplingConfig(max_new_tokens=20, temperature=1.0, seed=seed))

    assert sample(0) == sample(0)
    assert sample(0) != sample(1)


def test_generate_sampling_leaves_the_global_rng_alone():
    model = tiny_model()
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    generate(model, random_prompts([4]), SamplingConfig(max_new_tokens=8, seed=5))
    assert torch.equal(torch.rand(3), expected)


def test_generate_never_samples_padded_vocabulary_rows():
    model = tiny_model(vocab_size=500)  # logits padded to 512 rows inside the model
    assert model.config.padded_vocab_size > model.config.vocab_size
    with torch.no_grad():
        model.lm_head.weight[model.config.vocab_size :] = 10.0  # padded rows would win everything if they leaked
    tokens = generate(model, random_prompts([3, 5], vocab_size=500), SamplingConfig(max_new_tokens=40, temperature=5.0, seed=0))
    assert max(max(row) for row in tokens) <= model.config.vocab_size - 1


def test_sample_next_keeps_only_the_nucleus_and_top_k():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    generator = torch.Generator().manual_seed(0)
    nucleus = SamplingConfig(top_p=0.7)  # 0.5 < 0.7 <= 0.5 + 0.3: the two most likely tokens
    assert set(sample_next(logits.expand(2000, 4), nucleus, generator).tolist()) == {0, 1}
    top3 = SamplingConfig(top_k=3)
    assert set(sample_next(logits.expand(2000, 4), top3, generator).tolist()) == {0, 1, 2}
    assert sample_next(logits, SamplingConfig(temperature=0), None).tolist() == [0]


# ---------------------------------------------------------------- stopping and streaming


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generate_stop_token_ends_only_its_row(temperature):
    model = tiny_model("llama-tiny")
    prompts = random_prompts([5, 2, 8])
    config = SamplingConfig(max_new_tokens=16, temperature=temperature, seed=11)
    free = generate(model, prompts, config)
    stop = free[0][3]
    stopped = generate(model, prompts, SamplingConfig(max_new_tokens=16, temperature=temperature, seed=11, stop_tokens=(stop,)))
    assert stopped == [truncated_at(tokens, stop) for tokens in free]
    assert len(stopped[0]) <= 3 and stop not in stopped[0]


@pytest.mark.parametrize("new_tokens", [1, 5])
def test_generate_respects_max_new_tokens(new_tokens):
    model = tiny_model()
    tokens = generate(model, random_prompts([3, 7]), SamplingConfig(max_new_tokens=new_tokens, seed=0))
    assert [len(row) for row in tokens] == [new_tokens, new_tokens]


def test_stream_yields_the_tokens_of_generate_in_step_order():
    model = tiny_model()
    prompts = random_prompts([4, 1, 6])
    config = SamplingConfig(max_new_tokens=10, temperature=0.8, seed=2)
    pairs = list(stream(model, prompts, config))
    called = []
    expected = generate(model, prompts, config, on_token=lambda row, token: called.append((row, token)))
    assert called == pairs
    assert [[token for row, token in pairs if row == r] for r in range(len(prompts))] == expected
    assert [row for row, _ in pairs[:3]] == [0, 1, 2]  # step 1 of every row before step 2 of any


def test_generate_restores_training_mode_and_builds_no_graph():
    model = tiny_model()
    model.train()
    tokens = stream(model, random_prompts([4]), SamplingConfig(max_new_tokens=3, seed=0))
    next(tokens)
    assert not model.training and not torch.is_inference_mode_enabled()  # eval while decoding; mode not leaked
    tokens.close()
    assert model.training


# ---------------------------------------------------------------- errors


def test_generate_rejects_a_prompt_longer_than_the_context():
    model = tiny_model()  # block_size 64
    config = SamplingConfig(max_new_tokens=10, temperature=0)
    prompt = random_prompts([60])[0]
    with pytest.raises(GptlabError, match=r"60 tokens \+ max_new_tokens 10 = 70, longer than the context \(64\).*truncate=True"):
        generate(model, [prompt], config)
    truncated = generate(model, [prompt], config, truncate=True)
    assert truncated == generate(model, [prompt[-54:]], config)
    for truncate in (False, True):
        with pytest.raises(GptlabError, match=r"max_new_tokens=64 leaves no room for a prompt.*at most 63"):
            generate(model, [prompt], SamplingConfig(max_new_tokens=64), truncate=truncate)


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        ([[1, 2], []], "prompt 1 is empty"),
        ([[1, 512]], r"prompt 0: token id 512 is outside the vocabulary \(0..511\)"),
        ([[-1, 3]], "prompt 0: token id -1 is outside the vocabulary"),
        ([1, 2, 3], r"for one prompt pass \[ids\]"),
        ([], "non-empty list of prompts"),
        ([["a"]], "integer token ids"),
    ],
)
def test_generate_rejects_bad_prompts(prompts, message):
    with pytest.raises(GptlabError, match=message):
        generate(tiny_model(), prompts, GREEDY)


def test_generate_rejects_a_stop_token_outside_the_vocabulary():
    with pytest.raises(GptlabError, match="stop token: token id 600"):
        generate(tiny_model(), [[1]], SamplingConfig(max_new_tokens=4, stop_tokens=(600,)))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_new_tokens", 0, "max_new_tokens must be"),
        ("temperature", -0.5, "temperature must be 0"),
        ("temperature", float("nan"), "temperature must be 0"),
        ("top_k", 0, "top_k must be"),
        ("top_p", 0.0, r"top_p must be in \(0, 1\]"),
        ("top_p", 1.5, r"top_p must be in \(0, 1\]"),
        ("stop_tokens", 5, "stop_tokens must be a sequence"),
        ("stop_tokens", (-3,), "non-negative token ids"),
        ("seed", 1.5, "seed must be"),
    ],
)
def test_sampling_config_rejects_bad_values(field, value, message):
    with pytest.raises(GptlabError, match=message):
        SamplingConfig(**{field: value})


def test_sampling_config_keeps_stop_tokens_as_a_tuple():
    assert SamplingConfig(stop_tokens=[3, 4]).stop_tokens == (3, 4)


# ---------------------------------------------------------------- CLI


@pytest.fixture()
def checkpoint(tmp_path: Path):
    from gptlab.tokenizer import Tokenizer

    text = "hello world, hello there. the quick brown fox jumps over the lazy dog. héllo wörld 世界\n" * 20
    tokenizer = Tokenizer.train([text], vocab_size=300)
    model = tiny_model(vocab_size=tokenizer.vocab_size)
    directory = tmp_path / "ckpt"
    save_model(model, directory)
    tokenizer.save(directory / "tokenizer")
    return directory, model, tokenizer


def test_cli_sample_streams_what_the_api_generates(checkpoint, capsys):
    directory, model, tokenizer = checkpoint
    assert main(["sample", "--checkpoint", str(directory), "--prompt", "hello", "--max-new-tokens", "5", "--seed", "0"]) == 0
    ids = tokenizer.encode("hello")
    config = SamplingConfig(max_new_tokens=5, seed=0, stop_tokens=(tokenizer.eot_id,))
    new = generate(model, [ids], config)[0]
    assert capsys.readouterr().out == tokenizer.decode(ids + new) + "\n"


def test_cli_sample_draws_numbered_samples_with_consecutive_seeds(checkpoint, capsys):
    directory, model, tokenizer = checkpoint
    argv = ["sample", "--checkpoint", str(directory), "--prompt", "the", "--max-new-tokens", "4", "--seed", "3", "--num-samples", "2"]
    assert main([*argv, "--tokenizer", str(directory / "tokenizer")]) == 0
    ids = tokenizer.encode("the")
    samples = [
        tokenizer.decode(ids + generate(model, [ids], SamplingConfig(max_new_tokens=4, seed=seed, stop_tokens=(tokenizer.eot_id,)))[0])
        for seed in (3, 4)
    ]
    assert capsys.readouterr().out == samples[0] + "\n" + "-" * 40 + "\n" + samples[1] + "\n"


def test_cli_sample_holds_back_partial_utf8_characters(checkpoint, monkeypatch):
    import gptlab.cli.sample as cli_sample
    import gptlab.infer

    directory, _, tokenizer = checkpoint
    text = "é世"  # 2 + 3 bytes, produced one byte token at a time (byte b has id b in a trained tokenizer)
    byte_tokens = list(text.encode("utf-8"))
    monkeypatch.setattr(gptlab.infer, "stream", lambda model, prompts, config, **options: ((0, token) for token in byte_tokens))
    chunks = []
    monkeypatch.setattr(cli_sample, "write", chunks.append)
    assert main(["sample", "--checkpoint", str(directory), "--prompt", "hi"]) == 0
    assert "".join(chunks) == "hi" + text + "\n"
    assert "\ufffd" not in "".join(chunks)
    assert [chunk for chunk in chunks if chunk] == ["hi", "é", "世", "\n"]


def test_cli_sample_missing_checkpoint_is_a_one_line_error(tmp_path, capsys):
    assert main(["sample", "--checkpoint", str(tmp_path / "nope"), "--prompt", "hi"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gptlab: error: no model at") and "no such folder" in err and err.count("\n") == 1


def test_cli_sample_without_a_tokenizer_says_how_to_give_one(checkpoint, capsys):
    import shutil

    directory, _, _ = checkpoint
    shutil.rmtree(directory / "tokenizer")
    assert main(["sample", "--checkpoint", str(directory), "--prompt", "hi"]) == 1
    assert "pass --tokenizer DIR" in capsys.readouterr().err


def test_cli_sample_too_many_new_tokens_names_the_room_left(checkpoint, capsys):
    directory, _, _ = checkpoint
    assert main(["sample", "--checkpoint", str(directory), "--prompt", "hello", "--max-new-tokens", "64"]) == 1
    err = capsys.readouterr().err
    assert "exceeds the model's context (64); use at most" in err and err.count("\n") == 1


def test_cli_sample_default_length_fits_the_context(checkpoint, capsys):
    """Without --max-new-tokens the sample fills the context left after the prompt (64 - its tokens), no more."""
    directory, model, tokenizer = checkpoint
    assert main(["sample", "--checkpoint", str(directory), "--prompt", "hello", "--temperature", "0"]) == 0
    ids = tokenizer.encode("hello")
    room = model.config.block_size - len(ids)
    new = generate(model, [ids], SamplingConfig(max_new_tokens=room, temperature=0, stop_tokens=(tokenizer.eot_id,)))[0]
    assert capsys.readouterr().out == tokenizer.decode(ids + new) + "\n"
    assert len(new) == room or new[-1:] != [tokenizer.eot_id]
