"""Streaming ids to text: whole characters only, as tokens arrive.

A byte-level BPE token may end inside a UTF-8 character ("é" can be two tokens), so
decoding each token on its own would print replacement characters. `TextStream`
keeps the unfinished bytes until the character completes:

    stream = TextStream(tokenizer)
    for token in tokens:
        print(stream.add(token), end="")   # "" while a character is incomplete
    print(stream.flush())                  # any bytes left over, replaced if invalid

Not here: generation (gptlab.infer), stop strings (gptlab.serve).
"""

from __future__ import annotations

import codecs

from gptlab.tokenizer import Tokenizer


class TextStream:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.specials = set(tokenizer.special_tokens.values())
        self.started = False  # has a token other than a special one been read (the text's start is behind us)?

    def add(self, token: int) -> str:
        """The text that token completes (possibly empty).

        The first bytes come from `decode_bytes`, the rest from `token_bytes`: a SentencePiece
        tokenizer drops the dummy prefix's space at the start of a text only, as `decode` does.
        Special tokens always from `decode_bytes`: SentencePiece's control pieces decode to nothing.
        """
        later = self.started and token not in self.specials
        data = self.tokenizer.token_bytes(token) if later else self.tokenizer.decode_bytes([token])
        self.started = self.started or token not in self.specials
        return self.decoder.decode(data)

    def flush(self) -> str:
        """Whatever is left: an incomplete character at the end becomes U+FFFD."""
        return self.decoder.decode(b"", final=True)


class ReplyView:
    """The text of a reply with tool calls as a reader sees it: the assistant's words, not its calls (`<|call|>` up to
    `<|end|>`) nor what the tools fed back (up to the next `<|assistant|>`), which are shown apart."""

    def __init__(self, chat_format) -> None:
        self.chat = chat_format
        self.text = TextStream(chat_format.tokenizer)
        self.showing = True

    def add(self, token: int) -> str:
        if token in (self.chat.call, self.chat.end):
            self.showing = False
            return ""
        if token == self.chat.role_ids["assistant"]:
            self.showing = True
            return ""
        return self.text.add(token) if self.showing else ""

    def flush(self) -> str:
        return self.text.flush()
