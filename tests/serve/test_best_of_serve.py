"""best_of through the official openai client against a live server: the reward's favourite of the candidates that
gptlab generate samples with seed + k is returned, with its reward against the candidates' mean; streaming gives the
same text after scoring; bad requests and a failing reward are clear errors and the server goes on serving."""

import openai
import pytest

from tests.serve.conftest import start_server
from tests.serve.test_api import USER, chat_reference, client, text_reference


class Vowels:
    """A reward with a known preference (more vowels), remembering what it was asked and what it answered."""

    def __init__(self) -> None:
        self.calls = []

    def __call__(self, prompt, texts):
        scores = [float(sum(ch in "aeiou" for ch in text)) - 0.001 * k for k, text in enumerate(texts)]
        self.calls.append((prompt, list(texts), scores))
        return scores


def failing(prompt, texts):
    raise ZeroDivisionError("the reward divided by zero")


@pytest.fixture(scope="module")
def reward():
    return Vowels()


@pytest.fixture(scope="module")
def best_server(served, reward):
    live = start_server(served, reward=reward)
    yield live
    live.stop()


def best(texts):
    scores = [sum(ch in "aeiou" for ch in text) - 0.001 * k for k, text in enumerate(texts)]
    return max(range(len(texts)), key=lambda k: scores[k]), scores


def test_chat_best_of_returns_the_rewards_favourite_of_seeded_candidates(best_server, served, reward):
    answer = client(best_server).chat.completions.create(model="tiny-chat", messages=USER, max_tokens=20, temperature=1.0,
                                                         seed=7, extra_body={"best_of": 4})
    candidates = [chat_reference(served, USER, 20, temperature=1.0, seed=7 + k) for k in range(4)]
    index, scores = best([text for text, _ in candidates])
    assert index > 0  # the favourite is not simply the first candidate
    assert answer.choices[0].message.content == candidates[index][0]
    prompt, texts, returned = reward.calls[-1]
    assert prompt == USER and texts == [text for text, _ in candidates]  # the conversation is the prompt
    summary = answer.choices[0].model_extra["best_of"]
    assert summary == {"n": 4, "index": index, "reward": pytest.approx(scores[index]), "mean": pytest.approx(sum(returned) / 4),
                       "min": min(returned), "max": max(returned)}
    assert answer.usage.completion_tokens == sum(tokens for _, tokens in candidates)  # every candidate is billed


def test_completions_best_of_returns_the_n_best_in_order(best_server, served):
    answer = client(best_server).completions.create(model="tiny-chat", prompt="ROMEO:", max_tokens=16, temperature=1.0,
                                                    seed=3, best_of=3, n=2)
    texts = [text_reference(served, "ROMEO:", 16, temperature=1.0, seed=3 + k)[0] for k in range(3)]
    _, scores = best(texts)
    order = sorted(range(3), key=lambda k: -scores[k])[:2]
    assert [choice.text for choice in answer.choices] == [texts[k] for k in order]
    assert [choice.model_extra["best_of"]["index"] for choice in answer.choices] == order


def test_best_of_with_stream_sends_the_chosen_reply_after_scoring(best_server):
    api = client(best_server)
    options = {"model": "tiny-chat", "messages": USER, "max_tokens": 20, "temperature": 1.0, "seed": 9, "extra_body": {"best_of": 3}}
    whole = api.chat.completions.create(**options)
    chunks = list(api.chat.completions.create(**options, stream=True, stream_options={"include_usage": True}))
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == whole.choices[0].message.content
    finish = [chunk.choices[0] for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert finish[0].model_extra["best_of"] == whole.choices[0].model_extra["best_of"]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_best_of_below_n_is_a_400_naming_both(best_server):
    with pytest.raises(openai.BadRequestError, match=r"best_of \(2\) must be at least n \(3\)"):
        client(best_server).completions.create(model="tiny-chat", prompt="ROMEO:", max_tokens=4, best_of=2, n=3)


def test_best_of_out_of_range_is_a_400(best_server):
    with pytest.raises(openai.BadRequestError, match="best_of"):
        client(best_server).completions.create(model="tiny-chat", prompt="ROMEO:", max_tokens=4, best_of=0)


def test_best_of_on_a_server_without_a_reward_is_a_400_that_says_how(served):
    live = start_server(served, slots=2)
    try:
        with pytest.raises(openai.BadRequestError, match="--reward SPEC") as caught:
            client(live).completions.create(model="tiny-chat", prompt="ROMEO:", max_tokens=4, best_of=2)
        assert caught.value.code == "best_of_unavailable"
        plain = client(live).completions.create(model="tiny-chat", prompt="ROMEO:", max_tokens=4, best_of=1)
        assert len(plain.choices) == 1
    finally:
        live.stop()


def test_a_reward_that_raises_is_a_clear_500_and_the_server_keeps_serving(served):
    live = start_server(served, slots=2, reward=failing, best_of=2)
    try:
        with pytest.raises(openai.InternalServerError, match="ZeroDivisionError: the reward divided by zero") as caught:
            client(live).chat.completions.create(model="tiny-chat", messages=USER, max_tokens=4)
        assert caught.value.code == "reward_failed"
        plain = client(live).chat.completions.create(model="tiny-chat", messages=USER, max_tokens=4, extra_body={"best_of": 1})
        assert plain.choices[0].message.role == "assistant"
    finally:
        live.stop()


def test_a_server_default_best_of_needs_a_reward():
    from gptlab.runtime import GptlabError
    from gptlab.serve.app import build_app

    with pytest.raises(GptlabError, match="needs a reward"):
        build_app(None, None, None, "m", best_of=2)


@pytest.mark.parametrize("flags, message", [
    (["--best-of", "2"], "--best-of 2 needs --reward SPEC"),
    (["--best-of", "2", "--reward", "verifier"], "requests carry no known answer"),
    (["--best-of", "-1", "--reward", "x.py:f"], "--best-of must be a whole number from 1"),
])
def test_serve_bad_best_of_flags_are_one_error_line_before_the_model_loads(tmp_path, flags, message, capsys):
    from gptlab.cli.main import main

    assert main(["serve", str(tmp_path / "no_model_here"), "--port", "0", *flags]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gptlab: error:") and err.count("\n") == 1 and message in err
