"""The request bodies of the OpenAI-compatible API, as pydantic models: what is accepted, typed and bounded.

    POST /v1/chat/completions  {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 32, "stream": true}
    POST /v1/completions       {"prompt": "Once upon", "temperature": 0, "stop": ["\\n"]}

Types are strict (a string is not a number, a number is not a bool). Chat requests take OpenAI's `tools`,
`tool_choice` and `parallel_tool_calls`, and messages with `tool_calls` and `tool_call_id` (what they mean:
gptlab.serve.tool_requests). Fields OpenAI defines that gptlab does not implement (logprobs, penalties, ...) are
ignored when left at their neutral values and refused otherwise; unknown fields
are ignored, as OpenAI's own server does. `top_k`, `ignore_eos` and chat's `best_of` are extensions
(as in vLLM and llama.cpp). Not here: running requests (gptlab.serve.app).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_CHOICES = 8  # n
MAX_BEST_OF = 16  # best_of: candidates sampled per prompt, each holding an engine slot while it runs
MAX_STOPS = 4  # stop strings per request, as OpenAI
MAX_TOOLS = 128  # tools per request, as OpenAI


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(Strict):
    type: Literal["text"]
    text: str


class FunctionCall(Strict):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCall(Strict):
    """A call an assistant message made, as a reply's `tool_calls` holds it and the client sends it back."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(Strict):
    role: str
    content: str | list[TextPart] | None = None  # None: an assistant message that only calls tools
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool message: the call it answers

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)

    def as_dict(self) -> dict:
        """The message as gptlab.chat.messages checks it: role and content, and the tool fields when present."""
        message: dict = {"role": self.role, "content": None if self.content is None else self.text()}
        if self.tool_calls is not None:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class FunctionSpec(Strict):
    name: str
    description: str | None = None
    parameters: dict | None = None  # a JSON schema object; its properties' names go in the prompt
    strict: bool | None = None  # accepted; the arguments are never forced to the schema


class FunctionTool(Strict):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice | None


class StreamOptions(Strict):
    include_usage: bool = False


StopStrings = str | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOPS)] | None


class Sampling(Strict):
    """Fields both endpoints share."""

    model: str | None = None  # informational: the server serves one model
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: Annotated[int, Field(ge=1)] | None = None  # extension: the k most likely tokens only
    ignore_eos: bool = False  # extension (as vLLM): do not stop at the stop tokens; for benchmarks
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    stop: StopStrings = None
    seed: int | None = None  # choice i is seeded with seed + i
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] = 1
    best_of: Annotated[int, Field(ge=1, le=MAX_BEST_OF)] | None = None  # candidates per prompt, the n best by the server's
    # reward returned (OpenAI's legacy completions field; an extension for chat); None: the server's --best-of
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: Annotated[float, Field(ge=0, le=0)] | None = None  # not implemented: only 0 accepted
    presence_penalty: Annotated[float, Field(ge=0, le=0)] | None = None
    logprobs: Literal[False] | None = None
    user: str | None = None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return [stop for stop in stops if stop]

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatRequest(Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None  # OpenAI's newer name for max_tokens
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None  # functions the client runs
    tool_choice: ToolChoice = None  # None: "auto"
    parallel_tool_calls: bool | None = None  # accepted: a turn may hold several calls either way

    @model_validator(mode="after")
    def _one_limit(self) -> ChatRequest:
        if self.max_completion_tokens is not None:
            if self.max_tokens is not None and self.max_tokens != self.max_completion_tokens:
                raise ValueError("give max_tokens or max_completion_tokens, not two different values")
            self.max_tokens = self.max_completion_tokens
        return self


Prompt = str | Annotated[list[str], Field(min_length=1)] | Annotated[list[int], Field(min_length=1)] | Annotated[
    list[Annotated[list[int], Field(min_length=1)]], Field(min_length=1)
]


class CompletionRequest(Sampling):
    prompt: Prompt
    echo: Literal[False] | None = None
    suffix: None = None

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: text, or token ids."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if all(isinstance(item, int) for item in self.prompt):
            return [list(self.prompt)]
        return list(self.prompt)
