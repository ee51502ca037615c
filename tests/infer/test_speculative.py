"""Speculative decoding: greedy tokens equal the target's alone; sampled continuations follow the target's exact
distribution (summed over every sequence of a 5-token vocabulary); the engine's rows do the same; the CLI refuses a
bad draft in one line."""

import itertools

import pytest
import torch
from scipy.stats import chisquare

from gptlab.cli.main import main
from gptlab.infer import SamplingConfig, generate
from gptlab.infer.engine import Engine, EngineConfig
from gptlab.infer.generate import sampling_probs
from gptlab.infer.speculative import SpeculativeDecoder, speculative_generate
from gptlab.model import GPT, preset
from gptlab.runtime import GptlabError


def tiny(name: str = "gpt2-tiny", seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    settings = {"vocab_size": 512, "block_size": 64, **overrides}
    return GPT(preset(name, **settings)).float().eval()


def random_prompts(lengths: list[int], seed: int = 1) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (n,), generator=generator).tolist() for n in lengths]


GREEDY = SamplingConfig(max_new_tokens=20, temperature=0)
PROMPTS = random_prompts([1, 5, 17])


# ---------------------------------------------------------------- greedy: exactly the target's tokens


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_speculative_greedy_with_a_random_draft_equals_target_greedy(name, k):
    target, draft = tiny(name), tiny(name, seed=7, n_layer=1)
    tokens, stats = speculative_generate(target, draft, PROMPTS, GREEDY, draft_tokens=k)
    assert tokens == generate(target, PROMPTS, GREEDY)
    assert 0 < stats.proposed and stats.accepted < stats.proposed  # the draft was wrong at times: rejections happened


def test_speculative_greedy_with_the_target_as_draft_accepts_every_guess():
    target = tiny()
    tokens, stats = speculative_generate(target, target, PROMPTS, GREEDY, draft_tokens=4)
    assert tokens == generate(target, PROMPTS, GREEDY)
    assert stats.accepted == stats.proposed > 0
    assert stats.steps < 3 * GREEDY.max_new_tokens / 2  # up to 5 tokens per target pass, not 1


def test_speculative_greedy_stops_at_a_stop_token_as_generate_does():
    target, draft = tiny(), tiny(seed=7, n_layer=1)
    free = generate(target, PROMPTS, GREEDY)
    config = SamplingConfig(max_new_tokens=20, temperature=0, stop_tokens=(free[1][6], free[2][3]))
    expected = generate(target, PROMPTS, config)
    assert any(len(row) < 20 for row in expected)  # a row really stopped early
    for k in (1, 3, 5):
        assert speculative_generate(target, draft, PROMPTS, config, draft_tokens=k)[0] == expected
        assert speculative_generate(target, target, PROMPTS, config, draft_tokens=k)[0] == expected  # stop inside accepted guesses


@pytest.mark.parametrize("k", [1, 3, 5])
def test_speculative_greedy_near_the_context_end_equals_target_greedy(k):
    target, draft = tiny(block_size=32), tiny(seed=7, n_layer=1, block_size=32)
    prompts = random_prompts([25, 30, 31])
    for row, prompt in enumerate(prompts):
        config = SamplingConfig(max_new_tokens=32 - len(prompt), temperature=0)  # fills the context exactly
        assert speculative_generate(target, draft, [prompt], config, draft_tokens=k)[0] == generate(target, [prompt], config), row
        assert speculative_generate(target, target, [prompt], config, draft_tokens=k)[0] == generate(target, [prompt], config), row


def test_speculative_refuses_a_mismatched_draft_before_any_compute():
    target = tiny()
    with pytest.raises(GptlabError, match="draft model has 256 token ids but the target 512"):
        SpeculativeDecoder(target, tiny(vocab_size=256), 4)
    with pytest.raises(GptlabError, match=r"draft model's context \(32\) is shorter than the target's \(64\)"):
        SpeculativeDecoder(target, tiny(block_size=32), 4)
    with pytest.raises(GptlabError, match="at least 1, got 0"):
        SpeculativeDecoder(target, target, 0)
    with pytest.raises(GptlabError, match="at least 1, got 0"):
        Engine(target, EngineConfig(slots=1, draft_tokens=0), draft=target)


# ---------------------------------------------------------------- sampled: the target's exact distribution

VOCAB, NEW, SAMPLES = 5, 3, 1000


def peaked(seed: int, n_layer: int) -> GPT:
    """A random model over 5 ids with sharper distributions (a scaled-up output layer of its own), so that a draft and
    a target really differ: about half the guesses are rejected and drawn again from the residual."""
    model = tiny(seed=seed, vocab_size=VOCAB, block_size=16, n_layer=n_layer, n_embd=16, tie_embeddings=False)
    with torch.no_grad():
        model.lm_head.weight.mul_(5)
    return model


