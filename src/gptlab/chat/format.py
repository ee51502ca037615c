"""The chat format: role tokens around each message, tool calls and their results, and rendering a conversation into
ids and a loss mask.

    <|endoftext|><|system|>Be brief.<|end|><|user|>2+2?<|end|><|assistant|>4<|end|>

Every conversation starts with the tokenizer's end-of-text token (the same
document boundary pretraining saw), then each message is its role's token, its
content encoded as ordinary text (special-token text inside a message stays
text), and `<|end|>`. Only the assistant's content and its `<|end|>` are
training targets; a prompt for generation ends with `<|assistant|>` and the
model answers until it emits `<|end|>`.

Tools. A conversation that offers tools opens with a tools block, one line per tool, its name and its parameters;
an assistant's tool call is `<|call|>`, the function's name, a space and its arguments as JSON, inside its turn;
each result is a `<|tool|>` message; the assistant then goes on in a new turn:

    <|endoftext|><|tools|>calculator(expression)<|end|><|user|>What is 1234 * 5678?<|end|>
    <|assistant|><|call|>calculator {"expression": "1234 * 5678"}<|end|><|tool|>7006652<|end|>
    <|assistant|>1234 * 5678 = 7006652<|end|>

The model's calls are training targets (`<|call|>`, the call's text, the `<|end|>` after it); the tools block and
the tools' results never are: a model learns to ask, not to imitate a calculator. A turn that ends with calls is
where generation hands over to the tools (gptlab.tools runs them and feeds `<|tool|>...<|end|><|assistant|>` back).
The tools block is short on purpose (names and parameter names, no descriptions): the models are small and their
context is a few hundred tokens; what a tool does they learn from the calls in their training data.

The same format is written as a Jinja chat template for Hugging Face (`chat_template()`), so
`AutoTokenizer.apply_chat_template(messages, tools=...)` gives the same ids.

Not here: checking messages (gptlab.chat.messages), reading conversation files (gptlab.chat.data), batching for
SFT (gptlab.chat.loader), growing a model's embedding rows (gptlab.model.resize), running tools (gptlab.tools).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gptlab.chat.messages import Message, call_function, check_messages, check_tools
from gptlab.runtime import GptlabError
from gptlab.tokenizer import Tokenizer

ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>", "tool": "<|tool|>"}
END = "<|end|>"  # closes every message; the assistant's stop token
CHAT_TOKENS = (*ROLE_TOKENS.values(), END)  # what every chat model has
TOOLS, CALL = "<|tools|>", "<|call|>"  # the tools block's opening; a tool call's opening inside an assistant turn
TOOL_TOKENS = (TOOLS, CALL)  # added by add_chat_tokens since tool use; a chat model made before lacks them


class Conversation(list):
    """A conversation's messages (a list), and the tools it offers the assistant (OpenAI's fine-tuning shape:
    {"messages": [...], "tools": [{"type": "function", "function": {...}}]}); `tools` is () when none are offered."""

    def __init__(self, messages: Sequence[Message] = (), tools: Sequence[Mapping] = ()) -> None:
        super().__init__(messages)
        self.tools = tuple(tools)

    def __repr__(self) -> str:
        return f"Conversation({list(self)!r}, tools={list(self.tools)!r})" if self.tools else f"Conversation({list(self)!r})"


@dataclass(frozen=True)
class Rendered:
    """A conversation as ids, with mask[i] = 1 where ids[i] is a training target (assistant content and its <|end|>)."""

    ids: list[int]
    mask: list[int]


def add_chat_tokens(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer with the chat and tool tokens added as special tokens at the next free ids (itself if it has them).

    Existing ids never move, so a model trained on `tokenizer` keeps its meaning; the new rows
    are grown with `gptlab.model.resize.grow_vocab`.
    """
    if tokenizer.eot_id is None:
        raise GptlabError("the tokenizer has no end-of-text token (<|endoftext|>), which starts every conversation")
    missing = [token for token in (*CHAT_TOKENS, *TOOL_TOKENS) if token not in tokenizer.special_tokens]
    if not missing:
        return tokenizer
    return tokenizer.with_special_tokens(missing)


