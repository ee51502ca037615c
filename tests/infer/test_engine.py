"""Continuous batching: every request's tokens equal `generate` run on its prompt alone, whatever else is in the batch."""

import asyncio
import threading

import pytest
import torch

from gptlab.infer import SamplingConfig, generate
from gptlab.infer.engine import Engine, EngineConfig
from gptlab.model import GPT, preset
from gptlab.runtime import GptlabError

GREEDY = SamplingConfig(max_new_tokens=24, temperature=0)


def tiny_model(name: str = "gpt2-tiny", **overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(preset(name, vocab_size=512, block_size=128, **overrides)).eval()


def random_prompts(lengths: list[int], seed: int = 1) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (n,), generator=generator).tolist() for n in lengths]


def alone(model: GPT, prompt: list[int], config: SamplingConfig) -> list[int]:
    return generate(model, [prompt], config)[0]


class Staggered:
    """on_step hook: submits prompt k after decode step `at[k]`, so each joins a batch already decoding."""

    def __init__(self, prompts, configs, at) -> None:
        self.pending = list(zip(at, prompts, configs))
        self.requests = []
        self.all_submitted = threading.Event()

    def __call__(self, engine: Engine) -> None:
        while self.pending and engine.stats.steps >= self.pending[0][0]:
            _, prompt, config = self.pending.pop(0)
            self.requests.append(engine.submit(prompt, config))
        if not self.pending:
            self.all_submitted.set()


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_engine_greedy_requests_joining_mid_batch_equal_generate_alone(name):
    model = tiny_model(name)
    prompts = random_prompts([7, 30, 1, 12, 3])
    hook = Staggered(prompts[1:], [GREEDY] * 4, at=[2, 5, 6, 11])
    with Engine(model, EngineConfig(slots=3), on_step=hook) as engine:
        first = engine.submit(prompts[0], GREEDY)
        assert hook.all_submitted.wait(60)
        outputs = [list(request) for request in [first, *hook.requests]]
        assert engine.stats.peak_running == 3  # the batch really was shared
    assert outputs == [alone(model, prompt, GREEDY) for prompt in prompts]


def test_engine_sliding_window_rows_of_different_lengths_equal_generate_alone():
    """Each row's window counts back from its own length: window 6 is shorter than most prompts here."""
    model = tiny_model("llama-tiny", n_layer=3, attn_window=6, window_pattern="S")
    prompts = random_prompts([7, 30, 1, 12])
    hook = Staggered(prompts[1:], [GREEDY] * 3, at=[2, 5, 9])
    with Engine(model, EngineConfig(slots=3), on_step=hook) as engine:
        first = engine.submit(prompts[0], GREEDY)
        assert hook.all_submitted.wait(60)
        outputs = [list(request) for request in [first, *hook.requests]]
        assert engine.stats.peak_running == 3
    assert outputs == [alone(model, prompt, GREEDY) for prompt in prompts]


def test_engine_seeded_sampling_same_alone_or_in_a_busy_batch():
    model = tiny_model()
    prompts = random_prompts([9, 4, 20, 2])
    configs = [SamplingConfig(max_new_tokens=20, temperature=0.9, top_k=50, top_p=0.95, seed=seed) for seed in (1, 2, 3, 4)]
    hook = Staggered(prompts[1:], configs[1:], at=[1, 3, 4])
    with Engine(model, EngineConfig(slots=4), on_step=hook) as engine:
        first = engine.submit(prompts[0], configs[0])
        assert hook.all_submitted.wait(60)
        outputs = [list(request) for request in [first, *hook.requests]]
    assert outputs == [alone(model, prompt, config) for prompt, config in zip(prompts, configs)]


def test_engine_stop_tokens_and_max_new_tokens_end_a_request():
    model = tiny_model()
    (prompt,) = random_prompts([6])
    free_run = alone(model, prompt, GREEDY)
    stop = free_run[5]
    config = SamplingConfig(max_new_tokens=24, temperature=0, stop_tokens=(stop,))
    short = SamplingConfig(max_new_tokens=3, temperature=0)
    with Engine(model) as engine:
        stopped, cut = engine.submit(prompt, config), engine.submit(prompt, short)
        assert list(stopped) == free_run[: free_run.index(stop)]
        assert list(cut) == free_run[:3]
    assert (stopped.finish_reason, cut.finish_reason) == ("stop", "length")


def test_engine_cancel_frees_the_slot_for_a_waiting_request():
    model = tiny_model()
    first_prompt, second_prompt = random_prompts([5, 8])
    gate = threading.Event()  # the engine holds after each step until the test has cancelled
    with Engine(model, EngineConfig(slots=1), on_step=lambda engine: gate.wait(60)) as engine:
        first = engine.submit(first_prompt, SamplingConfig(max_new_tokens=100, temperature=0))
        second = engine.submit(second_prompt, GREEDY)
        tokens = iter(first)
        next(tokens)
        assert second.tokens == []  # one slot, held by the first request
        engine.cancel(first)
        gate.set()
        list(tokens)
        assert list(second) == alone(model, second_prompt, GREEDY)
        assert engine.wait_idle(60)
    assert first.finish_reason == "cancelled" and len(first.tokens) < 100
    assert engine.stats.finished == {"cancelled": 1, "length": 1}


def test_engine_cancel_of_a_waiting_request_never_runs_it():
    model = tiny_model()
    prompts = random_prompts([5, 8])
    with Engine(model, EngineConfig(slots=1)) as engine:
        first = engine.submit(prompts[0], GREEDY)
        waiting = engine.submit(prompts[1], GREEDY)
        engine.cancel(waiting)
        assert list(waiting) == [] and waiting.finish_reason == "cancelled"
        assert list(first) == alone(model, prompts[0], GREEDY)


def test_engine_prompt_longer_than_the_context_is_an_error():
    model = tiny_model()
    (prompt,) = random_prompts([100])
    with Engine(model) as engine:
        with pytest.raises(GptlabError, match="longer than the context"):
            engine.submit(prompt, SamplingConfig(max_new_tokens=29))
        with pytest.raises(GptlabError, match="empty"):
            engine.submit([], GREEDY)
        assert list(engine.submit(prompt, SamplingConfig(max_new_tokens=28, temperature=0))) == alone(
            model, prompt, SamplingConfig(max_new_tokens=28, temperature=0)
        )


def test_engine_streams_into_an_asyncio_loop():
    model = tiny_model()
    prompts = random_prompts([4, 9])

    async def collect(engine: Engine) -> list[list[int]]:
        loop = asyncio.get_running_loop()

        async def one(prompt):
            return [token async for token in engine.submit(prompt, GREEDY, loop=loop)]

        return list(await asyncio.gather(*(one(prompt) for prompt in prompts)))

    with Engine(model) as engine:
        assert asyncio.run(collect(engine)) == [alone(model, prompt, GREEDY) for prompt in prompts]


def test_engine_close_cancels_what_is_left():
    model = tiny_model()
    (prompt,) = random_prompts([5])
    engine = Engine(model, EngineConfig(slots=1))
    requests = [engine.submit(prompt, SamplingConfig(max_new_tokens=100, temperature=0)) for _ in range(3)]
    engine.close()
    for request in requests:
        list(request)
    assert {request.finish_reason for request in requests} <= {"cancelled", "length"}
    assert requests[-1].finish_reason == "cancelled"
    with pytest.raises(GptlabError, match="closed"):
        engine.submit(prompt, GREEDY)


def test_engine_config_rejects_zero_slots():
    with pytest.raises(GptlabError, match="slots"):
        EngineConfig(slots=0)
