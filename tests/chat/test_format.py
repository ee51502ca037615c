"""The chat format against references: transformers' apply_chat_template on the exported template, and a grown model's logits."""

import pytest
import torch

from gptlab.chat import CHAT_TOKENS, TOOL_TOKENS, ChatFormat, add_chat_tokens, chat_template
from gptlab.model import GPT, preset
from gptlab.model.resize import grow_vocab
from gptlab.runtime import GptlabError
from gptlab.tokenizer import Tokenizer

CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "12 + 30 = 42"},
    {"role": "user", "content": "And <|end|> doubled?"},
    {"role": "assistant", "content": "84, thou knave."},
]


@pytest.fixture(scope="module")
def chat_tokenizer(prepared):
    return add_chat_tokens(Tokenizer.load(prepared / "tokenizer"))


def test_add_chat_tokens_keeps_every_old_id(prepared, chat_tokenizer):
    base = Tokenizer.load(prepared / "tokenizer")
    text = "To be, or not to be: that is the question."
    assert chat_tokenizer.encode_ordinary(text) == base.encode_ordinary(text)
    added = (*CHAT_TOKENS, *TOOL_TOKENS)
    assert chat_tokenizer.vocab_size == base.vocab_size + len(added)
    assert sorted(chat_tokenizer.special_tokens[t] for t in added) == list(range(base.vocab_size, chat_tokenizer.vocab_size))
    assert add_chat_tokens(chat_tokenizer) is chat_tokenizer


def test_render_masks_only_assistant_content_and_its_end(chat_tokenizer):
    chat = ChatFormat(chat_tokenizer)
    rendered = chat.render(CONVERSATION)
    assert len(rendered.ids) == len(rendered.mask)
    targets = [i for i, m in zip(rendered.ids, rendered.mask) if m]
    expected = []
    for message in CONVERSATION:
        if message["role"] == "assistant":
            expected += chat_tokenizer.encode_ordinary(message["content"]) + [chat.end]
    assert targets == expected
    assert chat_tokenizer.decode(rendered.ids) == "<|endoftext|>" + "".join(
        f"<|{m['role']}|>{m['content']}<|end|>" for m in CONVERSATION)


def test_render_for_generation_ends_with_the_assistant_opening(chat_tokenizer):
    chat = ChatFormat(chat_tokenizer)
    ids = chat.prompt(CONVERSATION[:2])
    assert ids[-1] == chat.role_ids["assistant"]
    assert ids[:-1] == chat.render(CONVERSATION[:3]).ids[: len(ids) - 1]


@pytest.mark.parametrize("messages, message", [
    ([{"role": "robot", "content": "hi"}], "unknown role 'robot'"),
    ([{"role": "user", "content": "  "}, {"role": "assistant", "content": "x"}], "empty content"),
    ([{"role": "user", "content": "hi"}], "no assistant message"),
    ([{"role": "user", "content": 3}, {"role": "assistant", "content": "x"}], "must be text"),
    ([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}, {"role": "assistant", "content": "c"}], "only the first"),
    ("hello", "non-empty list"),
])
def test_render_refuses_malformed_conversations(chat_tokenizer, messages, message):
    with pytest.raises(GptlabError, match=message):
        ChatFormat(chat_tokenizer).render(messages)


def test_chat_format_needs_the_chat_tokens(prepared):
    with pytest.raises(GptlabError, match="lacks the chat tokens"):
        ChatFormat(Tokenizer.load(prepared / "tokenizer"))


def test_hf_chat_template_renders_gptlab_ids(chat_tokenizer, tmp_path):
    transformers = pytest.importorskip("transformers")
    chat_tokenizer.save_huggingface_dir(tmp_path, chat_template=chat_template())
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    chat = ChatFormat(chat_tokenizer)
    ours_full = chat.render(CONVERSATION[:3]).ids  # no special-token text inside content: HF would split it
    theirs = hf.apply_chat_template(CONVERSATION[:3], tokenize=True, return_dict=False)
    assert list(theirs) == ours_full
    prompt = hf.apply_chat_template(CONVERSATION[:2], tokenize=True, add_generation_prompt=True, return_dict=False)
    assert list(prompt) == chat.prompt(CONVERSATION[:2])


@pytest.mark.parametrize("arch", ["gpt2-tiny", "llama-tiny"])
def test_grow_vocab_keeps_old_logits_and_starts_new_rows_at_the_mean(arch):
    torch.manual_seed(0)
    model = GPT(preset(arch, vocab_size=512, pad_vocab_to=1)).eval()
    grown = grow_vocab(model, 517).eval()
    idx = torch.randint(0, 512, (2, 16))
    old, _ = model(idx)
    new, _ = grown(idx)
    torch.testing.assert_close(new[..., :512], old)
    wte = grown.transformer["wte"].weight
    torch.testing.assert_close(wte[512:517], model.transformer["wte"].weight.mean(0).expand(5, -1))
    with pytest.raises(GptlabError, match="cannot shrink"):
        grow_vocab(model, 500)
