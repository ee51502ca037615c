"""The reference reply the chat front ends (terminal, web page) must show: the Python API, greedy."""

from gptlab.chat import ChatFormat
from gptlab.infer.generate import SamplingConfig, generate
from gptlab.model.io import load_model
from gptlab.tokenizer import Tokenizer


def reference_reply(folder, messages, max_tokens: int) -> str:
    """The greedy reply to `messages` from the model in `folder`: ChatFormat.prompt, generate, decode."""
    model, tokenizer = load_model(folder), Tokenizer.load(folder / "tokenizer")
    chat_format = ChatFormat(tokenizer)
    config = SamplingConfig(max_new_tokens=max_tokens, temperature=0, stop_tokens=chat_format.stop_tokens,
                            vocab_size=tokenizer.vocab_size)
    return tokenizer.decode(generate(model, [chat_format.prompt(messages)], config)[0])
