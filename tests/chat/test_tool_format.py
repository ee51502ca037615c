"""Tool calls in the chat format, against references: transformers' apply_chat_template(tools=) on the exported
template, the masks worked out by hand, and parsing a reply back into the OpenAI messages it came from."""

import json

import pytest

from gptlab.chat import ChatFormat, Conversation, add_chat_tokens, chat_template
from gptlab.chat.format import CHAT_TOKENS
from gptlab.chat.tool_specs import CALCULATOR, PYTHON
from gptlab.runtime import GptlabError
from gptlab.tokenizer import Tokenizer

CALL = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": json.dumps({"expression": "1234 * 5678"})}}
MESSAGES = [
    {"role": "system", "content": "Use the tools."},
    {"role": "user", "content": "What is 1234 * 5678?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "7006652"},
    {"role": "assistant", "content": "Let me check twice.", "tool_calls": [
        CALL, {"type": "function", "function": {"name": "python", "arguments": {"code": "print(1234 * 5678)"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "7006652"},
    {"role": "tool", "content": "7006652"},
    {"role": "assistant", "content": "1234 * 5678 = 7006652"},
]
TEXT = ('<|endoftext|><|tools|>calculator(expression)\npython(code)<|end|><|system|>Use the tools.<|end|>'
        '<|user|>What is 1234 * 5678?<|end|><|assistant|><|call|>calculator {"expression": "1234 * 5678"}<|end|>'
        '<|tool|>7006652<|end|><|assistant|>Let me check twice.<|call|>calculator {"expression": "1234 * 5678"}'
        '<|call|>python {"code": "print(1234 * 5678)"}<|end|><|tool|>7006652<|end|><|tool|>7006652<|end|>'
        '<|assistant|>1234 * 5678 = 7006652<|end|>')


@pytest.fixture(scope="module")
def chat(prepared):
    return ChatFormat(add_chat_tokens(Tokenizer.load(prepared / "tokenizer")))


def test_render_with_tools_writes_the_documented_text(chat):
    rendered = chat.render(Conversation(MESSAGES, tools=[CALCULATOR, PYTHON]))
    assert chat.tokenizer.decode(rendered.ids) == TEXT
    assert chat.render(MESSAGES, tools=[CALCULATOR, PYTHON]) == rendered


def test_render_masks_the_models_calls_and_never_the_tools_output(chat):
    rendered = chat.render(MESSAGES, tools=[CALCULATOR, PYTHON])
    targets = chat.tokenizer.decode([i for i, m in zip(rendered.ids, rendered.mask) if m])
    assert targets == ('<|call|>calculator {"expression": "1234 * 5678"}<|end|>Let me check twice.'
                       '<|call|>calculator {"expression": "1234 * 5678"}<|call|>python {"code": "print(1234 * 5678)"}<|end|>'
                       '1234 * 5678 = 7006652<|end|>')
    assert "7006652<|end|><|tool|>" not in targets  # the results, the tools block and every role token are not targets


def test_hf_chat_template_with_tools_renders_gptlab_ids(chat, tmp_path):
    transformers = pytest.importorskip("transformers")
    chat.tokenizer.save_huggingface_dir(tmp_path, chat_template=chat_template())
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for tools in ([CALCULATOR, PYTHON], [CALCULATOR], None):
        theirs = hf.apply_chat_template(MESSAGES, tools=tools, tokenize=True, return_dict=False)
        assert list(theirs) == chat.render(MESSAGES, tools=tools).ids
        prompt = hf.apply_chat_template(MESSAGES[:4], tools=tools, tokenize=True, add_generation_prompt=True, return_dict=False)
        assert list(prompt) == chat.prompt(MESSAGES[:4], tools=tools)


def test_parse_reply_gives_back_the_messages_of_a_rendered_reply(chat):
    ids = chat.render(MESSAGES).ids
    start = len(chat.prompt(MESSAGES[:2]))
    parsed = chat.parse_reply(ids[start:-1])  # the reply after <|assistant|>, its final <|end|> left out
    expected = []
    for message in MESSAGES[2:]:
        plain = {"role": message["role"], "content": message["content"]}
        if "tool_calls" in message:
            plain["tool_calls"] = [{"type": "function", "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]
                                    if isinstance(c["function"]["arguments"], str) else json.dumps(c["function"]["arguments"])}}
                                   for c in message["tool_calls"]]
        expected.append(plain)
    assert parsed == expected


def test_generated_mask_hides_only_what_the_tools_fed(chat):
    ids = chat.render(MESSAGES).ids
    start = len(chat.prompt(MESSAGES[:2]))
    reply = ids[start:]
    mask = chat.generated_mask(reply)
    kept = chat.tokenizer.decode([i for i, m in zip(reply, mask) if m])
    fed = chat.tokenizer.decode([i for i, m in zip(reply, mask) if not m])
    assert fed == "<|tool|>7006652<|end|><|assistant|>" + "<|tool|>7006652<|end|>" * 2 + "<|assistant|>"
    assert kept.endswith("1234 * 5678 = 7006652<|end|>") and "<|tool|>" not in kept


@pytest.mark.parametrize("messages, message", [
    ([{"role": "user", "content": "hi"}, {"role": "tool", "content": "3"}, {"role": "assistant", "content": "x"}], "no tool call before it"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [CALL]}], "have no results"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [CALL]},
      {"role": "user", "content": "and?"}, {"role": "assistant", "content": "x"}], "have no results"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "2x"}}]},
      {"role": "tool", "content": "3"}, {"role": "assistant", "content": "x"}], "function name '2x'"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": "calculator"}], "must be a list"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}], "empty content"),
])
def test_render_refuses_malformed_tool_messages(chat, messages, message):
    with pytest.raises(GptlabError, match=message):
        chat.render(messages)


@pytest.mark.parametrize("tools, message", [
    ([{"type": "function", "function": {"description": "no name"}}], "tool 0 is not"),
    ([CALCULATOR, CALCULATOR], "declared twice"),
    ("calculator", "must be a list"),
])
def test_render_refuses_malformed_tools(chat, tools, message):
    with pytest.raises(GptlabError, match=message):
        chat.render(MESSAGES[1:4] + MESSAGES[-1:], tools=tools)


def test_a_chat_model_without_the_tool_tokens_renders_plain_chats_and_refuses_tools(prepared):
    tokenizer = Tokenizer.load(prepared / "tokenizer").with_special_tokens(list(CHAT_TOKENS))  # a chat model made before tools
    chat = ChatFormat(tokenizer)
    assert not chat.supports_tools
    chat.render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    with pytest.raises(GptlabError, match="lacks the tool tokens|needs the tool tokens"):
        chat.render(MESSAGES)
    with pytest.raises(GptlabError, match="needs the tool tokens"):
        chat.prompt(MESSAGES[1:2], tools=[CALCULATOR])
