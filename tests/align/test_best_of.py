"""Best-of-n with a reward spec: the reward loads from a spec (a user file, `verifier` with a task), and `gptlab sample`
and `gptlab chat` print the candidate the reward scores highest among those gptlab generate samples with seed + k,
with its reward against the candidates' mean; bad input is one error line before any compute."""

import io
import json
import re
import sys

import pytest
import torch

from gptlab.align.rl.best_of import load_best_of_reward
from gptlab.chat import ChatFormat, add_chat_tokens
from gptlab.chat.tasks import get_task
from gptlab.cli.main import main
from gptlab.infer import SamplingConfig, generate
from gptlab.model import GPT, preset
from gptlab.model.io import save_model
from gptlab.runtime import GptlabError
from gptlab.tokenizer import Tokenizer

REWARDS = '''
def vowels(prompts, completions, **columns):
    return [float(sum(ch in "aeiou" for ch in text)) for text in completions]

def prompt_length(prompts, completions, **columns):
    return [float(len(str(prompt))) for prompt in prompts]

def broken(prompts, completions, **columns):
    return [1.0 / 0 for text in completions]
'''
LINE = re.compile(r"best of (\d+): reward ([^\s,)]+) \(mean ([^\s,)]+), min ([^\s,)]+), max ([^\s,)]+)\)")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny untrained chat model (fp32) with its tokenizer: noise, but the same noise every time."""
    text = "What is 12 + 7? It is 19. hello world, the quick brown fox jumps over the lazy dog 0123456789\n" * 20
    tokenizer = add_chat_tokens(Tokenizer.train([text], vocab_size=300))
    torch.manual_seed(0)
    model = GPT(preset("gpt2-tiny", vocab_size=tokenizer.vocab_size, block_size=128)).float()
    directory = tmp_path_factory.mktemp("best_of_model")
    save_model(model, directory)
    tokenizer.save(directory / "tokenizer")
    return directory, model.eval(), tokenizer


@pytest.fixture()
def rewards_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(REWARDS)
    return path


def vowels(text: str) -> float:
    return float(sum(ch in "aeiou" for ch in text))


def candidates(model, tokenizer, ids, stop_tokens, seeds, new=8) -> list[str]:
    """The texts gptlab generate samples alone, one per seed: the reference for best-of's candidates."""
    return [tokenizer.decode(generate(model, [ids], SamplingConfig(max_new_tokens=new, temperature=1.0, seed=seed, stop_tokens=stop_tokens,
                                                                   vocab_size=tokenizer.vocab_size))[0]) for seed in seeds]


def reported(err: str) -> list[tuple[float, ...]]:
    return [tuple(float(x) for x in match) for match in LINE.findall(err)]


# ---------------------------------------------------------------- the reward from a spec


def test_reward_from_a_user_file_scores_each_candidate_with_weights(rewards_file):
    reward = load_best_of_reward(f"{rewards_file}:vowels,{rewards_file}:prompt_length*0.5")
    assert reward("hi", ["aei", "xyz", "a"]) == [3.0 + 1.0, 0.0 + 1.0, 1.0 + 1.0]
    messages = [{"role": "user", "content": "Hi"}]  # a chat turn's prompt is its messages, passed as they are
    assert reward(messages, ["a"]) == [1.0 + 0.5 * len(str(messages))]


def test_verifier_scores_against_the_task_example_and_task_term_is_the_same():
    task = get_task("arithmetic")
    example = task.examples("test", 1)[0]
    for reward in (load_best_of_reward("verifier", task="arithmetic"), load_best_of_reward("task:arithmetic")):
        assert reward(example.question, [f"It is {example.answer}", "It is -1"], example=example) == [1.0, 0.0]


