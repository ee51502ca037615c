"""`judge:URL` as a reward, against a fake OpenAI-compatible judge on 127.0.0.1 (the evaluations' FakeJudge) that
grades each answer by the number the answer names ("grade 7" -> "Rating: [[7]]")."""

import re
import socket
import threading

import pytest

from gptlab.align.rl.judge_reward import SETTINGS_ENV, JudgeSettings, instruction_text, judge_reward
from gptlab.align.rl.rewards import Rewards, example_columns
from gptlab.chat.tasks import Arithmetic
from gptlab.runtime import GptlabError
from tests.eval.test_judge import FakeJudge, error

ANSWER = re.compile(r"\[Assistant's answer\]\n(.*)\n\[End of assistant's answer\]", re.DOTALL)


@pytest.fixture
def judge_server():
    """start(script) -> a FakeJudge answering as `script` says; all stopped after the test."""
    started = []
    yield lambda script: started.append(FakeJudge(script)) or started[-1]
    for judge in started:
        judge.stop()


@pytest.fixture(autouse=True)
def no_judge_environment(monkeypatch):
    for name in SETTINGS_ENV.values():  # a judge the host's shell names must not change these tests
        monkeypatch.delenv(name, raising=False)


def answer_of(body) -> str:
    return ANSWER.search(body["messages"][0]["content"]).group(1)


def grader(body, n):
    """A deterministic judge: "grade N" rates N; anything else is answered without a verdict."""
    found = re.fullmatch(r"grade (\d+)", answer_of(body))
    return f"Fine.\nRating: [[{found.group(1)}]]" if found else "I cannot decide."


def reward_for(judge, settings: str = "", **overrides):
    overrides = {"key_env": None, "retries": 1, "timeout": 5, **overrides}
    return judge_reward(judge.url + "/v1" + settings, **overrides)


def test_judge_reward_is_grade_minus_one_over_nine(judge_server):
    judge = judge_server(grader)
    reward = reward_for(judge, concurrency=1)
    assert reward(prompts=["Q1", "Q2", "Q3"], completions=["grade 10", "grade 1", "grade 4"]) == [1.0, 0.0, pytest.approx(3 / 9)]
    sent = judge.requests[0]["body"]
    assert sent["temperature"] == 0 and "model" not in sent
    assert "[Instruction]\nQ1\n" in sent["messages"][0]["content"]  # the evaluations' single-answer prompt, filled


def test_judge_reward_sends_requests_concurrently(judge_server):
    in_flight = threading.Barrier(4, timeout=10)  # passes only when 4 requests are at the server at once

    def script(body, n):
        in_flight.wait()  # a client asking one at a time breaks the barrier, and every reply below is malformed
        return grader(body, n)

    judge = judge_server(script)
    reward = reward_for(judge, concurrency=4, retries=0)
    values = reward(prompts=["Q"] * 8, completions=[f"grade {grade}" for grade in range(1, 9)])
    assert values == [pytest.approx((grade - 1) / 9) for grade in range(1, 9)]
    assert len(judge.requests) == 8


def test_judge_reward_identical_completions_cost_one_request_and_the_cache_file_serves_a_second_run(judge_server, tmp_path):
    judge = judge_server(grader)
    cache = tmp_path / "judge.jsonl"
    reward = reward_for(judge, f"#cache={cache}")
    group = ["grade 7"] * 4 + ["grade 3"]
    first = reward(prompts=["Q"] * 5, completions=group)
    assert first == [pytest.approx(6 / 9)] * 4 + [pytest.approx(2 / 9)]
    assert len(judge.requests) == 2 and reward.counts["cached"] == 3
    assert reward(prompts=["Q"] * 5, completions=group) == first and len(judge.requests) == 2  # memory
    assert len(cache.read_text().splitlines()) == 2

    resumed = reward_for(judge, f"#cache={cache}")  # a resumed run: the file answers, the judge is not asked
    assert resumed(prompts=["Q"] * 5, completions=group) == first and len(judge.requests) == 2
    assert resumed(prompts=["another Q"], completions=["grade 7"]) == [pytest.approx(6 / 9)]  # the prompt is in the key
    assert len(judge.requests) == 3


def test_judge_reward_cache_skips_a_torn_line_and_refuses_a_file_it_did_not_write(judge_server, tmp_path):
    judge = judge_server(grader)
    cache = tmp_path / "judge.jsonl"
    reward_for(judge, f"#cache={cache}")(prompts=["Q"], completions=["grade 5"])
    with open(cache, "a") as handle:
        handle.write('{"key": "abc')  # a crash mid-write
    again = reward_for(judge, f"#cache={cache}")
    assert again(prompts=["Q", "Q"], completions=["grade 5", "grade 2"]) == [pytest.approx(4 / 9), pytest.approx(1 / 9)]
    assert len(judge.requests) == 2  # "grade 5" came from the file
    assert len(reward_for(judge, f"#cache={cache}").grades) == 2  # the torn line was ended, the new one reads back

    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    with pytest.raises(GptlabError, match=r"notes.txt line 1 is not a grade"):
        reward_for(judge, f"#cache={notes}")
    assert notes.read_text() == "my notes\n"
    with pytest.raises(GptlabError, match="its folder does not exist"):
        reward_for(judge, f"#cache={tmp_path / 'missing' / 'judge.jsonl'}")


