"""Tools in RL rollouts: the tool model's samples call the real calculator; what the calculator fed is read by the
policy but never trained on (no target, no log-prob, no loss, KL, value or advantage term); the trainer's log-probs
are a full forward pass's; `gptlab grpo` and `gptlab ppo` run with --tools and refuse a bad one before any compute."""

import json

import pytest
import torch

from gptlab.align.logprobs import IGNORE, token_logprobs
from gptlab.align.rl.grpo import GRPOConfig, GRPOTrainer, policy_loss
from gptlab.align.rl.rollout import generated_masks, pad_rows, rollout, tool_prompt
from gptlab.chat import ChatFormat
from gptlab.chat.tasks import Arithmetic
from gptlab.cli.main import main
from gptlab.infer.generate import SamplingConfig
from gptlab.model.io import load_model
from gptlab.tokenizer import Tokenizer
from gptlab.tools import load_tools
from gptlab.tools.turn import chat_tools

from ..conftest import TOOL_QUESTIONS

TASK = Arithmetic(digits=2, ops="*", tools=1, work=0)  # what the tool model was trained on (tests/conftest.py)
SPEC = "arithmetic[digits=2,ops=*,tools=1,work=0]"
SMALL = ["--train-examples", str(TOOL_QUESTIONS), "--max-new-tokens", "56", "--seq-len", "128",
         "--eval-examples", "2", "--eval-samples", "1", "--temperature", "0.5", "--device", "cpu", "--precision", "fp32"]


@pytest.fixture(scope="module")
def tool_chat(tool_model):
    return load_model(tool_model), ChatFormat(Tokenizer.load(tool_model / "tokenizer"))


def fed_and_expected(chat: ChatFormat, completion: list[int], mask: list[int]) -> tuple[list[int], list[int]]:
    """The tokens a completion's mask calls fed, and what the calculator answers to the calls the model wrote."""
    calculator = load_tools("calculator").session()
    expected = []
    messages = chat.parse_reply([t for t in completion if t != chat.bos])
    for message, after in zip(messages, messages[1:]):  # a call the reply was cut off in never ran
        results = [calculator.run(call["function"]["name"], call["function"]["arguments"]).text
                   for call in message.get("tool_calls", ())]
        expected += chat.result_ids(results) if results and after["role"] == "tool" else []
    return [t for t, own in zip(completion, mask) if not own], expected


def test_rollout_with_tools_feeds_the_calculators_result_ids_and_masks_them(tool_chat):
    model, chat = tool_chat
    tools = chat_tools(chat, load_tools("calculator"))
    prompts = [tool_prompt(chat, [{"role": "user", "content": e.question}], tools) for e in TASK.examples("train", 4)]
    sampling = SamplingConfig(max_new_tokens=56, temperature=0, stop_tokens=chat.stop_tokens, vocab_size=chat.tokenizer.vocab_size)
    completions = [group[0] for group in rollout(model, prompts, sampling, tools=tools)]
    masks = generated_masks(chat, completions, tools)
    for completion, mask in zip(completions, masks):
        fed, expected = fed_and_expected(chat, completion.tokens, mask)
        assert fed == expected and fed  # every sample called the calculator, and only its answers are masked
    x, y = pad_rows([p + c.tokens for p, c in zip(prompts, completions)], [len(p) for p in prompts],
                    max(len(p) + len(c.tokens) for p, c in zip(prompts, completions)), masks=masks)
    for row, (prompt, completion, mask) in enumerate(zip(prompts, completions, masks)):
        targets = y[row, len(prompt) - 1 : len(prompt) - 1 + len(completion.tokens)].tolist()
        assert targets == [t if own else IGNORE for t, own in zip(completion.tokens, mask)]
        assert x[row, len(prompt) : len(prompt) + len(completion.tokens) - 1].tolist() == completion.tokens[:-1]  # fed ones read


def test_grpo_rollout_log_probs_are_a_full_forward_pass_over_the_generated_tokens_only(tool_model, tool_chat, tmp_path):
    """epochs=2 keeps the rollout (with its old log-probs, from the weights that sampled) in the step-1 checkpoint."""
    config = GRPOConfig(init_from=str(tool_model), out=str(tmp_path / "run"), task=SPEC, prompts_per_step=2, group_size=2,
                        micro_batch=2, seq_len=128, max_new_tokens=56, max_steps=1, epochs=2, device="cpu", precision="fp32",
                        checkpoint_every=1, log_every=1, train_examples=TOOL_QUESTIONS, temperature=0.5, probe_samples=0,
                        prompt_filter="none", eval_examples=2, eval_samples=1)
    trainer = GRPOTrainer(config, log=lambda *_: None)
    assert trainer.tools is not None and [s["function"]["name"] for s in trainer.tools.specs] == ["calculator"]  # auto
    trainer.fit()
    buffer = json.loads((tmp_path / "run/checkpoints/step_000001/trainer_state.json").read_text())["loader"][0]["buffer"]
    model, chat = tool_chat
    calls = results = 0
    for sequence, start, mask, old in zip(buffer["sequences"], buffer["starts"], buffer["masks"], buffer["old"]):
        completion = sequence[start:]
        fed, expected = fed_and_expected(chat, completion, mask)
        assert fed == expected and mask == chat.generated_mask(completion)
        calls, results = calls + bool(fed), results + fed.count(chat.role_ids["tool"])
        with torch.no_grad():
            logits, _ = model(torch.tensor([sequence[:-1]]))
        full = torch.log_softmax(logits[0].double(), dim=-1)[torch.arange(len(sequence) - 1), torch.tensor(sequence[1:])]
        own = [start - 1 + i for i, m in enumerate(mask) if m]
        assert len(old) == sum(mask)  # the fed tokens have no log-prob: nothing of them is trained on
        torch.testing.assert_close(torch.tensor(old, dtype=torch.float64), full[own], rtol=0, atol=1e-4)
    assert calls >= 1
    metrics = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["tool_calls"] == pytest.approx(results / len(buffer["masks"]))


