"""The compiled merge learner (_fasttrain.learn_merges) against the pure-Python reference train.learn_merges.

Same merges in the same order for every input: real word counts under each split pattern, hypothesis dicts
over tiny alphabets (ties everywhere, overlapping runs like b"aaaa"), counts of 0 and near 2**63, long words.
"""

import threading
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gptlab.tokenizer import _fasttrain
from gptlab.tokenizer.patterns import resolve_pattern
from gptlab.tokenizer.train import count_words, learn_merges

EOT = "<|endoftext|>"
PROPERTY = settings(max_examples=300, deadline=None)


def words_of(documents, pattern):
    return count_words(texts=documents, pattern=resolve_pattern(pattern), special_tokens=[EOT], workers=1)


def assert_same(word_counts, n_merges):
    expected = learn_merges(word_counts, n_merges)
    assert _fasttrain.learn_merges(word_counts, n_merges) == expected
    return expected


# ------------------------------------------------------------------ real text


@pytest.mark.parametrize("pattern", ["gpt4", "gpt2"])
def test_shakespeare_words(shakespeare_documents, pattern):
    documents = [document[:30_000] for document in shakespeare_documents[:10]]  # ~300 KB, ten works
    merges = assert_same(words_of(documents, pattern), 2000)
    assert len(merges) == 2000


def test_shakespeare_whole_documents_as_words(shakespeare_documents):
    """No pre-split: each document is one long word (the reference's long-word path, >= 256 bytes)."""
    documents = [document[:2_500] for document in shakespeare_documents[:6]]
    word_counts = words_of(documents, None)
    assert max(map(len, word_counts)) > 2_000
    assert_same(word_counts, 300)


def test_runs_past_the_last_pair(shakespeare_documents):
    word_counts = words_of([shakespeare_documents[0][:3_000]], "gpt4")
    merges = assert_same(word_counts, 10**6)
    assert len(merges) < 3_000  # stopped early: every word became a single token


# ------------------------------------------------------------------ generated


def word_dicts(alphabet, max_length=8, max_count=3):
    words = st.lists(st.sampled_from(alphabet), max_size=max_length).map(bytes)
    return st.dictionaries(words, st.integers(min_value=0, max_value=max_count), max_size=10)


@PROPERTY
@given(word_counts=word_dicts(b"ab"), n_merges=st.integers(min_value=0, max_value=40))
def test_generated_two_letters(word_counts, n_merges):
    assert_same(word_counts, n_merges)


@PROPERTY
@given(word_counts=word_dicts(b"abc", max_length=12), n_merges=st.integers(min_value=0, max_value=60))
def test_generated_three_letters(word_counts, n_merges):
    assert_same(word_counts, n_merges)


@PROPERTY
@given(word_counts=word_dicts(b"aab", max_length=40), n_merges=st.integers(min_value=0, max_value=40))
def test_generated_runs(word_counts, n_merges):
    """Long runs of one letter: overlapping occurrences merge left to right (b"aaa" -> aa, a)."""
    assert_same(word_counts, n_merges)


@PROPERTY
@given(word_counts=word_dicts(b"\x00a", max_length=40), n_merges=st.integers(min_value=0, max_value=40))
def test_generated_zero_bytes_and_long_tokens(word_counts, n_merges):
    """Tokens equal in their first 8 bytes, and b"a" against b"a\\x00": ties the C settles past a prefix."""
    assert_same(word_counts, n_merges)


@settings(max_examples=100, deadline=None)
@given(
    word_counts=st.dictionaries(st.binary(max_size=12), st.integers(min_value=0, max_value=2**63 - 1), max_size=12),
    n_merges=st.integers(min_value=-2, max_value=80),
)
def test_generated_any_bytes_any_counts(word_counts, n_merges):
    assert_same(word_counts, n_merges)


# ------------------------------------------------------------------ edge cases


@pytest.mark.parametrize(
    "word_counts",
    [
        {},
        {b"a": 5, b"b": 1, b"": 3},  # nothing of length 2
        {b"ab": 1},
        {b"aaaa": 1},  # -> aa aa, then aaaa
        {b"aaa": 2, b"aa": 1},
        {b"abab": 3, b"ba": 1},
        {b"ab": 0},  # a word with count 0 still gives its pairs to the reference's heap, merged last
        {b"ab": 0, b"xyz": 0, b"cd": 1, b"abc": 0, b"dc": 2},
        {b"ab": True, b"ba": False},
        {b"ab": 2**62, b"ba": 2**62, b"abab": 2**62, b"baba": 2**62, b"aba": 2**62 + 1},
        {b"xy" * 50: 2**63 - 1, b"yx" * 50: 2**63 - 1, b"xyx": 2**63 - 1},  # pair counts past 2**64
        {bytes([255, 0, 255, 0]): 1, bytes([0, 255]): 2, b"\x00\x00\x00": 1},
    ],
)
@pytest.mark.parametrize("n_merges", [-1, 0, 1, 2, 5, 100])
def test_edge_cases(word_counts, n_merges):
    assert_same(word_counts, n_merges)


