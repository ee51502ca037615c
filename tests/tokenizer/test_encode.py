"""Encoding and decoding a trained tokenizer: round trips, special tokens, streaming and batches."""

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptlab.runtime import GptlabError
from gptlab.tokenizer import Tokenizer
from gptlab.tokenizer import parallel as parallel_module

from .conftest import SAMPLES

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
EOT = "<|endoftext|>"


@PROPERTY
@given(text=st.text(alphabet=st.characters(codec="utf-8")))
def test_round_trip_on_any_string(small_tokenizer, text):
    ids = small_tokenizer.encode_ordinary(text)
    assert small_tokenizer.decode(ids) == text
    assert small_tokenizer.decode_bytes(ids) == text.encode("utf-8")


@PROPERTY
@given(parts=st.lists(st.one_of(st.text(max_size=20), st.sampled_from([EOT, "<|pad|>", "<|", "|>"])), max_size=12))
def test_round_trip_with_special_tokens_allowed(small_tokenizer, parts):
    text = "".join(parts)
    assert small_tokenizer.decode(small_tokenizer.encode(text, allowed_special="all")) == text


def test_special_tokens_get_their_own_ids(small_tokenizer):
    """Against tiktoken running the same ranks: specials as their ids when allowed, as text when not."""
    reference = small_tokenizer.to_tiktoken()
    text = f"a{EOT}b<|pad|> {EOT}{EOT}"
    allowed = small_tokenizer.encode(text, allowed_special="all")
    assert allowed == reference.encode(text, allowed_special="all")
    assert allowed.count(small_tokenizer.special_tokens[EOT]) == 3 and small_tokenizer.special_tokens["<|pad|>"] in allowed
    as_text = small_tokenizer.encode(text, disallowed_special=())
    assert as_text == reference.encode(text, disallowed_special=())
    assert not set(as_text) & set(small_tokenizer.special_tokens.values())


def test_text_spelling_a_special_token_raises_by_default(small_tokenizer):
    with pytest.raises(GptlabError, match=r"<\|pad\|>"):
        small_tokenizer.encode("hi <|pad|>")


def test_longest_special_token_wins_where_two_overlap():
    base = Tokenizer.train(["some text to learn from"], vocab_size=270, special_tokens=[])
    double = EOT + EOT
    tokenizer = Tokenizer(base.vocab, base.merges, [EOT, double])
    ids = tokenizer.encode(EOT * 3, allowed_special="all")
    assert ids == [tokenizer.special_tokens[double], tokenizer.special_tokens[EOT]]
    only_single = tokenizer.encode(EOT * 3, allowed_special={EOT}, disallowed_special=())
    assert only_single == [tokenizer.special_tokens[EOT]] * 3


@PROPERTY
@given(
    parts=st.lists(st.one_of(st.text(max_size=30), st.just(EOT), st.just("  \n ")), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_encode_iterable_equals_encode_on_any_chunking(small_tokenizer, parts, cuts):
    """Chunk boundaries anywhere (mid-word, mid-whitespace run, mid-special-token) change nothing."""
    text = "".join(parts)
    bounds = sorted({min(cut, len(text)) for cut in cuts} | {0, len(text)})
    chunks = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    expected = small_tokenizer.encode(text, allowed_special="all")
    assert list(small_tokenizer.encode_iterable(chunks, allowed_special="all")) == expected
    if EOT not in text and "<|pad|>" not in text:
        assert list(small_tokenizer.encode_iterable(chunks)) == small_tokenizer.encode(text)


def test_encode_iterable_on_megabytes_of_lines(gpt2_pair, shakespeare_documents):
    ours, theirs = gpt2_pair
    text = "".join(shakespeare_documents[:8])
    assert len(text) > 1_000_000
    lines = text.splitlines(keepends=True)
    assert list(ours.encode_iterable(lines)) == theirs.encode(text)
    assert list(ours.encode_iterable(iter([text]))) == theirs.encode(text)


def test_encode_iterable_is_lazy(small_tokenizer):
    """An endless stream yields ids at once: nothing waits for (or keeps) the whole input."""
    parts = ["the quick brown fox ", "jumps\n", "over 世界 "]
    endless = itertools.cycle(parts)
    first = list(itertools.islice(small_tokenizer.encode_iterable(endless), 10_000))
    finite = "".join(parts) * 5_000  # far more than 10,000 ids: its end cannot reach back to them
    assert first == small_tokenizer.to_tiktoken().encode(finite)[:10_000]


def test_encode_iterable_raises_on_disallowed_special(small_tokenizer):
    with pytest.raises(GptlabError, match="endoftext"):
        list(small_tokenizer.encode_iterable(["abc <|endof", "text|> def"]))


@pytest.mark.parametrize("workers", [1, 2])
def test_encode_batch_equals_encode(gpt2_pair, shakespeare_documents, monkeypatch, workers):
    ours, theirs = gpt2_pair
    monkeypatch.setattr(parallel_module, "PARALLEL_MIN_CHARS", 1000)  # take the process-pool path
    texts = [document[:20_000] for document in shakespeare_documents[:10]] + list(SAMPLES.values())
    assert ours.encode_batch(texts, workers=workers) == theirs.encode_ordinary_batch(texts)
    with_specials = [f"{t[:50]}{EOT}x" for t in texts]
    assert ours.encode_batch(with_specials, workers=workers, allowed_special="all") == theirs.encode_batch(
        with_specials, allowed_special="all"
    )


@pytest.mark.parametrize("ids", [[0, 10_000], [5, -1], [5, "a"], [None]])
def test_decode_unknown_id_is_a_clear_error(small_tokenizer, ids):
    with pytest.raises(GptlabError, match="unknown token id"):
        small_tokenizer.decode(ids)


def test_cache_does_not_change_ids(gpt2_pair, shakespeare_documents, monkeypatch):
    """The piece cache belongs to the pure-Python encoder: cleared again and again, it still gives tiktoken's ids."""
    import gptlab.tokenizer.core as core
    from gptlab.tokenizer.native import pure_python

    ours, theirs = gpt2_pair
    monkeypatch.setattr(core, "CACHE_LIMIT", 50)
    text = shakespeare_documents[3][:50_000]
    with pure_python():
        fresh = Tokenizer(ours.vocab, ours.merges, ours.special_tokens, ours.pattern)
        first = fresh.encode(text)
        assert 0 < len(fresh._cache) <= 50
        assert first == fresh.encode(text) == theirs.encode(text)