@pytest.mark.parametrize("loss", ["grpo", "dapo", "reinforce"])
def test_grpo_loss_gradient_does_not_depend_on_the_fed_tokens(tool_chat, loss):
    """Whatever log-probs, old log-probs or reference log-probs the fed positions hold, the gradient is the same."""
    model, chat = tool_chat
    prompt = tool_prompt(chat, [{"role": "user", "content": TASK.examples("train", 1)[0].question}], chat_tools(chat, load_tools("calculator")))
    call = [chat.call, *chat.encode('calculator {"expression": "3 * 4"}'), chat.end]
    completion = [*call, *chat.result_ids(["12"]), *chat.encode("12"), chat.end]
    mask = chat.generated_mask(completion)
    x, y = pad_rows([prompt + completion] * 2, [len(prompt)] * 2, len(prompt) + len(completion), masks=[mask] * 2)
    fed = torch.zeros_like(y, dtype=torch.bool)
    fed[:, len(prompt) - 1 :] = torch.tensor([not own for own in mask])
    assert (y[fed] == IGNORE).all() and fed.sum() == 2 * len(chat.result_ids(["12"]))
    config = GRPOConfig(loss=loss, kl_beta=0.1)
    batch = {"advantages": torch.tensor([1.0, -0.5]), "weights": torch.tensor([0.1, 0.1]),
             "ref_logp": torch.zeros(y.shape), "old_logp": torch.full(y.shape, -0.3)}

    def gradient(noise: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad()
        logp = token_logprobs(model, x, y) + noise * fed
        perturbed = {**batch, "ref_logp": batch["ref_logp"] + 5 * noise.detach() * fed,
                     "old_logp": batch["old_logp"] + 3 * noise.detach() * fed}
        if loss == "reinforce":
            perturbed.pop("old_logp")
        policy_loss(logp, y, perturbed, config).loss.backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    plain = gradient(torch.zeros(y.shape))
    noise = torch.randn(y.shape, requires_grad=True)
    shaken = gradient(noise)
    assert noise.grad.abs().sum() == 0
    assert any(g.abs().sum() > 0 for g in plain)
    for a, b in zip(plain, shaken):
        torch.testing.assert_close(a, b)


def test_grpo_and_ppo_cli_run_with_tools_and_log_tool_calls(tool_model, tmp_path, capsys):
    assert main(["grpo", "--init", str(tool_model), "--task", SPEC, "--out", str(tmp_path / "grpo"), "--max-steps", "2",
                 "--prompts-per-step", "2", "--group-size", "2", "--micro-batch", "4", "--tool-calls", "2", "--prompt-filter", "none", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "tools calculator" in out
    metrics = [json.loads(line) for line in (tmp_path / "grpo/metrics.jsonl").read_text().splitlines() if "tool_calls" in line]
    assert metrics and all(0 <= m["tool_calls"] <= 2 for m in metrics) and max(m["tool_calls"] for m in metrics) > 0
    assert main(["ppo", "--init", str(tool_model), "--task", SPEC, "--out", str(tmp_path / "ppo"), "--max-steps", "1",
                 "--rollout-prompts", "4", "--minibatches", "1", "--ppo-epochs", "2", "--micro-batch", "4", "--value-model",
                 "shared", "--checkpoint-every", "1", *SMALL]) == 0
    assert "tools calculator" in capsys.readouterr().out
    metrics = [json.loads(line) for line in (tmp_path / "ppo/metrics.jsonl").read_text().splitlines() if "tool_calls" in line]
    assert metrics and max(m["tool_calls"] for m in metrics) > 0
    state = json.loads((tmp_path / "ppo/checkpoints/step_000001/trainer_state.json").read_text())["loader"][0]["buffer"]
    for mask, *per_token in zip(state["masks"], state["old_logp"], state["old_values"], state["advantages"], state["returns"]):
        assert all(len(values) == sum(mask) for values in per_token)  # no value or advantage for a fed token


@pytest.mark.parametrize("command", ["grpo", "ppo"])
def test_unknown_tool_is_one_error_line_before_any_compute(tool_model, tmp_path, capsys, command):
    assert main([command, "--init", str(tool_model), "--task", SPEC, "--out", str(tmp_path / "run"), "--tools", "nosuchtool",
                 *SMALL]) == 1
    printed = capsys.readouterr()
    assert printed.err.count("\n") == 1 and "nosuchtool" in printed.err and "calculator" in printed.err
    assert "before:" not in printed.out and not (tmp_path / "run").exists()


def test_tools_none_rolls_out_without_the_tools_block(tool_model, tmp_path):
    config = GRPOConfig(init_from=str(tool_model), out=str(tmp_path / "run"), task=SPEC, tools="none", device="cpu",
                        train_examples=TOOL_QUESTIONS, prompt_filter="none")
    trainer = GRPOTrainer(config, log=lambda *_: None)
    example = TASK.examples("train", 1)[0]
    assert trainer.tools is None and trainer.prompt_ids(example) == trainer.chat.prompt([{"role": "user", "content": example.question}])
