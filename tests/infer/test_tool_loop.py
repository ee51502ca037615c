"""The tool loop in every decoding path: a batch with tools gives each row what it gets alone, the engine gives what
generate gives, fed ids take the place of sampled ones and count against max_new_tokens."""

import pytest
import torch

from gptlab.infer import SamplingConfig, generate
from gptlab.infer.engine import Engine, EngineConfig
from gptlab.infer.tool_loop import ToolStep
from gptlab.model import GPT, preset
from gptlab.runtime import GptlabError

FEED = (7, 8, 9)


class CountingTurn:
    """Feeds FEED after every `every`-th token it is shown; finishes with "tool_calls" at the `finish_at`-th."""

    def __init__(self, every: int, finish_at: int | None = None) -> None:
        self.every, self.finish_at, self.shown = every, finish_at, []

    def after(self, token: int) -> ToolStep | None:
        self.shown.append(token)
        if self.finish_at is not None and len(self.shown) == self.finish_at:
            return ToolStep(finish="tool_calls")
        return ToolStep(feed=FEED) if len(self.shown) % self.every == 0 else None


def tiny_model() -> GPT:
    torch.manual_seed(0)
    return GPT(preset("gpt2-tiny", vocab_size=512, block_size=128)).eval()


def prompts(lengths, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (n,), generator=generator).tolist() for n in lengths]


def expected_feeds(tokens: list[int], shown: list[int], every: int) -> None:
    """Every `every`-th shown token is followed in the output by FEED, and the shown tokens are the rest."""
    rest, i = [], 0
    while i < len(tokens):
        rest.append(tokens[i])
        i += 1
        if len(rest) % every == 0 and i < len(tokens):
            assert tuple(tokens[i : i + len(FEED)]) == FEED[: len(tokens) - i]
            i += len(FEED)
    assert rest == shown[: len(rest)]


def test_generate_with_tools_batched_equals_one_at_a_time_and_the_reference():
    model, batch = tiny_model(), prompts([5, 11, 8])
    config = SamplingConfig(max_new_tokens=20, temperature=0)
    turns = [CountingTurn(every) for every in (3, 4, 5)]
    batched = generate(model, batch, config, tools=turns)
    for prompt, every, tokens in zip(batch, (3, 4, 5), batched):
        assert generate(model, [prompt], config, tools=[CountingTurn(every)])[0] == tokens
        assert generate(model, [prompt], config, tools=[CountingTurn(every)], use_cache=False)[0] == tokens
    for turn, tokens in zip(turns, batched):
        assert len(tokens) == 20  # fed ids count against max_new_tokens
        expected_feeds(tokens, turn.shown, turn.every)


def test_engine_with_tools_equals_generate_alone():
    model, batch = tiny_model(), prompts([5, 11, 8, 3])
    config = SamplingConfig(max_new_tokens=18, temperature=0)
    with Engine(model, EngineConfig(slots=2, prefix_cache_mb=0)) as engine:  # two wait: they join a running batch
        requests = [engine.submit(prompt, config, tools=CountingTurn(3 + i)) for i, prompt in enumerate(batch)]
        outputs = [list(request) for request in requests]
    for i, (prompt, tokens) in enumerate(zip(batch, outputs)):
        assert tokens == generate(model, [prompt], config, tools=[CountingTurn(3 + i)])[0]


def test_engine_seeded_sampling_with_tools_is_the_same_alone_or_in_a_batch():
    model, batch = tiny_model(), prompts([6, 9, 4])
    config = SamplingConfig(max_new_tokens=16, temperature=1.0, seed=5)
    with Engine(model, EngineConfig(slots=1)) as engine:
        alone = list(engine.submit(batch[0], config, tools=CountingTurn(2)))
    with Engine(model, EngineConfig(slots=3)) as engine:
        requests = [engine.submit(prompt, config, tools=CountingTurn(2)) for prompt in batch]
        together = [list(request) for request in requests]
    assert together[0] == alone


def test_tool_turn_finish_ends_the_row_with_its_reason_and_drops_the_token():
    model, (prompt,) = tiny_model(), prompts([6])
    config = SamplingConfig(max_new_tokens=30, temperature=0)
    turn = CountingTurn(4, finish_at=6)
    with Engine(model, EngineConfig(slots=1)) as engine:
        request = engine.submit(prompt, config, tools=turn)
        tokens = list(request)
    assert request.finish_reason == "tool_calls" and request.stop_token == turn.shown[5]
    assert tokens == generate(model, [prompt], config, tools=[CountingTurn(4, finish_at=6)])[0]
    assert len(tokens) == 5 + len(FEED)  # five tokens kept, FEED after the fourth, the sixth dropped


def test_fed_stop_token_does_not_stop_the_row():
    model, (prompt,) = tiny_model(), prompts([4])
    config = SamplingConfig(max_new_tokens=12, temperature=0, stop_tokens=(FEED[0],))  # a fed id that is a stop token
    tokens = generate(model, [prompt], config, tools=[CountingTurn(2)])[0]
    assert tokens[2:5] == list(FEED) and len(tokens) == 12  # fed after the second token; the row went on to the end


def test_tools_with_a_draft_model_or_the_wrong_count_are_refused():
    model = tiny_model()
    with Engine(model, EngineConfig(slots=1), draft=tiny_model()) as engine:
        with pytest.raises(GptlabError, match="draft"):
            engine.submit([1, 2, 3], SamplingConfig(max_new_tokens=4), tools=CountingTurn(2))
    with pytest.raises(GptlabError, match="one \\(or None\\) per prompt"):
        generate(model, [[1, 2], [3]], SamplingConfig(max_new_tokens=4), tools=[CountingTurn(2)])
