"""Byte-level BPE tokenizer: training, encoding, decoding, and interop with tiktoken and Hugging Face.

    >>> from gptlab.tokenizer import Tokenizer
    >>> tok = Tokenizer.train(["hello hello world"], vocab_size=260)
    >>> tok.decode(tok.encode("hello world"))
    'hello world'

No torch: usable without the later stages. A readable pure-Python reference (core.py, train.py)
and an optional compiled core (native.py, _native/) that gives the same ids and merges, faster.
"""

from gptlab.tokenizer.core import Tokenizer
from gptlab.tokenizer.patterns import GPT2_PATTERN, GPT4_PATTERN, O200K_PATTERN, PATTERNS, SplitRegex
from gptlab.tokenizer.pretrained import CL100K_SPECIAL_TOKENS
from gptlab.tokenizer.sentencepiece import SentencePieceTokenizer

__all__ = ["CL100K_SPECIAL_TOKENS", "GPT2_PATTERN", "GPT4_PATTERN", "O200K_PATTERN", "PATTERNS", "SentencePieceTokenizer", "SplitRegex", "Tokenizer"]
