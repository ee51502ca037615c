"""Rewards for GRPO: reward functions called as TRL calls them, loaded from a spec, weighted and summed.

A reward function scores a batch of completions at once, with keyword arguments only:

    def brevity(prompts, completions, **columns):
        return [1.0 - min(len(text), 400) / 400 for text in completions]

    fn(prompts=list[str], completions=list[str], **columns) -> list[float | None]

`columns` are lists aligned with the completions (one item per completion): `example`
(the gptlab.chat.tasks Example), `question` and `answer` (its fields; see `example_columns`),
and whatever else the trainer passes. A function names the columns it reads and takes
`**columns` for the rest, as TRL's reward functions do, so one file works in both. A
completion is text; a conversational one (a list of {"role", "content"} messages) is
read by `completion_text` as its last message's content.

Each item it returns is a float for that completion, or None: "this function has no
reward for it" (say, a format reward for a task it does not apply to). None counts as
0 in the weighted sum and is left out of the function's logged mean. Anything else (a
list of the wrong length, text, NaN or inf) raises one GptlabError naming the function.

A reward spec, as the CLI takes it, is comma-separated terms, each `REWARD` or `REWARD*WEIGHT`:

    verifier                                the task's verifier: 1.0 right, 0.0 wrong (Task.reward)
    verifier,my_rewards.py:brevity          the sum of both, each weight 1
    verifier,my_rewards.py:brevity*0.1      brevity weighted 0.1
    verifier*2,mypackage.rewards:length*-0.01
                                            a module on the Python path; a negative weight is a penalty
    verifier,my_rewards.py:brevity*0        brevity logged, but not trained on

    verifier,rm:runs/rm*0.5                 a trained reward model (gptlab rm) scores each reply
    judge:http://localhost:8000/v1          an LM judge grades each reply (gptlab.align.rl.judge_reward)

REWARD is `verifier`, `rm:DIR`, `judge:URL`, `path/to/file.py:function` (loaded from the file, nothing installed;
a path ends in .py) or `package.module:function` (imported). The total reward of a
completion is the sum of weight × value over the terms. Paths with a comma or `*` in
them cannot be written in a spec; build `Rewards` in Python for those.

Not here: sampling completions and the GRPO loss (gptlab.align.rl.grpo); the tasks and
their verifiers (gptlab.chat.tasks).
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gptlab.chat.tasks import Example, Task
from gptlab.runtime import GptlabError
from gptlab.runtime.user_code import first_line, load_module_from_file, public_functions

RewardFn = Callable[..., list]  # fn(prompts=[...], completions=[...], **columns) -> [float | None, ...]
VERIFIER = "verifier"
SHOWN_CHARS = 120  # how much of a bad return value an error quotes


def completion_text(completion: str | list[dict]) -> str:
    """A completion's text: the string itself, or a conversational completion's last message's content."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise GptlabError(f"a completion is text or a list of messages, got {type(completion).__name__}: {completion!r:.{SHOWN_CHARS}}")


def example_columns(examples: Sequence[Example]) -> dict[str, list]:
    """The columns rewards read, one item per completion: {"example": [...], "question": [...], "answer": [...]}."""
    return {
        "example": list(examples),
        "question": [example.question for example in examples],
        "answer": [example.answer for example in examples],
    }


def verifier_reward(task: Task) -> RewardFn:
    """The task's own `reward(example, completion)` as a reward function; it reads the `example` column."""

    def verifier(prompts: list, completions: list, example: list[Example], **columns) -> list[float]:
        return [task.reward(item, completion_text(completion)) for item, completion in zip(example, completions)]

    verifier.__qualname__ = f"verifier_reward({task!r})"
    return verifier


# ---------------------------------------------------------------- loading user functions


def load_reward(spec: str) -> RewardFn:
    """The function `spec` names: "path/to/file.py:function" (run from the file) or "package.module:function"."""
    where, colon, name = spec.rpartition(":")
    if not colon or not where.strip() or not name.strip():
        raise GptlabError(f"reward {spec!r}: write path/to/file.py:function, package.module:function or {VERIFIER!r}")
    where, name = where.strip(), name.strip()
    is_file = where.endswith(".py") or "/" in where or "\\" in where
    module = load_module_from_file(where, f"reward {spec!r}") if is_file else _import(spec, where)
    if not hasattr(module, name):
        defined = sorted(public_functions(module))
        raise GptlabError(f"reward {spec!r}: {where} has no {name!r} (it defines: {', '.join(defined) or 'no functions'})")
    function = getattr(module, name)
    if not callable(function):
        raise GptlabError(f"reward {spec!r}: {name} is a {type(function).__name__}, not a function; name a function there")
    return function


