"""An LM judge as a reward: the `judge:URL` term of a reward spec (gptlab.align.rl.rewards), for GRPO and PPO.

    gptlab grpo ... --reward "verifier,judge:http://127.0.0.1:8000/v1*0.5"
    judge:http://127.0.0.1:8000/v1                         the server's own model; a key from $GPTLAB_JUDGE_API_KEY if set
    judge:http://127.0.0.1:8000/v1#model=qwen2.5-7b        name the judge's model at that server
    judge:https://api.openai.com/v1#model=gpt-4o-mini&key_env=OPENAI_API_KEY&concurrency=16&cache=runs/judge.jsonl

    reward = judge_reward("http://127.0.0.1:8000/v1#model=judge")       # from Python; keywords override the URL's
    reward(prompts=["Name a prime."], completions=["7"])  -> [0.889]    # the judge rated it 9

Each (prompt, reply) is graded 1-10 with the single-answer prompt of the evaluations (gptlab/eval/prompts/single.md,
MT-Bench's), through their client gptlab.eval.judge.JudgeClient (temperature 0; timeouts, 429 and 5xx retried with
backoff; a malformed verdict re-asked). The reward is (grade - 1) / 9, in [0, 1].

Settings ride after '#' as KEY=VALUE pairs joined by '&' (a URL's fragment is never sent to a server), each with an
environment default for runs started by a script:
    model        the judge's model name               default $GPTLAB_JUDGE_MODEL, else none sent (the server's own)
    key_env      variable holding the API key         default GPTLAB_JUDGE_API_KEY (unset or missing: no key sent)
    concurrency  requests in flight at once           default $GPTLAB_JUDGE_CONCURRENCY, else 8
    cache        a JSONL file of grades               default $GPTLAB_JUDGE_CACHE, else memory only
    prompts      a folder whose single.md replaces the built-in grading prompt
    retries      tries after the first, per request   default 4
    timeout      seconds per request                  default 60
A spec cannot hold ',' or '*' (rewards.py splits on them): write such paths through judge_reward(...) in Python.

Grades are cached by the judge's whole prompt (the prompt and reply filled into the template) with its URL and model,
so a group of identical completions costs one request, and, with a cache file, a resumed run or a second one pays
for none it already has. The file is one {"key": sha256, "grade": g} line per grade, each appended with one write
and fsynced, so a crash loses at most the line being written (a torn last line is skipped when read back).
Failed gradings are not cached: the next call asks again.

An unreachable judge is refused when the reward is built, before any compute. A reply the judge cannot grade (its
verdict malformed after the re-asks, or its request failed for good) gets None: 0 in the total, left out of the
judge's logged mean (gptlab.align.rl.rewards), and counted in a warning. A batch in which no request got through at
all raises GptlabError: a judge that went down would otherwise train the policy on zeros.
Not here: the client and the prompts (gptlab.eval.judge), combining rewards (gptlab.align.rl.rewards).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gptlab.align.rl.rewards import completion_text
from gptlab.eval.judge import JudgeClient, Judgement, base_url, load_templates
from gptlab.runtime import GptlabError

SETTINGS_ENV = {"model": "GPTLAB_JUDGE_MODEL", "concurrency": "GPTLAB_JUDGE_CONCURRENCY", "cache": "GPTLAB_JUDGE_CACHE"}
LOWEST, HIGHEST = 1.0, 10.0  # the single-answer prompt's scale


@dataclass(frozen=True, kw_only=True)
class JudgeSettings:
    """Where the judge is and how it is asked (the module docstring's URL settings)."""

    url: str  # the OpenAI-compatible server, with or without /v1
    model: str | None = None  # the judge's model name at that server; None: send none (the server's own)
    key_env: str | None = "GPTLAB_JUDGE_API_KEY"  # environment variable holding the API key; unset: no key sent
    concurrency: int = 8  # requests in flight at once
    cache: str | None = None  # JSONL file of grades kept across runs; None: memory only
    prompts: str | None = None  # folder whose single.md replaces the built-in grading prompt
    retries: int = 4  # tries after the first, for a failed request and for a malformed verdict
    timeout: float = 60.0  # seconds per request

    def __post_init__(self) -> None:
        base_url(self.url)  # raises on what is not an http(s) URL
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise GptlabError(f"judge concurrency must be a whole number of at least 1, got {self.concurrency!r}")

    @classmethod
    def from_url(cls, text: str) -> JudgeSettings:
        """Settings from "URL#key=value&key=value", environment defaults filling what it leaves out."""
        url, _, fragment = text.strip().partition("#")
        values: dict[str, object] = {key: os.environ[name] for key, name in SETTINGS_ENV.items() if os.environ.get(name)}
        for pair in filter(None, fragment.split("&")):
            key, equals, value = pair.partition("=")
            if not equals or key not in _SETTABLE:
                raise GptlabError(f"judge setting {pair!r} in {text!r}: write KEY=VALUE after '#', KEY one of {', '.join(_SETTABLE)}")
            values[key] = value
        for key in ("concurrency", "retries", "timeout"):
            if key in values:
                values[key] = _number(key, values[key], float if key == "timeout" else int)
        return cls(url=url, **values)


_SETTABLE = [field.name for field in dataclasses.fields(JudgeSettings) if field.name != "url"]


def _number(key: str, value: object, kind: type) -> int | float:
    try:
        return kind(value)
    except ValueError:
        raise GptlabError(f"judge setting {key}={value!r} must be a {'whole ' if kind is int else ''}number, e.g. {key}=8") from None


def judge_reward(url: str, **overrides) -> JudgeReward:
    """The reward function of `judge:URL` (settings in the module docstring; keywords override the URL's)."""
    return JudgeReward(dataclasses.replace(JudgeSettings.from_url(url), **overrides))


class JudgeReward:
    """fn(prompts, completions, **columns) -> [(grade - 1) / 9 or None]: an LM judge's grades as a reward."""

    __name__ = "judge"

    def __init__(self, settings: JudgeSettings, *, log: Callable[[str], None] | None = None) -> None:
        self.settings, self.log = settings, log or _print_on_rank_zero
        self.template = load_templates(settings.prompts)
        self.cache_path = Path(settings.cache) if settings.cache else None
        self.grades = read_cache(self.cache_path) if self.cache_path else {}
        self.client = JudgeClient(settings.url, settings.model, api_key_env=settings.key_env, timeout=settings.timeout,
                                  retries=settings.retries, concurrency=settings.concurrency)
        self.client.check_reachable()  # refuse an unreachable judge now, before a model is loaded or a rollout sampled
        self.counts: Counter = Counter()  # requests made, replies served from the cache, failures by kind

    def __call__(self, prompts: list, completions: list, **columns) -> list[float | None]:
        filled = [self.template.fill("single", instruction=instruction_text(prompt), answer=completion_text(completion))
                  for prompt, completion in zip(prompts, completions)]
        keys = [self.key(text) for text in filled]
        wanted = {key: text for key, text in zip(keys, filled) if key not in self.grades}  # one request per distinct prompt
        self.counts["cached"] += len(keys) - len(wanted)  # replies graded without a request of their own
        judgements = self.client.judge_all(list(wanted.values()), "single")
        self.counts["requests"] += len(judgements)
        fresh = {key: judgement.verdict for key, judgement in zip(wanted, judgements) if judgement.verdict is not None}
        self.grades.update(fresh)
        if self.cache_path is not None and fresh:
            append_cache(self.cache_path, fresh)
        self._report_failures([judgement for judgement in judgements if judgement.verdict is None], len(wanted))
        return [None if key not in self.grades else (self.grades[key] - LOWEST) / (HIGHEST - LOWEST) for key in keys]

    def key(self, prompt: str) -> str:
        """The cache key of a filled prompt: a different judge, model or template is a different grade."""
        identity = json.dumps([self.client.url, self.settings.model, prompt], ensure_ascii=False)
        return hashlib.sha256(identity.encode("utf-8")).hexdigest()

    def _report_failures(self, failed: list[Judgement], asked: int) -> None:
        """Count and warn of replies left ungraded; raise when the judge answered none of the batch's requests."""
        if not failed:
            return
        kinds = Counter(judgement.failure for judgement in failed)
        self.counts.update({f"failed_{kind}": count for kind, count in kinds.items()})
        detail = ", ".join(f"{kind} {count}" for kind, count in kinds.items())
        if len(failed) == asked and set(kinds) != {"malformed"}:
            raise GptlabError(f"the judge at {self.client.url} graded none of {asked} replies ({detail}; e.g. {failed[0].error}): "
                              "check that it is up and answering, or lower concurrency=")
        self.log(f"warning: the judge could not grade {len(failed)} of {asked} replies ({detail}); they count 0 "
                 "and are left out of its mean")

    def close(self) -> None:
        self.client.close()


def instruction_text(prompt: str | list[dict]) -> str:
    """What the judge reads as the instruction: the question, or a conversation's turns as "Role: text" blocks
    (one user message: its text alone)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(message, dict) for message in prompt):
        if len(prompt) == 1:
            return str(prompt[0].get("content", ""))
        return "\n\n".join(f"{str(message.get('role', 'user')).capitalize()}: {message.get('content', '')}" for message in prompt)
    raise GptlabError(f"a prompt is text or a list of messages, got {type(prompt).__name__}: {prompt!r:.120}")


def read_cache(path: Path) -> dict[str, float]:
    """The grades a cache file holds (none when it does not exist yet); a file this reward did not write is refused."""
    if path.is_dir() or not path.parent.is_dir():
        raise GptlabError(f"judge cache {path}: {'is a folder' if path.is_dir() else 'its folder does not exist'}; "
                          "name a file in an existing folder, e.g. cache=runs/judge.jsonl")
    if not path.exists():
        return {}
    grades = {}
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if line.startswith(_RECORD_START):
                continue  # a line torn by a crash mid-write (append_cache ends it before adding more)
            record = None
        grade = record.get("grade") if isinstance(record, dict) else None
        if not isinstance(record, dict) or not isinstance(record.get("key"), str) or isinstance(grade, bool) \
                or not isinstance(grade, (int, float)) or not math.isfinite(grade):
            raise GptlabError(f"judge cache {path} line {number} is not a grade this reward wrote ({line[:80]!r}); "
                              "name a new file or one written by a judge: reward")
        grades[record["key"]] = float(grade)
    return grades


_RECORD_START = '{"key": "'  # how every line append_cache writes begins


def append_cache(path: Path, grades: dict[str, float]) -> None:
    """Append one line per grade, each in a single write, then fsync: safe to share between ranks and to kill."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        if os.fstat(fd).st_size and _last_byte(path) != b"\n":
            os.write(fd, b"\n")  # end a torn line, so the next record starts its own
        for key, grade in grades.items():
            os.write(fd, (json.dumps({"key": key, "grade": grade}) + "\n").encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1)


def _print_on_rank_zero(text: str) -> None:
    """Warnings print once under torchrun, from rank 0 (a reward function has no trainer's logger to use)."""
    if os.environ.get("RANK", "0") == "0":
        print(text, flush=True)
