"""PPO's prompts from files, datasets and tasks: read, checked and held out; each a conversation ending with the user's turn.

Named in a mixture spec as sft's and dpo's --data (gptlab.chat.data: comma-separated parts, `[n=...,split=...]` options):

    prompts.jsonl      one prompt per line:
                       {"prompt": "Write a haiku"}                          text: one user message
                       {"prompt": [{"role": "system", ...}, {"role": "user", ...}]}   messages ending with the user's
                       {"messages": [a conversation]}                       up to and including its last user message
                       {"chosen": [conversation], "rejected": [conversation]}
                                                                            a preference pair without a prompt: the messages
                                                                            both share (gptlab.align.preference.pairs.parse_pair)
    hf:NAME, hf:/dir   a dataset with those columns, e.g. UltraFeedback binarized's `prompt` (splits train_prefs,
                       test_prefs); [column=NAME] reads the prompt (text or messages) from another column
    task:NAME[n=N]     a built-in task's questions; the task's example rides along (the verifier, the `answer` column)

A row with a "prompt" is read by it first, so a pair file's rows give their prompt whatever their replies hold.
Held out: the rows of a separate spec (e.g. the test split), or else ceil(val_fraction x rows) of each file and dataset
(chosen by their content, as SFT's: gptlab.chat.data.held_out) and ceil(val_fraction x n) of a task part's test split.
Malformed rows are named by file:line or dataset row and skipped (counted, reported) or refused (on_error).

The rewards of replies to them (prompt_scorer: TRL's call, the prompt as text or messages) and the held-out measure
(greedy_rewards before and after, reward_change: the paired interval) are here too.
Not here: the trainer that samples them (gptlab.align.rl.ppo), the reward functions (gptlab.align.rl.rewards).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gptlab.align.preference.pairs import parse_pair, read_rows
from gptlab.align.rl.rewards import VERIFIER, Rewards
from gptlab.align.rl.rollout import answer_text, rollout, tool_prompt
from gptlab.chat import ChatFormat
from gptlab.chat.data import (
    ON_ERROR,
    PartConfig,
    RowReader,
    SourceReport,
    held_out,
    load_task,
    parse_mixture,
    task_examples,
)
from gptlab.chat.format import check_messages
from gptlab.chat.tasks.base import Example
from gptlab.eval.stats import mean_interval
from gptlab.infer.generate import SamplingConfig
from gptlab.runtime import GptlabError

SHOWN_REASONS = 3  # problems an error for a spec with no valid prompt quotes


@dataclass(frozen=True)
class Prompt:
    """A conversation to answer: messages ending with the user's turn, and what the source says about the reply."""

    messages: tuple  # ({"role": ..., "content": ...}, ...), the last the user's
    reply: str = ""  # a reply the source gives (a pair's chosen one, the conversation's next turn, a task's); "" if none
    example: Example | None = None  # a task prompt's example (the verifier's and the `answer` column's); None from files

    @property
    def question(self) -> str:
        """The last user message: what completions.jsonl shows."""
        return self.messages[-1]["content"]

    @property
    def answer(self) -> str | None:
        return self.example.answer if self.example is not None else None

    @property
    def for_rewards(self) -> str | list[dict]:
        """What reward functions get as the prompt: the question's text alone, or the messages when there are more."""
        return self.question if len(self.messages) == 1 else [dict(message) for message in self.messages]


def parse_prompt(record: object, column: str = "") -> Prompt:
    """A Prompt from a row in any form of the module docstring (or its `column`); GptlabError says what is wrong."""
    if not isinstance(record, Mapping):
        raise GptlabError('not an object with "prompt" or "messages"')
    if column:
        if column not in record:
            raise GptlabError(f"no {column!r} column (it has: {', '.join(record)})")
        return _prompt(record[column], "")
    if "prompt" in record and record["prompt"] is not None:
        chosen = record.get("chosen")
        return _prompt(record["prompt"], _last_text(chosen) if chosen is not None else "")
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
            raise GptlabError('"messages" must be a list of {"role": ..., "content": ...} messages')
        users = [n for n, message in enumerate(messages) if message.get("role") == "user"]
        if not users:
            raise GptlabError('"messages" has no user message to answer')
        after = messages[users[-1] + 1 : users[-1] + 2]
        return _prompt(messages[: users[-1] + 1], _last_text(after) if after else "")
    if "chosen" in record and "rejected" in record:
        pair = parse_pair(record)
        return Prompt(tuple(pair.prompt), pair.chosen)
    raise GptlabError('no "prompt" or "messages" field (a prompt row is {"prompt": "..."} or {"messages": [...]})')


