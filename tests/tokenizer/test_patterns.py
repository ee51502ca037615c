"""Split patterns: names are names (a typo is an error), regexes are regexes, stored regexes load as they were."""

import json

import pytest
import regex

from gptlab.runtime import GptlabError
from gptlab.tokenizer import SplitRegex, Tokenizer
from gptlab.tokenizer.patterns import compile_pattern, resolve_pattern, split

KNOWN = "gpt2, gpt4, cl100k, o200k, none"


def test_resolve_pattern_names_give_tiktokens_patterns(monkeypatch):
    import tiktoken_ext.openai_public

    monkeypatch.setattr(tiktoken_ext.openai_public, "load_tiktoken_bpe", lambda *args, **kwargs: {})
    assert resolve_pattern("gpt2") == tiktoken_ext.openai_public.r50k_pat_str
    assert resolve_pattern("gpt4") == resolve_pattern("cl100k") == tiktoken_ext.openai_public.cl100k_base()["pat_str"]
    assert resolve_pattern("o200k") == tiktoken_ext.openai_public.o200k_base()["pat_str"]
    assert resolve_pattern("none") is None and resolve_pattern(None) is None


@pytest.mark.parametrize("name", ["gpt9", "GPT2", "cl100k_base", "o200k-base", "r50k"])
def test_resolve_pattern_unknown_name_is_an_error_listing_the_names(name):
    with pytest.raises(GptlabError, match=rf"unknown split pattern '{name}'.*{KNOWN}.*SplitRegex.*--regex"):
        resolve_pattern(name)
    with pytest.raises(GptlabError, match="unknown split pattern"):
        Tokenizer.train(["some text"], vocab_size=260, pattern=name)


@pytest.mark.parametrize("bad", ["(", "[a-", "a{2,1}", ""])
def test_resolve_pattern_bad_regex_is_one_clear_error(bad):
    with pytest.raises(GptlabError, match="does not compile|is empty"):
        resolve_pattern(bad)


@pytest.mark.parametrize("text_regex", [r"\w+|\s+|[^\w\s]+", r"\p{L}+|\P{L}", r" ?[a-z]+|[\s\S]"])
def test_resolve_pattern_keeps_regexes_and_splits_like_regex_findall(text_regex):
    text = "Hello, wörld!! 42 times\n\tend"
    compiled = compile_pattern(text_regex)
    assert resolve_pattern(text_regex) == text_regex
    assert split(text, compiled) == regex.findall(text_regex, text)


def test_split_regex_takes_a_name_like_string_as_a_regex():
    """SplitRegex("ab") splits on the literal text "ab"; what it skips stays as pieces of its own."""
    assert resolve_pattern(SplitRegex("ab")) == "ab"
    assert split("xxabyyab", compile_pattern(SplitRegex("ab"))) == ["xx", "ab", "yy", "ab"]
    tokenizer = Tokenizer.train(["xxabyyab" * 20], vocab_size=262, pattern=SplitRegex("ab"), special_tokens=[])
    assert tokenizer.pattern == "ab"
    assert all(b"ab" not in token or token == b"ab" for token in tokenizer.vocab.values())  # no merge crosses a piece


def test_tokenizer_file_with_a_name_like_regex_still_loads(tmp_path):
    """Before pattern names were checked, `--pattern gpt9` trained with the regex "gpt9"; such files still load."""
    tokenizer = Tokenizer.train(["one gpt9 two gpt9 three"] * 5, vocab_size=270, pattern=SplitRegex("gpt9"))
    path = tokenizer.save(tmp_path)
    assert json.loads(path.read_text(encoding="utf-8"))["pattern"] == "gpt9"
    loaded = Tokenizer.load(tmp_path)
    assert loaded.pattern == "gpt9" and loaded.fingerprint() == tokenizer.fingerprint()
    assert loaded.encode("x gpt9 y") == tokenizer.encode("x gpt9 y")
