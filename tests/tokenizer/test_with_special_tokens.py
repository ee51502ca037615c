"""Tokenizer.with_special_tokens: new special tokens at the next free ids, nothing else moves."""

from gptlab.tokenizer import Tokenizer


def test_new_special_tokens_take_the_next_ids_and_keep_every_other_id():
    tok = Tokenizer.train(["hello world, hello there"], vocab_size=270, special_tokens=["<|endoftext|>"])
    grown = tok.with_special_tokens(["<|user|>", "<|endoftext|>", "<|end|>", "<|user|>"])
    assert grown.special_tokens == {**tok.special_tokens, "<|user|>": tok.vocab_size, "<|end|>": tok.vocab_size + 1}
    assert grown.encode("hello world") == tok.encode("hello world")
    assert grown.encode("<|user|>hi<|end|>", allowed_special="all")[0] == tok.vocab_size
    assert tok.with_special_tokens(["<|endoftext|>"]) is tok


def test_a_normaliser_survives_growing():
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], ["<|endoftext|>"], normalizer="NFKC")
    grown = tok.with_special_tokens(["<|end|>"])
    assert grown.normalizer == "NFKC"
    assert grown.encode("ﬁ") == tok.encode("ﬁ") == list(b"fi")