@pytest.mark.parametrize("spec, message", [
    ("verifier", "the verifier checks a task's known answer, and `gptlab chat` has none"),
    ("nowhere.py:fn", "file nowhere.py not found"),
    ("", "needs a reward spec"),
    ("task:nosuch", "unknown chat task 'nosuch'"),
])
def test_a_bad_reward_spec_is_one_error(spec, message):
    with pytest.raises(GptlabError, match=re.escape(message)):
        load_best_of_reward(spec, where="`gptlab chat`")


# ---------------------------------------------------------------- gptlab sample


def sample(folder, *flags) -> int:
    return main(["sample", "--checkpoint", str(folder), "--max-new-tokens", "8", "--temperature", "1", "--device", "cpu", *flags])


def test_sample_best_of_prints_the_rewards_favourite_and_its_reward_against_the_mean(folder, rewards_file, capsys):
    directory, model, tokenizer = folder
    assert sample(directory, "--prompt", "the", "--seed", "2", "--best-of", "4", "--reward", f"{rewards_file}:vowels",
                  "--num-samples", "2") == 0
    out, err = capsys.readouterr()
    ids = tokenizer.encode("the")
    lines = []
    for k in range(2):  # sample k's candidate j is seeded 2 + 4k + j
        texts = candidates(model, tokenizer, ids, ChatFormat(tokenizer).stop_tokens, [2 + 4 * k + j for j in range(4)])
        scores = [vowels(text) for text in texts]
        best = max(range(4), key=lambda j: (scores[j], -j))
        assert best > 0  # the favourite is not simply the first candidate
        lines.append("the" + texts[best] + "\n")
        assert reported(err)[k] == pytest.approx((4, scores[best], sum(scores) / 4, min(scores), max(scores)), abs=1e-3)
    assert out == lines[0] + "-" * 40 + "\n" + lines[1]


def test_sample_best_of_one_with_a_reward_is_plain_sampling(folder, rewards_file, capsys):
    directory, model, tokenizer = folder
    assert sample(directory, "--prompt", "the", "--seed", "5") == 0
    plain = capsys.readouterr().out
    assert sample(directory, "--prompt", "the", "--seed", "5", "--reward", f"{rewards_file}:vowels") == 0
    out, err = capsys.readouterr()
    assert out == plain and reported(err)[0][0] == 1


def test_sample_task_best_of_with_the_verifier(folder, capsys):
    directory, model, tokenizer = folder
    assert sample(directory, "--task", "arithmetic", "--seed", "1", "--best-of", "3", "--reward", "verifier") == 0
    out, err = capsys.readouterr()
    task, chat = get_task("arithmetic"), ChatFormat(tokenizer)
    example = task.examples("test", 1)[0]
    ids = chat.prompt([{"role": "user", "content": example.question}])
    texts = candidates(model, tokenizer, ids, chat.stop_tokens, [1, 2, 3])
    scores = [task.reward(example, text) for text in texts]
    best = max(range(3), key=lambda j: (scores[j], -j))
    assert out == example.question + "\n" + texts[best] + "\n"
    assert reported(err)[0] == pytest.approx((3, scores[best], sum(scores) / 3, min(scores), max(scores)))


@pytest.mark.parametrize("flags, message", [
    (["--prompt", "a", "--best-of", "3"], "--best-of 3 needs --reward SPEC"),
    (["--prompt", "a", "--best-of", "0", "--reward", "verifier"], "--best-of must be a whole number from 1"),
    (["--prompt", "a", "--best-of", "2", "--reward", "verifier"], "use `gptlab sample --task NAME --best-of N --reward verifier`"),
    (["--best-of", "2", "--reward", "verifier"], "give --prompt TEXT"),
])
def test_sample_bad_best_of_input_is_one_error_line_before_loading_the_model(tmp_path, flags, message, capsys):
    assert sample(tmp_path / "no_model_here", *flags) == 1  # the reward is checked first: no model needed to refuse
    err = capsys.readouterr().err
    assert err.startswith("gptlab: error:") and err.count("\n") == 1 and message in err