def _prompt(value: object, reply: str) -> Prompt:
    messages = [{"role": "user", "content": value}] if isinstance(value, str) else value
    check_messages(messages, for_generation=True)  # type: ignore[arg-type]
    if messages[-1]["role"] != "user":  # type: ignore[index]
        raise GptlabError("the prompt's last message is not the user's: end it with the question to answer")
    return Prompt(tuple({"role": m["role"], "content": m["content"]} for m in messages), reply)  # type: ignore[union-attr]


def _last_text(value: object) -> str:
    """A reply's text: "text", or the last message's content of a list of messages; "" otherwise."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and isinstance(value[-1], Mapping) and isinstance(value[-1].get("content"), str):
        return value[-1]["content"]
    return ""


def read_prompts(part: PartConfig, split: str = "train", n: int | None = None, *,
                 on_error: str = "skip") -> tuple[list[Prompt], SourceReport]:
    """The valid prompts of a part in source order and the report of what was skipped.
    A task part makes n examples of its `split` (files and datasets: split and n come from the part)."""
    if part.kind == "task":
        task, examples = task_examples(part, split, n)
        return [Prompt(tuple(task.conversation(e)[:-1]), e.reply, e) for e in examples], \
            SourceReport(part.source, read=len(examples), kept=len(examples), unit="prompts")
    column = "" if part.column == "messages" else part.column  # the default: a row's prompt, messages or pair
    if part.kind != "hf" and (part.split != "train" or column):
        raise GptlabError(f"{part.source}: split and column are options of hf: datasets and tasks, not of .jsonl files")
    reader = RowReader(part, on_error, parse=lambda record: parse_prompt(record, column), unit="prompts")
    return read_rows(part, reader, column or "prompt")


@dataclass
class PromptSplits:
    """The prompts trained on and those held out for the before/after measures, with a report per source."""

    train: list[Prompt]
    val: list[Prompt]
    reports: list[SourceReport]
    files: int  # the file and dataset parts of the train spec
    tasks: list[PartConfig]  # the task: parts of the train spec (a verifier needs every prompt from one task)

    def one_task(self):
        """The task every train prompt comes from (its verifier can score them all), or None."""
        kinds = {(part.source, part.task_options) for part in self.tasks}
        if len(kinds) != 1 or self.files:
            return None
        source, options = kinds.pop()
        return load_task(source.removeprefix("task:"), options)

    def summary(self) -> str:
        return "\n".join(report.summary() for report in self.reports)


def load_prompts(spec: str, *, val_fraction: float = 0.0, heldout: str = "", on_error: str = "skip") -> PromptSplits:
    """Train and held-out prompts of a spec (module docstring); one line naming the first problems when none is valid."""
    if on_error not in ON_ERROR:
        raise GptlabError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
    train, val, reports = [], [], []
    parts = _parts(spec, "--prompts")
    for part in parts:
        fraction = 0.0 if heldout else val_fraction
        if part.kind == "task":
            kept, report = read_prompts(part, part.split, part.n, on_error=on_error)
            if fraction > 0:
                held, held_report = read_prompts(part, "test", math.ceil(fraction * part.n) if part.n else None, on_error=on_error)
                val += held
                report.read, report.kept = report.read + held_report.read, report.kept + held_report.kept
                report.val = len(held)
        else:
            rows, report = read_prompts(part, on_error=on_error)
            chosen = held_out(part.source, rows, fraction) if rows else set()
            kept = [prompt for i, prompt in enumerate(rows) if i not in chosen]
            val += [rows[i] for i in sorted(chosen)]
            report.val = len(chosen)
        report.train = len(kept)
        train += kept
        reports.append(report)
    _refuse_empty(spec, train, reports)
    if heldout:
        for part in _parts(heldout, "--heldout-prompts"):
            rows, report = read_prompts(part, part.split, part.n, on_error=on_error)
            report.val = len(rows)
            val += rows
            reports.append(report)
    tasks = [part for part in parts if part.kind == "task"]
    return PromptSplits(train, val, reports, files=len(parts) - len(tasks), tasks=tasks)


def _parts(spec: str, flag: str) -> tuple[PartConfig, ...]:
    parts = parse_mixture(spec)
    for part in parts:
        if part.epochs != 1.0:
            raise GptlabError(f"{flag} {part.source}@{part.epochs:g}: prompts take no @EPOCHS (each rollout draws from the "
                              "whole pool); repeat a source's share with n= on the others")
    return parts


def _refuse_empty(spec: str, prompts: list[Prompt], reports: list[SourceReport]) -> None:
    if prompts:
        return
    reasons = [f"{report.source}: no rows (an empty file?)" for report in reports if not report.read]
    reasons += [problem for report in reports for problem in report.problems]
    more = len(reasons) - SHOWN_REASONS + sum(report.skipped - len(report.problems) for report in reports)
    raise GptlabError(f"--prompts {spec} holds no prompt to train on: " + "; ".join(reasons[:SHOWN_REASONS])
                      + (f"; and {more:,} more" if more > 0 else "") + "; fix the rows (each is named by file:line) or name other sources")


# ---------------------------------------------------------------- scoring replies to them, and the held-out measure


def names_verifier(spec: str) -> bool:
    """Whether a reward spec has a `verifier` term (gptlab.align.rl.rewards), e.g. "verifier*2,my.py:brevity" -> True."""
    return any(term.partition("*")[0].strip() == VERIFIER for term in spec.split(","))


def prompt_scorer(spec: str, task=None) -> Callable[[list[Prompt], list[str]], tuple[list[float], dict[str, float]]]:
    """(prompts, completions) -> (a reward each, each reward function's mean), as grpo_rollouts.make_scorer for Prompts.

    Reward functions get the question's text, or the messages of a longer conversation, as each prompt; the columns
    `example` and `answer` are None for prompts from files and datasets, `question` is the last user message.
    `task` scores a `verifier` term (every prompt must be that task's)."""
    rewards = Rewards.from_spec(spec, task=task)

    def score(prompts: list[Prompt], texts: list[str]) -> tuple[list[float], dict[str, float]]:
        columns = {"example": [p.example for p in prompts], "question": [p.question for p in prompts],
                   "answer": [p.answer for p in prompts]}
        scores = rewards.score([p.for_rewards for p in prompts], texts, **columns)
        return scores.total, scores.means if len(scores.means) > 1 else {}

    return score


def greedy_rewards(model, chat: ChatFormat, prompts: list[Prompt], score, sampling: SamplingConfig, *,
                   slots: int | None = None, tools=None) -> list[float]:
    """Each held-out prompt's reward for the model's greedy reply: the same replies on every call with the same
    weights, so before and after differ by what training changed alone."""
    if not prompts:
        return []
    greedy = dataclasses.replace(sampling, temperature=0.0)
    groups = rollout(model, [tool_prompt(chat, list(p.messages), tools) for p in prompts], greedy, samples=1, slots=slots,
                     tools=tools)
    texts = [answer_text(chat, group[0].tokens, tools) for group in groups]
    return score(prompts, texts)[0]


def reward_change(before: list[float], after: list[float]) -> str:
    """The change of the mean held-out reward on the same prompts, with its 95% paired t interval over prompts."""
    differences = [b - a for a, b in zip(before, after)]
    low, high = mean_interval(differences) if len(differences) > 1 else (math.nan, math.nan)
    return (f"change in held-out reward on the same {len(differences)} prompts: {math.fsum(differences) / len(differences):+.4f} "
            f"(95% CI {low:+.4f} to {high:+.4f}, paired t interval)")