class ChatFormat:
    """Renders conversations with a tokenizer that holds the chat tokens (see `add_chat_tokens`)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        missing = [token for token in CHAT_TOKENS if token not in tokenizer.special_tokens]
        if missing or tokenizer.eot_id is None:
            raise GptlabError(
                f"the tokenizer lacks the chat tokens {', '.join(missing) or '<|endoftext|>'}: "
                "fine-tune with `gptlab sft`, which adds them, or call gptlab.chat.add_chat_tokens"
            )
        self.tokenizer = tokenizer
        self.bos = tokenizer.eot_id
        self.role_ids = {role: tokenizer.special_tokens[token] for role, token in ROLE_TOKENS.items()}
        self.end = tokenizer.special_tokens[END]
        self.tools_id = tokenizer.special_tokens.get(TOOLS)
        self.call = tokenizer.special_tokens.get(CALL)  # None: a chat model made before tool use

    @property
    def stop_tokens(self) -> tuple[int, ...]:
        """Ids that end an assistant turn: <|end|>, and end-of-text for safety."""
        return (self.end, self.bos)

    @property
    def supports_tools(self) -> bool:
        return self.call is not None and self.tools_id is not None

    def render(self, messages: Sequence[Message], *, tools: Sequence[Mapping] | None = None,
               for_generation: bool = False) -> Rendered:
        """A conversation as ids and a loss mask; `for_generation` appends the assistant's opening. `tools` (the
        OpenAI shape) defaults to a Conversation's own.

        With a tokenizer where "2+2?" is [17, 11, 17, 30] and "4" is [19] (ids made up), and the
        chat tokens eot=0, <|system|>=512, <|user|>=513, <|assistant|>=514, <|end|>=516:

            render([{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}])
            ids  [0, 513, 17, 11, 17, 30, 516, 514, 19, 516]
            mask [0,   0,  0,  0,  0,  0,   0,   0,  1,   1]

            render([{"role": "user", "content": "2+2?"}], for_generation=True).ids
                 [0, 513, 17, 11, 17, 30, 516, 514]

        Messages are checked first (gptlab.chat.messages.check_messages): a bad one raises.
        """
        check_messages(messages, for_generation=for_generation)
        tools = getattr(messages, "tools", ()) if tools is None else tools
        ids, mask = [self.bos], [0]
        if tools:
            block = self._tool_ids("a conversation that offers tools", TOOLS) + self.encode(tools_text(tools)) + [self.end]
            ids += block
            mask += [0] * len(block)
        for message in messages:
            piece, target = self._message(message)
            ids += piece
            mask += [0, *[target] * (len(piece) - 1)]  # a role token is never a target
        if for_generation:
            ids.append(self.role_ids["assistant"])
            mask.append(0)
        return Rendered(ids, mask)

    def _message(self, message: Message) -> tuple[list[int], int]:
        """One message's ids (role token first, <|end|> last) and whether they are targets."""
        role = message["role"]
        ids = [self.role_ids[role], *self.encode(message.get("content") or "")]
        for call in message.get("tool_calls") or ():
            ids += self._tool_ids("a tool call", CALL) + self.encode(call_text(call))
        if role == "tool":
            self._tool_ids("a tool result", CALL)
        return [*ids, self.end], int(role == "assistant")

    def _tool_ids(self, what: str, token: str) -> list[int]:
        if not self.supports_tools:
            raise GptlabError(f"{what} needs the tool tokens {', '.join(TOOL_TOKENS)}, which this tokenizer lacks "
                              "(a chat model made before tool use): fine-tune it again with `gptlab sft`, which adds them")
        return [self.tokenizer.special_tokens[token]]

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode_ordinary(text)

    def prompt(self, messages: Sequence[Message], *, tools: Sequence[Mapping] | None = None) -> list[int]:
        """Ids to generate the assistant's next message from."""
        return self.render(messages, tools=tools, for_generation=True).ids

    def result_ids(self, results: Sequence[str]) -> list[int]:
        """What follows a turn that made calls: each result as a tool message, then the assistant's next opening."""
        ids = []
        for text in results:
            ids += [self.role_ids["tool"], *self.encode(text), self.end]
        return [*ids, self.role_ids["assistant"]]


    def parse_reply(self, ids: Sequence[int]) -> list[dict]:
        """The messages a generated reply holds: the ids after the prompt's <|assistant|> (the final stop token left
        out, as the engine leaves it), split at the format's tokens into assistant messages with their `tool_calls`
        (name and arguments as written; no ids) and the tool results fed between them.

            ids of '<|call|>calculator {"expression": "2*3"}<|end|><|tool|>6<|end|><|assistant|>2*3 = 6'
            -> [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function":
                    {"name": "calculator", "arguments": "{\"expression\": \"2*3\"}"}}]},
                {"role": "tool", "content": "6"}, {"role": "assistant", "content": "2*3 = 6"}]
        """
        messages: list[dict] = []
        role, pieces = "assistant", [[]]  # pieces[0]: the content; each later one a call's text
        roles = {token: name for name, token in self.role_ids.items()}
        for token in [*ids, self.end]:
            if token == self.end:
                if role is not None:
                    messages.append(self._parsed(role, pieces))
                role, pieces = None, [[]]
            elif role is None and token in roles:
                role = roles[token]
            elif token == self.call and role == "assistant":
                pieces.append([])
            elif role is not None:
                pieces[-1].append(token)
        return messages

    def _parsed(self, role: str, pieces: list[list[int]]) -> dict:
        message: dict = {"role": role, "content": self.tokenizer.decode(pieces[0])}
        calls = []
        for piece in pieces[1:]:
            name, _, arguments = self.tokenizer.decode(piece).strip().partition(" ")
            calls.append({"type": "function", "function": {"name": name, "arguments": arguments.strip() or "{}"}})
        if calls:
            message["tool_calls"] = calls
        return message

    def generated_mask(self, ids: Sequence[int]) -> list[int]:
        """1 where a reply's token was the model's own, 0 where the tools' loop fed it: each <|tool|> message and the
        <|assistant|> after it (what reinforcement learning must not train on, as the model did not choose it)."""
        mask, fed = [], False
        tool, assistant = self.role_ids["tool"], self.role_ids["assistant"]
        for n, token in enumerate(ids):
            fed = fed or (token == tool and n > 0 and ids[n - 1] == self.end)
            mask.append(0 if fed else 1)
            fed = fed and token != assistant  # the assistant's opening after the results is the last token fed
        return mask