def test_judge_reward_retries_a_server_error_then_takes_the_grade(judge_server):
    judge = judge_server(lambda body, n: error(500, "busy", {"Retry-After": "0"}) if n == 0 else grader(body, n))
    reward = reward_for(judge)
    assert reward(prompts=["Q"], completions=["grade 9"]) == [pytest.approx(8 / 9)]
    assert len(judge.requests) == 2


def test_judge_reward_refuses_an_unreachable_judge_when_built():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(GptlabError, match=f"cannot reach the judge at http://127.0.0.1:{port}"):
        judge_reward(f"http://127.0.0.1:{port}/v1", key_env=None, timeout=2)


def test_judge_reward_ungradable_reply_is_none_left_out_of_the_mean_and_warned(judge_server):
    judge = judge_server(grader)
    said = []
    reward = reward_for(judge)
    reward.log = said.append
    scores = Rewards([reward]).score(["Q", "Q"], ["grade 10", "no idea"])
    assert scores.values["judge"] == [1.0, None] and scores.total == [1.0, 0.0] and scores.means["judge"] == 1.0
    assert len(judge.requests) == 1 + 2  # the malformed verdict was re-asked once (retries=1)
    assert reward.counts["failed_malformed"] == 1
    assert said == ["warning: the judge could not grade 1 of 2 replies (malformed 1); they count 0 and are left out of its mean"]


def test_judge_reward_raises_when_no_request_gets_through(judge_server):
    judge = judge_server(lambda body, n: error(400, "context too long"))
    with pytest.raises(GptlabError, match=r"graded none of 2 replies \(http_error 2; e.g. HTTP 400 .*context too long"):
        reward_for(judge)(prompts=["Q", "Q"], completions=["grade 1", "grade 2"])


def test_judge_reward_in_a_spec_beside_the_verifier(judge_server):
    judge = judge_server(lambda body, n: "Rating: [[10]]" if answer_of(body).startswith("The answer") else "Rating: [[1]]")
    task = Arithmetic()
    examples = task.examples("test", 2)
    rewards = Rewards.from_spec(f"verifier,judge:{judge.url}/v1#key_env=*0.5", task=task)
    replies = [f"The answer is {examples[0].answer}.", "It is 1000000."]
    scores = rewards.score([example.question for example in examples], replies, **example_columns(examples))
    assert rewards.names == ["verifier", "judge"]
    assert scores.values["verifier"] == [1.0, 0.0] and scores.values["judge"] == [1.0, 0.0]
    assert scores.total == [1.5, 0.0]


def test_judge_settings_from_url_fragment_and_environment(judge_server, monkeypatch):
    monkeypatch.setenv("GPTLAB_JUDGE_MODEL", "from-env")
    settings = JudgeSettings.from_url("http://h:8000/v1#model=qwen&concurrency=16&key_env=MY_KEY&timeout=2.5")
    assert (settings.url, settings.model, settings.concurrency, settings.key_env, settings.timeout) == \
        ("http://h:8000/v1", "qwen", 16, "MY_KEY", 2.5)
    assert JudgeSettings.from_url("http://h:8000").model == "from-env"
    judge = judge_server(grader)
    reward_for(judge)(prompts=["Q"], completions=["grade 2"])
    assert judge.requests[-1]["body"]["model"] == "from-env"
    for bad, message in (("#modle=x", "judge setting 'modle=x'"), ("#concurrency=many", "concurrency='many' must be a whole number"),
                         ("#concurrency=0", "at least 1")):
        with pytest.raises(GptlabError, match=message):
            JudgeSettings.from_url("http://h:8000/v1" + bad)
    with pytest.raises(GptlabError, match="not an http"):
        JudgeSettings.from_url("h:8000")


def test_instruction_text_of_a_conversation_names_each_turn():
    assert instruction_text("Name a prime.") == "Name a prime."
    assert instruction_text([{"role": "user", "content": "Hi"}]) == "Hi"
    conversation = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}]
    assert instruction_text(conversation) == "User: 2+2?\n\nAssistant: 4\n\nUser: And 3+3?"
    with pytest.raises(GptlabError, match="a prompt is text or a list of messages"):
        instruction_text(42)