def test_mappings_other_than_dict():
    word_counts = {b"abab": 2, b"bc": 3}
    expected = learn_merges(word_counts, 10)
    assert _fasttrain.learn_merges(types.MappingProxyType(word_counts), 10) == expected
    assert _fasttrain.learn_merges(word_counts=word_counts, n_merges=10) == expected


def test_bad_input():
    with pytest.raises(TypeError):
        _fasttrain.learn_merges({"ab": 1}, 5)  # str key: the reference raises TypeError too
    with pytest.raises(TypeError):
        _fasttrain.learn_merges({b"ab": 1, 7: 1}, 5)
    with pytest.raises(TypeError):
        _fasttrain.learn_merges({b"ab": 1.5}, 5)
    with pytest.raises(TypeError):
        _fasttrain.learn_merges([(b"ab", 1)], 5)
    with pytest.raises(TypeError):
        _fasttrain.learn_merges({b"ab": 1}, 2.0)
    with pytest.raises(ValueError):
        _fasttrain.learn_merges({b"ab": 1, b"ba": -1}, 5)  # the reference gives nonsense (or a KeyError)
    with pytest.raises(OverflowError):
        _fasttrain.learn_merges({b"ab": 2**63}, 5)
    assert _fasttrain.learn_merges({b"ab": 1}, 10**30) == [(b"a", b"b")]
    assert _fasttrain.learn_merges({b"ab": 1}, -(10**30)) == []


# ------------------------------------------------------------------ long words


def test_one_long_word(shakespeare_documents):
    """A whole text as one word: a merge costs its occurrences, not the word's length."""
    text = "".join(shakespeare_documents[:3]).encode("utf-8")
    big = _fasttrain.learn_merges({text[: 1 << 20]: 1}, 500)
    assert len(big) == 500
    tokens = {bytes([i]) for i in range(256)}
    for left, right in big:  # each merge joins tokens made before it
        assert left in tokens and right in tokens
        tokens.add(left + right)
    assert_same({text[:20_000]: 1}, 500)  # the reference is O(length x merges): a prefix only


def test_long_runs_of_one_byte():
    assert _fasttrain.learn_merges({b"a" * (1 << 20): 3}, 100) == [(b"a" * 2**i, b"a" * 2**i) for i in range(20)]
    assert_same({b"a" * 1000: 1, b"a" * 999: 2, b"ab" * 300: 1}, 50)


def test_threads_share_nothing(shakespeare_documents):
    """The merge loop runs without the GIL: concurrent calls give what one call gives."""
    word_counts = words_of([shakespeare_documents[1][:200_000]], "gpt4")
    expected = _fasttrain.learn_merges(word_counts, 3000)
    results = [None] * 4

    def run(i):
        results[i] = _fasttrain.learn_merges(word_counts, 3000)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected] * 4


# ------------------------------------------------------------------ the counting that feeds it


@pytest.mark.parametrize("workers", [1, 3])
def test_counts_on_threads_equal_the_pure_python_counts(shakespeare_documents, monkeypatch, workers):
    """Many more tasks than threads (each thread keeps one counter and adds every task it runs into it):
    the counts equal the pure-Python Counter's, and so do the merges learned from them."""
    from gptlab.tokenizer import native
    from gptlab.tokenizer import train as train_module

    documents = [document[:20_000] for document in shakespeare_documents[:8]] + ["", "a" * 5_000, EOT.join(["x y", "z"])]
    monkeypatch.setattr(train_module, "THREAD_TASK_CHARS", 3_000)
    monkeypatch.setattr(train_module, "READ_BLOCK", 1 << 12)  # so 160 KB already counts on threads
    with native.pure_python():
        expected = words_of(documents, "gpt4")
    got = count_words(texts=documents, pattern=resolve_pattern("gpt4"), special_tokens=[EOT], workers=workers)
    assert got == expected
    assert sum(expected.values()) > 30_000
    assert _fasttrain.learn_merges(got, 500) == learn_merges(expected, 500)


def test_class_table_parts_refuse_what_is_not_a_union():
    """The character-class table scans each \\p{..} a class names; a class it cannot split is an error, not a wrong table."""
    from gptlab.tokenizer import native

    assert native._class_parts(r"[\p{Lu}\p{Lt}\s]") == [r"\p{Lu}", r"\p{Lt}", r"\s"]
    assert native._class_parts(r"\p{N}") == [r"\p{N}"]
    for pattern in (r"[^\p{L}]", r"\P{L}", r"[\p{L}a-z]", r"\w", ""):
        with pytest.raises(ValueError, match="not a union"):
            native._class_parts(pattern)