def tools_text(tools: Sequence[Mapping]) -> str:
    """The tools block: one line per tool, `name(parameter, parameter)`: "calculator(expression)\npython(code)"."""
    lines = []
    for function in check_tools(tools):
        parameters = function.get("parameters") or {}
        lines.append(f"{function['name']}({', '.join(parameters.get('properties') or {})})")
    return "\n".join(lines)


def call_text(call: Mapping) -> str:
    """A tool call as rendered after <|call|>: the name, a space, the arguments as JSON text (kept as written)."""
    function = call_function(call)
    arguments = function.get("arguments", {})
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return f"{function['name']} {arguments}"


def chat_template(start: str | None = None) -> str:
    """A Jinja template for transformers' `apply_chat_template` that renders exactly as ChatFormat.render, `tools=`
    included.

    It opens with the end-of-text token: `start`, its text, where the folder's eos_token is the end of a turn
    (a Hugging Face export); else the eos_token (<|endoftext|>, or a SentencePiece model's </s>, whose bos_token
    <s> differs), as a GGUF file's tokenizer has it."""
    opening = "{{ eos_token }}" if start is None else "{{ " + json.dumps(start) + " }}"
    return opening + (
        "{% if tools %}{{ '" + TOOLS + "' }}{% for tool in tools %}"
        "{% set function = tool.function if tool.function is defined else tool %}"
        "{% if not loop.first %}{{ '\\n' }}{% endif %}{{ function.name + '(' }}"
        "{% if function.parameters is defined and function.parameters.properties is defined %}"
        "{{ function.parameters.properties | list | join(', ') }}{% endif %}{{ ')' }}"
        "{% endfor %}{{ '" + END + "' }}{% endif %}"
        "{% for message in messages %}"
        "{{ '<|' + message['role'] + '|>' }}{% if message['content'] %}{{ message['content'] }}{% endif %}"
        "{% if message['tool_calls'] is defined and message['tool_calls'] %}{% for call in message['tool_calls'] %}"
        "{% set function = call.function if call.function is defined else call %}"
        "{{ '" + CALL + "' + function.name + ' ' }}"
        "{% if function.arguments is not defined %}{{ '{}' }}"
        "{% elif function.arguments is string %}{{ function.arguments }}{% else %}{{ function.arguments | tojson }}{% endif %}"
        "{% endfor %}{% endif %}{{ '" + END + "' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '" + ROLE_TOKENS["assistant"] + "' }}{% endif %}"
    )
