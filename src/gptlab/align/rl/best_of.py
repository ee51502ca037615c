"""Best-of-n with a reward spec: the reward that `--best-of N --reward SPEC` picks by, over text.

    reward = load_best_of_reward("rm:runs/rm", where="gptlab chat")      # loaded before any sampling
    result = best_of_reply(engine, tokenizer, ids, config, n=8, reward=reward, prompt=messages)
    describe(result.summary())  -> "best of 8: reward 1.2 (mean 0.3, min -0.8, max 1.2)"

SPEC is a reward spec of gptlab.align.rl.rewards (`rm:DIR`, `judge:URL`, `file.py:function`,
`package.module:function`, weighted sums). `verifier` (or `task:NAME`, the same for that task)
checks a known answer, so it needs the task the question came from: `gptlab sample --task NAME`
has one; a chat turn or a served request does not, and is refused with the reason.

Each candidate is scored TRL-style: prompts are the prompt once per candidate (the user's question,
the text continued, or the conversation so far as messages), completions the candidates' text,
and with a task the `example`, `question` and `answer` columns. Not here: sampling and choosing
(gptlab.infer.best_of), the HTTP API (gptlab.serve.best_of).
"""

from __future__ import annotations

from dataclasses import dataclass

from gptlab.align.rl.grpo_rollouts import load_grpo_task
from gptlab.align.rl.rewards import VERIFIER, Rewards, example_columns
from gptlab.chat.tasks import Example, Task
from gptlab.infer.best_of import BestOf, check_best_of, check_scores, choose, sample_candidates
from gptlab.infer.engine import Engine
from gptlab.infer.generate import SamplingConfig
from gptlab.runtime import GptlabError

TASK_TERM = "task:"  # `task:NAME` in a spec: the verifier of that task


@dataclass(frozen=True)
class BestOfReward:
    """A reward spec, loaded: called with one prompt and its candidates' text, it returns one total each."""

    rewards: Rewards
    task: Task | None = None  # the task `verifier` checks against (None: no verifier in the spec)

    def __call__(self, prompt: str | list[dict], completions: list[str], example: Example | None = None) -> list[float]:
        if self.task is not None and example is None:
            raise GptlabError("the verifier needs the task example each prompt came from; pass example=")
        columns = example_columns([example] * len(completions)) if example is not None else {}
        return self.rewards.score([prompt] * len(completions), completions, **columns).total


def best_of_reward(n: int, spec: str | None, *, task: Task | str | None = None, where: str = "here") -> BestOfReward | None:
    """What `--best-of N --reward SPEC` picks by, loaded before any model (a bad value costs no compute): None for
    plain sampling; N out of range, or N above 1 without a reward, is one error naming the fix."""
    check_best_of(n, "--best-of")
    if spec is None:
        if n > 1:
            raise GptlabError(f"--best-of {n} needs --reward SPEC to choose by, e.g. --reward rm:runs/rm "
                              "or --reward my_rewards.py:brevity")
        return None
    return load_best_of_reward(spec, task=task, where=where)


def load_best_of_reward(spec: str, *, task: Task | str | None = None, where: str = "here") -> BestOfReward:
    """The reward `spec` names, loaded now (a bad spec is one error before any compute). `task` (a Task or
    NAME[options]) lets `verifier` check answers; `where` names the command in the error when it cannot."""
    if isinstance(task, str):
        task = load_grpo_task(task)
    terms, task = _task_terms(spec, task)
    if VERIFIER in _names(terms) and task is None:
        raise GptlabError(f"--reward {spec}: the verifier checks a task's known answer, and {where} has none; use "
                          "`gptlab sample --task NAME --best-of N --reward verifier`, or here a reward model (rm:DIR), "
                          "a judge (judge:URL) or your own file.py:function")
    rewards = Rewards.from_spec(terms, task=task)
    return BestOfReward(rewards, task if VERIFIER in rewards.names else None)


def _task_terms(spec: str, task: Task | None) -> tuple[str, Task | None]:
    """The spec with each `task:NAME` term written as `verifier`, and the task it names (which must agree with `task`)."""
    if not isinstance(spec, str) or not spec.strip():
        raise GptlabError(f"--reward needs a reward spec, e.g. rm:runs/rm or my_rewards.py:brevity; got {spec!r}")
    terms = []
    for term in spec.split(","):
        name, star, weight = term.partition("*")
        if name.strip().startswith(TASK_TERM):
            named = load_grpo_task(name.strip()[len(TASK_TERM):])
            if task is not None and named != task:
                raise GptlabError(f"--reward {spec}: {name.strip()} is not the task the questions come from ({task!r})")
            task, name = named, VERIFIER
        terms.append(f"{name.strip()}{star}{weight}")
    return ",".join(terms), task


def _names(spec: str) -> list[str]:
    return [term.partition("*")[0].strip() for term in spec.split(",")]


def best_of_reply(engine: Engine, tokenizer, prompt_ids: list[int], config: SamplingConfig, n: int, reward: BestOfReward,
                  prompt: str | list[dict], example: Example | None = None) -> tuple[BestOf, str]:
    """(the result, the chosen text): n candidates sampled together (candidate k seeded seed + k), decoded, scored
    by `reward` against `prompt` (and `example` for a verifier), the best kept."""
    candidates, reasons = sample_candidates(engine, prompt_ids, config, n)
    texts = [tokenizer.decode(tokens) for tokens in candidates]
    scores = check_scores(reward(prompt, texts, example=example), n)
    result = BestOf(choose(scores), candidates, reasons, scores)
    return result, texts[result.index]


def task_questions(task: Task | str, count: int) -> tuple[Task, list[Example]]:
    """The task and the first `count` questions of its test split: held out from training, answers known."""
    task = load_grpo_task(task) if isinstance(task, str) else task
    return task, task.examples("test", count)