def exact_distribution(model: GPT, prompt: list[int], config: SamplingConfig) -> dict[tuple[int, ...], float]:
    """P(continuation) for every sequence of NEW ids: products of the processed probabilities, by brute force."""
    probability = {(): 1.0}
    for _ in range(NEW):
        grown = {}
        for prefix, mass in probability.items():
            with torch.no_grad():
                logits, _ = model(torch.tensor([prompt + list(prefix)]))
            p = sampling_probs(logits[0, -1].double(), config)
            for token in range(VOCAB):
                grown[prefix + (token,)] = mass * float(p[token])
        probability = grown
    return probability


def goodness_of_fit(samples: list[tuple[int, ...]], expected: dict[tuple[int, ...], float]) -> float:
    """Chi-square p-value of the samples against `expected`, pooling sequences expected fewer than 5 times into one
    bin; 0 when a sample has probability 0 under `expected` (top-k and top-p cut sequences out entirely)."""
    counts = {sequence: 0 for sequence in expected}
    for sequence in samples:
        counts[sequence] += 1
    if any(counts[s] for s in expected if expected[s] == 0):
        return 0.0
    big = [s for s in expected if expected[s] * len(samples) >= 5]
    small = [s for s in expected if s not in big and expected[s] > 0]
    observed = [counts[s] for s in big] + ([sum(counts[s] for s in small)] if small else [])
    wanted = [expected[s] * len(samples) for s in big] + ([sum(expected[s] for s in small) * len(samples)] if small else [])
    wanted = [w * len(samples) / sum(wanted) for w in wanted]  # chisquare needs equal totals; the sum is 1 up to rounding
    return chisquare(observed, wanted).pvalue


@pytest.mark.parametrize("settings", [{"temperature": 0.7}, {"temperature": 1.5, "top_k": 3}, {"temperature": 1.0, "top_p": 0.8}])
def test_speculative_samples_follow_the_targets_exact_distribution(settings):
    target, draft = peaked(0, 2), peaked(3, 1)
    prompt = [1, 4, 2]
    decoder = SpeculativeDecoder(target, draft, 2)
    samples = [tuple(decoder.stream(prompt, SamplingConfig(max_new_tokens=NEW, seed=seed, **settings))) for seed in range(SAMPLES)]
    config = SamplingConfig(max_new_tokens=NEW, **settings)
    # Threshold: p > 0.001 fails a correct sampler once in a thousand seeds sets; the seeds are fixed, so this is stable.
    assert goodness_of_fit(samples, exact_distribution(target, prompt, config)) > 1e-3
    # The test has power: the same samples are far from the draft's own distribution, and the draft was often wrong.
    assert goodness_of_fit(samples, exact_distribution(draft, prompt, config)) < 1e-6
    assert 0.1 < decoder.stats.acceptance_rate < 0.9


# ---------------------------------------------------------------- the engine's rows


@pytest.mark.parametrize("same", [True, False])
def test_engine_with_a_draft_gives_each_greedy_request_its_target_greedy_tokens(same):
    target = tiny("llama-tiny")
    draft = target if same else tiny("llama-tiny", seed=7, n_layer=1)
    prompts = random_prompts([7, 30, 1, 12, 3])
    configs = [SamplingConfig(max_new_tokens=n, temperature=0) for n in (20, 9, 33, 1, 20)]
    with Engine(target, EngineConfig(slots=3, draft_tokens=3), draft=draft) as engine:
        requests = [engine.submit(prompt, config) for prompt, config in zip(prompts, configs)]
        outputs = [list(request) for request in requests]
        assert engine.stats.peak_running == 3  # rows of different lengths were verified together
        stats = engine.stats
    # the target as draft: every guess passes; a random draft: guesses are rejected
    assert stats.accepted == stats.proposed > 0 if same else stats.accepted < stats.proposed
    assert outputs == [generate(target, [prompt], config)[0] for prompt, config in zip(prompts, configs)]


@pytest.mark.parametrize("same", [True, False])
def test_engine_with_a_draft_stops_greedy_rows_at_their_stop_tokens_near_the_context_end(same):
    target = tiny(block_size=40)
    draft = target if same else tiny(seed=7, n_layer=1, block_size=40)  # same: the stop token sits among accepted guesses
    prompts = random_prompts([30, 5, 36])
    free = [generate(target, [prompt], SamplingConfig(max_new_tokens=40 - len(prompt), temperature=0))[0] for prompt in prompts]
    configs = [SamplingConfig(max_new_tokens=40 - len(prompt), temperature=0, stop_tokens=(free[1][5],)) for prompt in prompts]
    with Engine(target, EngineConfig(slots=3, draft_tokens=5), draft=draft) as engine:
        outputs = [list(request) for request in [engine.submit(prompt, config) for prompt, config in zip(prompts, configs)]]
    assert outputs == [generate(target, [prompt], config)[0] for prompt, config in zip(prompts, configs)]
    assert len(outputs[1]) == free[1].index(free[1][5])  # that row really stopped