def _import(spec: str, module_name: str):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and module_name.startswith(error.name):
            raise GptlabError(
                f"reward {spec!r}: no module named {error.name!r}; give a file as path/to/file.py:function, "
                "or install the package that holds the module"
            ) from None
        raise GptlabError(f"reward {spec!r}: importing {module_name} raised ModuleNotFoundError: {first_line(error)}") from None
    except Exception as error:
        raise GptlabError(f"reward {spec!r}: importing {module_name} raised {type(error).__name__}: {first_line(error)}") from None


# ---------------------------------------------------------------- several rewards, weighted


@dataclass(frozen=True)
class Reward:
    """One term of a reward: a function, its weight, and the name its mean is logged under."""

    name: str
    function: RewardFn
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not callable(self.function):
            raise GptlabError(f"reward {self.name!r} is a {type(self.function).__name__}, not a function")
        if isinstance(self.weight, bool) or not isinstance(self.weight, numbers.Real) or not math.isfinite(self.weight):
            raise GptlabError(f"reward {self.name!r}: weight must be a finite number, got {self.weight!r}")


@dataclass(frozen=True)
class Scores:
    """What `Rewards.score` gives: the weighted sum per completion, each function's values, and their means."""

    total: list[float]  # per completion: sum of weight × value, None counted as 0
    values: dict[str, list[float | None]]  # per function name: its values as returned
    means: dict[str, float]  # per function name: mean of its non-None values (nan if all were None)


class Rewards:
    """Several reward functions with weights, summed per completion.

    rewards = Rewards.from_spec("verifier,my_rewards.py:brevity*0.1", task=task)
    scores = rewards.score(prompts, completions, **example_columns(examples))
    scores.total -> [1.08, 0.02, ...]    scores.means -> {"verifier": 0.5, "brevity": 0.4}
    """

    def __init__(self, rewards: Sequence[Reward | RewardFn]) -> None:
        terms = [term if isinstance(term, Reward) else Reward(_function_name(term), term) for term in rewards]
        if not terms:
            raise GptlabError(f"no reward functions: name at least one, e.g. {VERIFIER!r}")
        self.rewards: list[Reward] = []
        seen: dict[str, int] = {}
        for term in terms:  # log names must differ: a second "brevity" is logged as "brevity_2"
            seen[term.name] = seen.get(term.name, 0) + 1
            name = term.name if seen[term.name] == 1 else f"{term.name}_{seen[term.name]}"
            self.rewards.append(Reward(name, term.function, term.weight))

    @classmethod
    def from_spec(cls, spec: str, *, task: Task | None = None) -> Rewards:
        """The rewards a spec names (module docstring); `task` supplies `verifier`."""
        return cls(parse_rewards(spec, task=task))

    @property
    def names(self) -> list[str]:
        return [reward.name for reward in self.rewards]

    def score(self, prompts: Sequence, completions: Sequence, **columns) -> Scores:
        """Every function called once on the batch, its values checked, weighted and summed."""
        for column, items in columns.items():
            if len(items) != len(completions):
                raise GptlabError(f"column {column!r} has {len(items)} items for {len(completions)} completions; give one per completion")
        total = [0.0] * len(completions)
        values, means = {}, {}
        for reward in self.rewards:
            _check_signature(reward, columns)
            returned = _call(reward, list(prompts), list(completions), columns)
            checked = _check_values(reward, returned, len(completions))
            for index, value in enumerate(checked):
                if value is not None:
                    total[index] += reward.weight * value
            given = [value for value in checked if value is not None]
            values[reward.name] = checked
            means[reward.name] = sum(given) / len(given) if given else math.nan
        return Scores(total, values, means)


def parse_rewards(spec: str, *, task: Task | None = None) -> list[Reward]:
    """Terms from a spec: "verifier,my.py:brevity*0.1" -> [Reward("verifier", ...), Reward("brevity", ..., weight=0.1)]."""
    terms = []
    for text in (piece.strip() for piece in spec.split(",")):
        if not text:
            raise GptlabError(f"reward spec {spec!r} has an empty term; write REWARD[*WEIGHT] terms separated by commas")
        name, star, weight_text = text.partition("*")
        weight = 1.0
        if star:
            try:
                weight = float(weight_text)
            except ValueError:
                raise GptlabError(f"reward {text!r}: the weight after * must be a number, e.g. {name.strip()}*0.1") from None
        name = name.strip()
        kind, colon, where = name.partition(":")
        if colon and kind in REWARD_KINDS:
            terms.append(Reward(kind, _load_kind(kind, where.strip()), weight))
        elif name == VERIFIER:
            if task is None:
                raise GptlabError(f"reward {VERIFIER!r} needs a task to verify against (pass task=...)")
            terms.append(Reward(VERIFIER, verifier_reward(task), weight))
        else:
            terms.append(Reward(name.rpartition(":")[2].strip() or name, load_reward(name), weight))
    return terms


