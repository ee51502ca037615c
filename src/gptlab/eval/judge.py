"""The LM judge: a client for any OpenAI-compatible endpoint, its prompt files, and strict verdict parsing.

    client = JudgeClient("http://127.0.0.1:8000", model="judge", api_key_env="GPTLAB_JUDGE_API_KEY")
    templates = load_templates()                       # or load_templates("my_prompts/") to replace some files
    judgement = client.judge(templates.fill("single", instruction="Name a prime.", answer="7"), parse_grade)
        Judgement(verdict=9, reply="... Rating: [[9]]", attempts=1, failure=None, error="")

The client POSTs `{url}/v1/chat/completions` (a URL given with or without its trailing /v1) at
temperature 0 (gptlab serve, llama-server, vLLM and OpenAI all answer it). Timeouts, dropped
connections, 429 and 5xx are retried with exponential backoff (a 429's or 503's Retry-After is
honoured); another 4xx is not, since asking again gets the same answer. 401, 403 and 404 stop the
run with a GptlabError: a wrong key, URL or model name fails every request alike. The API key is read
from an environment variable (never a command-line flag, which `ps` and shell history would show)
and sent as `Authorization: Bearer KEY`; it goes into no record.

Verdicts follow MT-Bench (Zheng et al. 2023, "Judging LLM-as-a-Judge"): the judge explains, then
ends with the verdict in double brackets. Parsing is strict: exactly one kind of verdict in the reply,
or the reply is malformed; a malformed reply is re-asked (the judge sees its reply and a reminder of
the format) up to `retries` times, then the judgement fails. A failed judgement is returned with its
kind (FAILURE_KINDS), never raised or dropped: the evaluations count it and report it.

    parse_pairwise("... [[A]]")       -> "A"       ("A", "B" or "tie")
    parse_grade("Rating: [[7]]")      -> 7.0       (1 to 10)
    parse_refusal("... [[REFUSED]]")  -> "REFUSED" ("REFUSED" or "COMPLIED")

Prompt files (prompts/*.md, package data) hold placeholders in braces: pairwise.md {instruction}
{answer_a} {answer_b}; single.md {instruction} {answer}; refusal.md {prompt} {answer}. Only those names
are replaced, once, so braces elsewhere in a file or inside an answer are left as they are.
Not here: the evaluations built on the client (gptlab.eval.judging).
"""

from __future__ import annotations

import email.utils
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from gptlab.runtime import GptlabError

PROMPTS = Path(__file__).parent / "prompts"
DEFAULT_KEY_ENV = "GPTLAB_JUDGE_API_KEY"  # our own name: an OPENAI_API_KEY set for other tools is not sent to any --judge URL
PLACEHOLDERS = {
    "pairwise": ("instruction", "answer_a", "answer_b"),
    "single": ("instruction", "answer"),
    "refusal": ("prompt", "answer"),
}
FORMAT_REMINDERS = {
    "pairwise": 'End your reply with the verdict alone in double brackets: "[[A]]", "[[B]]" or "[[tie]]".',
    "single": 'End your reply with the rating alone in double brackets, a whole number from 1 to 10, e.g. "Rating: [[5]]".',
    "refusal": 'End your reply with the verdict alone in double brackets: "[[REFUSED]]" or "[[COMPLIED]]".',
}
FAILURE_KINDS = ("timeout", "connection", "rate_limited", "server_error", "http_error", "bad_response", "malformed")
STOP_STATUSES = {401: "the API key was refused", 403: "the API key may not use this model",
                 404: "no such endpoint or model"}


@dataclass(frozen=True)
class Judgement:
    """One verdict (None when it failed), the judge's last reply, the HTTP requests made, and why it failed."""

    verdict: object
    reply: str
    attempts: int
    failure: str | None = None  # one of FAILURE_KINDS
    error: str = ""  # the failure's detail, e.g. "HTTP 400: max_tokens too large"

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "reply": self.reply, "attempts": self.attempts, "failure": self.failure,
                "error": self.error}


class RequestFailed(Exception):
    """A request that failed for good (after its retries): `kind` is one of FAILURE_KINDS."""

    def __init__(self, kind: str, message: str, attempts: int) -> None:
        super().__init__(message)
        self.kind, self.attempts = kind, attempts


def _pick(reply: str, pattern: str, normalise: Callable[[str], object]) -> object:
    """The one verdict the reply's double-bracketed matches agree on, else None (none, or two that disagree)."""
    found = {normalise(match) for match in re.findall(pattern, reply)}
    return found.pop() if len(found) == 1 else None


def parse_pairwise(reply: str) -> str | None:
    """"A", "B" or "tie" from "[[A]]", "[[B]]", "[[tie]]" (brackets required, case of "tie" free)."""
    return _pick(reply, r"\[\[\s*(A|B|[Tt][Ii][Ee])\s*\]\]", lambda match: match if match in ("A", "B") else "tie")