def test_engine_with_a_draft_completes_seeded_sampled_requests_with_plausible_stats():
    target = tiny()
    prompts = random_prompts([4, 9, 2, 6])
    configs = [SamplingConfig(max_new_tokens=16, temperature=0.8, top_k=50, seed=seed) for seed in range(4)]

    def run(draft):
        with Engine(target, EngineConfig(slots=2, draft_tokens=4), draft=draft) as engine:
            outputs = [list(request) for request in [engine.submit(prompt, config) for prompt, config in zip(prompts, configs)]]
            return outputs, engine.stats

    outputs, stats = run(target)  # the target as its own draft: p == q up to rounding, so (nearly) every guess passes
    assert [len(row) for row in outputs] == [16] * 4 and stats.finished == {"length": 4}
    assert stats.accepted >= 0.95 * stats.proposed > 0
    assert run(target)[0] == outputs  # seeded: the same tokens again
    outputs, stats = run(tiny(seed=7, n_layer=1))
    assert [len(row) for row in outputs] == [16] * 4 and all(0 <= t < 512 for row in outputs for t in row)
    assert 0 <= stats.accepted < stats.proposed


# ---------------------------------------------------------------- the command line


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory):
    """A target (2 layers) and a draft (1 layer) sharing a tokenizer; another draft whose tokenizer differs."""
    from gptlab.model.io import save_model
    from gptlab.tokenizer import Tokenizer

    root = tmp_path_factory.mktemp("speculative")
    text = ["To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer " * 4]
    tokenizer = Tokenizer.train(text, vocab_size=300)
    other = Tokenizer.train(["All the world's a stage, and all the men and women merely players " * 4], vocab_size=300)
    for name, layers, own in [("target", 2, tokenizer), ("draft", 1, tokenizer), ("foreign", 1, other)]:
        torch.manual_seed(len(name))
        save_model(GPT(preset("gpt2-tiny", vocab_size=300, block_size=64, n_layer=layers)), root / name)
        own.save(root / name / "tokenizer")
    return root


def test_cli_sample_with_a_draft_prints_the_greedy_text_and_the_acceptance_rate(model_folders, capsys):
    argv = ["sample", "--checkpoint", str(model_folders / "target"), "--prompt", "To be", "--max-new-tokens", "12",
            "--temperature", "0", "--device", "cpu"]
    assert main(argv) == 0
    alone = capsys.readouterr().out
    assert main([*argv, "--draft", str(model_folders / "draft"), "--draft-tokens", "3"]) == 0
    captured = capsys.readouterr()
    assert captured.out == alone
    assert captured.err.startswith("speculative decoding (K=3): ") and "draft tokens accepted (" in captured.err


@pytest.mark.parametrize("command", ["sample", "chat"])
@pytest.mark.parametrize(("draft", "extra", "message"), [
    ("missing", [], "no model at {root}/missing"),
    ("foreign", [], "the draft {root}/foreign was trained with another tokenizer"),
    ("draft", ["--draft-tokens", "0"], "--draft-tokens must be at least 1, got 0"),
])
def test_cli_refuses_a_bad_draft_in_one_line(model_folders, command, draft, extra, message, capsys):
    model = ["--checkpoint", str(model_folders / "target"), "--prompt", "To be"] if command == "sample" else [str(model_folders / "target")]
    argv = [command, *model, "--device", "cpu", "--draft", str(model_folders / draft), *extra]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("gptlab: error: " + message.format(root=model_folders)) and err.count("\n") == 1


def test_cli_serve_refuses_a_draft_with_another_tokenizer(model_folders, capsys):
    argv = ["serve", str(model_folders / "target"), "--device", "cpu", "--port", "0",
            "--draft", str(model_folders / "foreign")]
    assert main(argv) == 1
    assert capsys.readouterr().err.startswith("gptlab: error: the draft ")


def test_exact_distribution_reference_covers_every_sequence_and_sums_to_one():
    """The brute-force reference itself: its probabilities over all VOCAB**NEW sequences sum to 1."""
    target = peaked(0, 2)
    distribution = exact_distribution(target, [1], SamplingConfig(max_new_tokens=NEW, temperature=1.5, top_k=3))
    assert set(distribution) == set(itertools.product(range(VOCAB), repeat=NEW))
    assert sum(distribution.values()) == pytest.approx(1.0, abs=1e-6)  # float32 probabilities, as sample_next's