def test_sample_reward_that_raises_is_one_error_line_naming_it(folder, rewards_file, capsys):
    assert sample(folder[0], "--prompt", "the", "--best-of", "2", "--reward", f"{rewards_file}:broken") == 1
    err = capsys.readouterr().err
    assert err.startswith("gptlab: error: reward broken") and "ZeroDivisionError" in err and err.count("\n") == 1


# ---------------------------------------------------------------- gptlab chat


def test_chat_best_of_shows_the_rewards_favourite_with_a_line_under_it(folder, rewards_file, monkeypatch, capsys):
    directory, model, tokenizer = folder
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi there\n"))
    assert main(["chat", str(directory), "--temperature", "1", "--max-tokens", "8", "--device", "cpu", "--seed", "2",
                 "--best-of", "3", "--reward", f"{rewards_file}:vowels"]) == 0
    out, err = capsys.readouterr()
    chat = ChatFormat(tokenizer)
    texts = candidates(model, tokenizer, chat.prompt([{"role": "user", "content": "Hi there"}]), chat.stop_tokens, [2, 3, 4])
    scores = [vowels(text) for text in texts]
    best = max(range(3), key=lambda j: (scores[j], -j))
    assert best > 0  # the favourite is not simply the first candidate
    assert out == texts[best] + "\n"
    assert reported(err)[0] == pytest.approx((3, scores[best], sum(scores) / 3, min(scores), max(scores)), abs=1e-3)


def test_chat_verifier_is_refused_with_the_reason(folder, capsys):
    assert main(["chat", str(folder[0]), "--best-of", "2", "--reward", "verifier", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gptlab: error:") and "no known answer" in err and err.count("\n") == 1


END_HEAVY = '''
import json

def junk_past_the_end(prompts, completions, **columns):
    with open(__file__ + ".seen", "a") as seen:
        seen.write(json.dumps(completions) + "\\n")
    return [10.0 * text.count("<|end|>") + len(text) for text in completions]
'''


def end_heavy_chat_model(directory, tokenizer):
    """A chat model that says <|end|> about a third of the time whatever it reads (its final norm outputs a fixed
    vector along <|end|>'s embedding), and random other tokens otherwise: its samples run past the end of a reply."""
    torch.manual_seed(0)
    model = GPT(preset("gpt2-tiny", vocab_size=tokenizer.vocab_size, block_size=128)).float().eval()
    end = model.transformer["wte"].weight[tokenizer.special_tokens["<|end|>"]].detach()
    with torch.no_grad():
        model.transformer["ln_f"].weight.zero_()
        model.transformer["ln_f"].bias.copy_(end * 5.0 / end.dot(end))  # logit 5 for <|end|>, about 0 for the rest
    save_model(model, directory)
    tokenizer.save(directory / "tokenizer")
    return model


def test_sample_best_of_on_a_chat_model_scores_and_prints_only_the_reply_up_to_its_end_of_turn(folder, tmp_path, capsys):
    """--prompt on a chat model stops at <|end|>: a reward that favours junk past the end cannot pick it."""
    _, _, tokenizer = folder
    model = end_heavy_chat_model(tmp_path / "model", tokenizer)
    rewards = tmp_path / "junk.py"
    rewards.write_text(END_HEAVY)
    assert sample(tmp_path / "model", "--prompt", "the", "--seed", "3", "--best-of", "4", "--reward", f"{rewards}:junk_past_the_end") == 0
    out = capsys.readouterr().out
    ids = tokenizer.encode("the")
    past_the_end = candidates(model, tokenizer, ids, (tokenizer.eot_id,), range(3, 7))
    assert sum("<|end|>" in text for text in past_the_end) >= 2  # what was scored before: replies and what follows them
    replies = candidates(model, tokenizer, ids, ChatFormat(tokenizer).stop_tokens, range(3, 7))
    (scored,) = [json.loads(line) for line in (tmp_path / "junk.py.seen").read_text().splitlines()]
    assert scored == replies and not any("<|end|>" in text for text in scored)
    assert out == "the" + max(replies, key=len) + "\n"
