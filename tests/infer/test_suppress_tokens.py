"""SamplingConfig.suppress_tokens: those ids are never drawn, greedy or sampled, by generate, stream or the engine;
a suppressed row gives the same tokens batched with others as alone, and greedy it is the argmax over the other ids."""

import pytest
import torch

from gptlab.infer import SamplingConfig, generate, stream
from gptlab.infer.engine import Engine, EngineConfig
from gptlab.infer.generate import sample_next
from gptlab.model import GPT, preset
from gptlab.runtime import GptlabError

VOCAB = 64  # a small vocabulary: the untrained model's favourite ids come back often, so suppressing them matters


def tiny_model() -> GPT:
    torch.manual_seed(0)
    return GPT(preset("gpt2-tiny", vocab_size=VOCAB, block_size=64)).eval()


def favourites(model: GPT, prompt: list[int], count: int) -> tuple[int, ...]:
    """The ids greedy decoding of `prompt` produces most: what a suppression must visibly change."""
    tokens = generate(model, [prompt], SamplingConfig(max_new_tokens=20, temperature=0))[0]
    return tuple(sorted(set(tokens), key=tokens.count, reverse=True)[:count])


def brute_force_greedy(model: GPT, prompt: list[int], new: int, suppressed: tuple[int, ...]) -> list[int]:
    """Greedy decoding by hand: rerun the whole sequence each step, argmax over the ids not suppressed."""
    sequence = list(prompt)
    for _ in range(new):
        with torch.no_grad():
            logits, _ = model(torch.tensor([sequence]))
        allowed = [token for token in range(VOCAB) if token not in suppressed]
        sequence.append(allowed[int(logits[0, -1, allowed].argmax())])
    return sequence[len(prompt):]


def test_suppressed_tokens_are_never_drawn_greedy_or_sampled():
    model = tiny_model()
    prompt = [3, 9, 27]
    suppressed = favourites(model, prompt, 3)
    greedy = SamplingConfig(max_new_tokens=20, temperature=0, suppress_tokens=suppressed)
    assert generate(model, [prompt], greedy)[0] == brute_force_greedy(model, prompt, 20, suppressed)
    sampled = SamplingConfig(max_new_tokens=40, temperature=1.5, seed=1, suppress_tokens=suppressed)
    tokens = generate(model, [prompt], sampled)[0]
    assert len(tokens) == 40 and not set(tokens) & set(suppressed)
    assert [token for _, token in stream(model, [prompt], sampled)] == tokens


def test_sample_next_with_every_id_but_one_suppressed_draws_that_one():
    logits = torch.randn(4, 10)
    config = SamplingConfig(temperature=1.0, suppress_tokens=tuple(range(9)))
    assert sample_next(logits, config, torch.Generator().manual_seed(0)).tolist() == [9] * 4


@pytest.mark.parametrize("temperature", [0, 0.9])
def test_engine_rows_with_and_without_suppression_batched_equal_each_alone(temperature):
    model = tiny_model()
    prompts = [[3, 9, 27], [5, 1], [3, 9, 27], [40, 2, 2, 7]]
    suppressed = favourites(model, prompts[0], 2)
    configs = [SamplingConfig(max_new_tokens=16, temperature=temperature, seed=k, suppress_tokens=suppressed if k % 2 == 0 else ())
               for k in range(len(prompts))]
    with Engine(model, EngineConfig(slots=4, prefix_cache_mb=0)) as engine:
        requests = [engine.submit(prompt, config) for prompt, config in zip(prompts, configs)]
        batched = [list(request) for request in requests]
    assert batched == [generate(model, [prompt], config)[0] for prompt, config in zip(prompts, configs)]
    assert not set(batched[0] + batched[2]) & set(suppressed)
    assert batched[0] != batched[2] or temperature == 0  # the same prompt, different seeds
    if temperature == 0:  # the suppression changed the greedy reply: the unsuppressed one uses the suppressed ids
        assert set(generate(model, [prompts[0]], SamplingConfig(max_new_tokens=16, temperature=0))[0]) & set(suppressed)


@pytest.mark.parametrize("bad", [5, "7", (1.5,), (-1,), (True,)])
def test_suppress_tokens_must_be_a_sequence_of_ids(bad):
    with pytest.raises(GptlabError, match="suppress_tokens"):
        SamplingConfig(suppress_tokens=bad)