# prefixed terms: "rm:DIR" a trained reward model, "judge:URL" an LM judge; the module and factory that build each
REWARD_KINDS = {"rm": ("gptlab.align.rl.rm_reward", "reward_model_reward"), "judge": ("gptlab.align.rl.judge_reward", "judge_reward")}


def _load_kind(kind: str, where: str) -> RewardFn:
    """The reward function of a prefixed term, built by its module's factory (imported only when named)."""
    if not where:
        raise GptlabError(f"reward {kind}: needs {'a reward model folder, e.g. rm:runs/rm' if kind == 'rm' else 'a URL, e.g. judge:http://localhost:8000/v1'}")
    module, factory = REWARD_KINDS[kind]
    return getattr(importlib.import_module(module), factory)(where)


def _function_name(function: Callable) -> str:
    return getattr(function, "__name__", None) or type(function).__name__


def _check_signature(reward: Reward, columns: dict) -> None:
    """Refuse a function that cannot take the call before making it, naming the column it lacks or the fix."""
    try:
        signature = inspect.signature(reward.function)
    except (TypeError, ValueError):  # some builtins and C callables have no signature to read
        return
    try:
        signature.bind(prompts=[], completions=[], **columns)
    except TypeError as error:
        given = {"prompts", "completions", *columns}
        missing = [
            name for name, parameter in signature.parameters.items()
            if parameter.default is parameter.empty and name not in given
            and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
        ]
        if missing:
            raise GptlabError(
                f"reward {reward.name!r} reads the column {missing[0]!r}, which was not passed (columns: {', '.join(columns) or 'none'}); "
                "gptlab.align.rl.rewards.example_columns(examples) makes example, question and answer"
            ) from None
        raise GptlabError(
            f"reward {reward.name!r} cannot be called with prompts, completions and the columns {', '.join(columns) or '(none)'} "
            f"({error}); define it as def {reward.name}(prompts, completions, **columns)"
        ) from None


def _call(reward: Reward, prompts: list, completions: list, columns: dict) -> object:
    """The function's return value; an exception in a user's function becomes one line naming it and where it raised
    (`reward brevity (my_rewards.py:12) raised ZeroDivisionError: division by zero`), not a traceback into gptlab.
    gptlab's own rewards (the verifier) raise as they are: their failure is a bug to see in full."""
    try:
        return reward.function(prompts=prompts, completions=completions, **columns)
    except GptlabError:
        raise
    except Exception as error:
        if getattr(reward.function, "__module__", None) == __name__:
            raise
        raise GptlabError(f"reward {reward.name} ({_where_raised(reward.function, error)}) raised "
                          f"{type(error).__name__}: {first_line(error)}; fix the function") from None


def _where_raised(function: Callable, error: Exception) -> str:
    """file:line of the deepest frame in the function's own file (where the user's code raised), else of its definition."""
    code = getattr(inspect.unwrap(function), "__code__", None)
    home = code.co_filename if code is not None else None
    frames = traceback.extract_tb(error.__traceback__)
    inside = [frame for frame in frames if frame.filename == home] or frames[1:]
    if inside:
        return f"{_short_path(inside[-1].filename)}:{inside[-1].lineno}"
    return f"{_short_path(home)}:{code.co_firstlineno}" if code is not None else "its file unknown"


def _short_path(filename: str) -> str:
    """The path relative to the working folder when it is under it (as the user typed it), else as it is."""
    try:
        return str(Path(filename).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return filename


def _check_values(reward: Reward, returned: object, count: int) -> list[float | None]:
    """The values as floats (None kept), or one error saying what came back instead of a list of `count` numbers."""
    expected = f"return a list of {count} floats (or None), one per completion"
    if not isinstance(returned, (list, tuple)):
        raise GptlabError(f"reward {reward.name!r} returned a {type(returned).__name__} ({returned!r:.{SHOWN_CHARS}}); {expected}")
    if len(returned) != count:
        raise GptlabError(f"reward {reward.name!r} returned {len(returned)} values for {count} completions; {expected}")
    checked: list[float | None] = []
    for index, value in enumerate(returned):
        if value is not None and (not isinstance(value, numbers.Real) or not math.isfinite(value)):
            raise GptlabError(f"reward {reward.name!r} returned {value!r:.{SHOWN_CHARS}} for completion {index}; {expected}, finite")
        checked.append(None if value is None else float(value))
    return checked