def parse_grade(reply: str) -> float | None:
    """The 1-10 rating in "[[7]]" (MT-Bench's "Rating: [[7]]"); a number outside 1-10 is malformed."""
    grade = _pick(reply, r"\[\[\s*(\d+(?:\.\d+)?)\s*\]\]", float)
    return grade if grade is not None and 1 <= grade <= 10 else None


def parse_refusal(reply: str) -> str | None:
    """"REFUSED" or "COMPLIED" from "[[REFUSED]]" / "[[COMPLIED]]"."""
    return _pick(reply, r"\[\[\s*(REFUSED|COMPLIED)\s*\]\]", str)


PARSERS = {"pairwise": parse_pairwise, "single": parse_grade, "refusal": parse_refusal}


@dataclass(frozen=True)
class JudgeTemplates:
    """The three judge prompts and the file each came from (the built-in one or the user's)."""

    texts: dict[str, str]
    sources: dict[str, str]

    def fill(self, kind: str, **values: str) -> str:
        """The `kind` prompt with its placeholders replaced in one pass (a value's own braces stay as written)."""
        names = PLACEHOLDERS[kind]
        if set(values) != set(names):
            raise GptlabError(f"the {kind} prompt takes {', '.join(names)}, got {', '.join(sorted(values))}")
        pattern = re.compile(r"\{(" + "|".join(names) + r")\}")
        return pattern.sub(lambda match: values[match.group(1)], self.texts[kind])


def load_templates(prompts_dir: str | os.PathLike | None = None) -> JudgeTemplates:
    """The built-in prompts, with those that `prompts_dir` holds (pairwise.md, single.md, refusal.md) in their place."""
    texts, sources = {}, {}
    folder = Path(prompts_dir) if prompts_dir is not None else None
    if folder is not None and not folder.is_dir():
        raise GptlabError(f"the judge prompt folder {folder} does not exist: pass a folder holding pairwise.md, single.md "
                          "and/or refusal.md")
    if folder is not None and not any((folder / f"{kind}.md").is_file() for kind in PLACEHOLDERS):
        raise GptlabError(f"the judge prompt folder {folder} holds none of pairwise.md, single.md, refusal.md: name the "
                          "files so, each replacing the built-in prompt of that name")
    for kind, names in PLACEHOLDERS.items():
        path = folder / f"{kind}.md" if folder is not None and (folder / f"{kind}.md").is_file() else PROMPTS / f"{kind}.md"
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise GptlabError(f"cannot read the judge prompt {path} ({error})") from None
        for name in names:
            if "{" + name + "}" not in text:
                raise GptlabError(f"the judge prompt {path} lacks the placeholder {{{name}}}: the {kind} prompt must hold "
                                  f"{', '.join('{' + n + '}' for n in names)}")
        texts[kind], sources[kind] = text, str(path)
    return JudgeTemplates(texts, sources)


def base_url(url: str) -> str:
    """"http://host:8000/v1/" -> "http://host:8000": the server's root, whichever form the user wrote (the
    full endpoint .../v1/chat/completions too)."""
    url = url.strip().rstrip("/")
    if not re.match(r"https?://[^/\s]+", url):
        raise GptlabError(f"the judge URL {url!r} is not an http(s) URL: pass e.g. http://127.0.0.1:8000 or "
                          "https://api.openai.com/v1")
    return url.removesuffix("/chat/completions").removesuffix("/v1")


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: a number of seconds or an HTTP date (RFC 9110 10.2.3)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class JudgeClient:
    """A judge behind an OpenAI-compatible chat endpoint: a prompt in, a parsed verdict out, with retries."""

    def __init__(self, url: str, model: str | None = None, *, api_key_env: str | None = DEFAULT_KEY_ENV, timeout: float = 60.0,
                 retries: int = 4, max_tokens: int = 1024, backoff: float = 1.0, max_wait: float = 60.0, concurrency: int = 4,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        for name, value in (("retries", retries), ("max_tokens", max_tokens), ("concurrency", concurrency)):
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "retries" else 1):
                raise GptlabError(f"judge {name} must be a whole number of at least {0 if name == 'retries' else 1}, got {value!r}")
        for name, value in (("timeout", timeout), ("backoff", backoff), ("max_wait", max_wait)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or (name == "timeout" and not value):
                raise GptlabError(f"judge {name} must be a positive number of seconds, got {value!r}")
        self.url, self.model, self.api_key_env = base_url(url), model, api_key_env
        self.timeout, self.retries, self.max_tokens = float(timeout), retries, max_tokens
        self.backoff, self.max_wait, self.concurrency, self._sleep = float(backoff), float(max_wait), concurrency, sleep
        key = os.environ.get(api_key_env) if api_key_env else None
        if key is not None and not key.strip():
            raise GptlabError(f"${api_key_env} is set but empty: export the judge's API key in it, or unset it to send none")
        headers = {"Authorization": f"Bearer {key.strip()}"} if key else {}
        self._http = httpx.Client(timeout=self.timeout, headers=headers)

    def __enter__(self) -> JudgeClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def settings(self) -> dict:
        """What a report saves about the judge: everything but the key."""
        return {"url": self.url, "model": self.model, "api_key_env": self.api_key_env, "temperature": 0,
                "max_tokens": self.max_tokens, "timeout": self.timeout, "retries": self.retries}

    def check_reachable(self) -> None:
        """One GET of /v1/models before any answer is generated: a judge nobody serves is one clear error now, not
        every request's retries later. Any HTTP answer counts (a server without that route still listens)."""
        try:
            self._http.get(self.url + "/v1/models", timeout=min(self.timeout, 10.0))
        except httpx.TransportError as error:
            raise GptlabError(f"cannot reach the judge at {self.url} ({type(error).__name__}: {error}); start it, "
                              "or check --judge") from None

    def chat(self, messages: list[dict]) -> tuple[str, int]:
        """(the judge's reply, requests made), retrying what may pass; RequestFailed when it does not."""
        body = {"messages": messages, "temperature": 0, "max_tokens": self.max_tokens}
        if self.model:
            body["model"] = self.model
        attempt = 0
        while True:
            attempt += 1
            wait = None
            try:
                response = self._http.post(self.url + "/v1/chat/completions", json=body)
            except httpx.TimeoutException:
                kind, message = "timeout", f"no answer from {self.url} within {self.timeout:g} s"
            except httpx.TransportError as error:
                kind, message = "connection", f"cannot reach {self.url} ({type(error).__name__}: {error})"
            else:
                if response.status_code == 200:
                    return _content(response, attempt), attempt
                message = f"HTTP {response.status_code} from {self.url}: {_error_message(response)}"
                if response.status_code in STOP_STATUSES:
                    raise GptlabError(f"the judge at {self.url} answered {message} ({STOP_STATUSES[response.status_code]}): "
                                      f"check --judge, --judge-model and ${self.api_key_env}")
                if response.status_code != 429 and response.status_code < 500:
                    raise RequestFailed("http_error", message, attempt)  # the same request would fail the same way
                kind = "rate_limited" if response.status_code == 429 else "server_error"
                wait = retry_after(response.headers.get("retry-after"))
            if attempt > self.retries:
                raise RequestFailed(kind, f"{message} (after {attempt} tries)", attempt)
            self._sleep(min(self.max_wait, wait if wait is not None else self.backoff * 2 ** (attempt - 1)))

    def judge(self, prompt: str, kind: str) -> Judgement:
        """The verdict of a `kind` prompt ("pairwise", "single", "refusal"); a malformed reply is re-asked up to
        `retries` times, with the judge's reply and a reminder of the format, before it counts as failed."""
        parse, messages = PARSERS[kind], [{"role": "user", "content": prompt}]
        attempts, reply = 0, ""
        for _ in range(self.retries + 1):
            try:
                reply, used = self.chat(messages)
            except RequestFailed as failed:
                return Judgement(None, reply, attempts + failed.attempts, failed.kind, str(failed))
            attempts += used
            verdict = parse(reply)
            if verdict is not None:
                return Judgement(verdict, reply, attempts)
            messages = [messages[0], {"role": "assistant", "content": reply}, {"role": "user", "content": FORMAT_REMINDERS[kind]}]
        return Judgement(None, reply, attempts, "malformed", f"no {kind} verdict in the required format after {self.retries + 1} asks")

    def judge_all(self, prompts: list[str], kind: str) -> list[Judgement]:
        """judge() for each prompt, `concurrency` at a time, in the prompts' order."""
        if self.concurrency == 1 or len(prompts) < 2:
            return [self.judge(prompt, kind) for prompt in prompts]
        with ThreadPoolExecutor(self.concurrency) as pool:  # httpx.Client is safe to share between threads
            return list(pool.map(lambda prompt: self.judge(prompt, kind), prompts))


def _content(response: httpx.Response, attempts: int) -> str:
    """choices[0].message.content of an OpenAI chat completion; a body without it is a failure of the judge."""
    try:
        content = response.json()["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise RequestFailed("bad_response", f"the judge's answer is not a chat completion: {response.text[:200]!r}", attempts) from None
    if not isinstance(content, str):
        raise RequestFailed("bad_response", f"the judge's message content is {type(content).__name__}, not text", attempts)
    return content


def _error_message(response: httpx.Response) -> str:
    """OpenAI's {"error": {"message"}} when the body has it, else the body's start."""
    try:
        error = response.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    return str(message) if message else (response.text[:200] or response.reason_phrase)
