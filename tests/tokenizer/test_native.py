"""The compiled core (fastbpe.c) against the pure-Python reference: same classes, pieces, ids and counts.

The reference runs with GPTLAB_PURE_PYTHON=1 (see gptlab.tokenizer.native); every test here compares the
two on the same input, over real corpora, hypothesis text and every split pattern.
"""

import os
import pickle
import subprocess
import sys
from collections import Counter

import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptlab.tokenizer import Tokenizer, native
from gptlab.tokenizer.native import pure_python
from gptlab.tokenizer.patterns import compile_pattern, resolve_pattern, split
from gptlab.tokenizer.train import count_words

from .conftest import SAMPLES

_fastbpe = native.fastbpe()  # the compiled module, its character classes set from `regex`
PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
EOT = "<|endoftext|>"
SCANNED = {"gpt2": _fastbpe.PATTERN_GPT2, "gpt4": _fastbpe.PATTERN_GPT4, "o200k": _fastbpe.PATTERN_O200K}

# Characters where the patterns' rules meet: every kind of space, contraction letters (and U+017F, which
# `regex` folds to "s"), letters of each case class o200k tells apart (Lu, Ll, Lt, Lm, Lo), combining
# marks, digits, punctuation, CJK, emoji.
TRICKY = list(" \t\n\r\x0b\x0c\x1c\x85\xa0\u2028\u3000'sSdDtTmMlLvVeErR\u017faA1٣½²!?.,-/éΩωǅʰ漢\u0301\u0308\U0001f600<|>")
tricky_text = st.text(alphabet=st.sampled_from(TRICKY), max_size=40)
any_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
mixed_text = st.lists(st.one_of(tricky_text, any_text), max_size=4).map("".join)


def reference_copy(tokenizer: Tokenizer) -> Tokenizer:
    with pure_python():
        copy = Tokenizer(tokenizer.vocab, tokenizer.merges, tokenizer.special_tokens, tokenizer.pattern)
        assert copy._fast() is None
    return copy


def compiled_copy(tokenizer: Tokenizer) -> Tokenizer:
    copy = Tokenizer(tokenizer.vocab, tokenizer.merges, tokenizer.special_tokens, tokenizer.pattern)
    assert copy._fast() is not None
    return copy


@pytest.fixture(scope="session")
def trained(shakespeare_documents):
    """Small tokenizers trained on Shakespeare with every pattern (by the fast trainer: its merges equal the reference
    trainer's, tests/tokenizer/test_train*.py; what this file compares is encoding)."""
    text = shakespeare_documents[:3]
    return {
        name: Tokenizer.train(text, vocab_size=600, pattern=name, special_tokens=[EOT, "<|pad|>"])
        for name in ["gpt2", "gpt4", "o200k", "none", r"\w+|\W"]
    }


# ---------------------------------------------------------------- the build and the fallback


def test_compiled_core_is_built_and_used():
    from gptlab.tokenizer import _fastbpe as module

    assert native.fastbpe() is module is _fastbpe
    assert native.fasttrain() is not None


def test_character_classes_agree_with_regex_on_every_code_point():
    """The table native.py builds from runs of each class, checked code point by code point."""
    classes = {
        _fastbpe.CLASS_LETTER: r"\p{L}",
        _fastbpe.CLASS_NUMBER: r"\p{N}",
        _fastbpe.CLASS_SPACE: r"\s",
        _fastbpe.CLASS_UPPERISH: r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]",
        _fastbpe.CLASS_LOWERISH: r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]",
    }
    everything = "".join(map(chr, range(0x110000)))
    expected = [0] * 0x110000
    for flag, pattern in classes.items():
        for match in regex.finditer(pattern, everything):
            expected[match.start()] |= flag
    assert [_fastbpe.char_class(cp) for cp in range(0x110000)] == expected
    assert sum(1 for flags in expected if flags & _fastbpe.CLASS_LETTER) > 100_000


def test_scanners_refuse_to_run_without_character_classes():
    """Imported directly (not through native.fastbpe()), the module has no classes yet: a clear error."""
    code = """
import pytest
from gptlab.tokenizer import _fastbpe as m
assert not m.has_char_classes()
for call in (lambda: m.split("a b", m.PATTERN_GPT2), lambda: m.PieceCounter(m.PATTERN_GPT4), lambda: m.char_class(65)):
    with pytest.raises(RuntimeError, match="character classes are not set"):
        call()
assert m.split("a b", m.PATTERN_NONE) == ["a b"]
with pytest.raises(ValueError, match="one per code point"):
    m.set_char_classes(b"x")
table = bytearray(0x110000)
table[ord("a")], table[ord(" ")] = m.CLASS_LETTER, m.CLASS_SPACE
m.set_char_classes(bytes(table))
m.set_char_classes(bytes(table))
assert m.split("ab b", m.PATTERN_GPT2) == ["a", "b", " b"]  # "b" is no letter in this table
table[ord("b")] = m.CLASS_LETTER
with pytest.raises(RuntimeError, match="already set to a different table"):
    m.set_char_classes(bytes(table))
print("ok")
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"


def test_pure_python_context_switches_the_core_off_and_restores_the_environment(monkeypatch):
    monkeypatch.setenv(native.ENV_PURE_PYTHON, "0")
    with pure_python():
        assert native.fastbpe() is None and native.fasttrain() is None
    assert os.environ[native.ENV_PURE_PYTHON] == "0"
    assert native.fastbpe() is _fastbpe


def test_pure_python_is_chosen_by_environment_in_a_fresh_process():
    code = "from gptlab.tokenizer import native, Tokenizer; print(native.fastbpe(), native.fasttrain())"
    env = {**os.environ, native.ENV_PURE_PYTHON: "1"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["None", "None"]


def test_missing_build_falls_back_and_says_so_once(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gptlab.tokenizer._fastbpe", None)  # import now raises ImportError
    monkeypatch.setitem(sys.modules, "gptlab.tokenizer._fasttrain", None)
    monkeypatch.setattr(native, "_warned", False)
    assert native.fastbpe() is None and native.fasttrain() is None and native.fastbpe() is None
    tokenizer = Tokenizer.train(["hello hello world"], vocab_size=260)
    assert tokenizer._fast() is None
    assert tokenizer.decode(tokenizer.encode("hello world")) == "hello world"
    err = capsys.readouterr().err
    assert err.count("compiled tokenizer core is not built") == 1
    assert "pure-Python" in err


def test_tokenizer_pickles_without_its_compiled_encoder(gpt2_pair):
    tokenizer, reference = gpt2_pair
    tokenizer.encode("warm up")
    copy = pickle.loads(pickle.dumps(tokenizer))
    assert copy._native_encoder is None
    assert copy.encode(SAMPLES["code"]) == reference.encode(SAMPLES["code"])


# ---------------------------------------------------------------- pre-tokenization


@pytest.mark.parametrize("name", SCANNED)
def test_scanner_splits_like_regex_on_samples_and_shakespeare(name, shakespeare_documents):
    compiled = compile_pattern(name)
    for text in [*SAMPLES.values(), "".join(shakespeare_documents[:8])]:
        assert _fastbpe.split(text, SCANNED[name]) == split(text, compiled)


@PROPERTY
@given(text=mixed_text)
def test_scanner_splits_like_regex_on_any_text(text):
    for name, scanner in SCANNED.items():
        assert _fastbpe.split(text, scanner) == split(text, compile_pattern(name))


@PROPERTY
@given(text=mixed_text, more=mixed_text)
def test_stable_prefix_is_never_changed_by_more_text(text, more):
    """What encode_stable keeps of `text` must be what the whole of `text + more` gives."""
    for name, scanner in SCANNED.items():
        counter = _fastbpe.PieceCounter(scanner)
        used = counter.add(text, final=False)
        whole, prefix, covered = split(text + more, compile_pattern(name)), [], 0
        while covered < used:
            prefix.append(whole[len(prefix)])
            covered += len(prefix[-1])
        assert covered == used  # the counter stopped at a piece boundary of the whole text
        assert Counter(counter.counts()) == Counter(prefix)


# ---------------------------------------------------------------- encoding


@PROPERTY
@given(text=mixed_text)
def test_ids_equal_the_reference_for_every_pattern(trained, text):
    for tokenizer in trained.values():
        fast, slow = compiled_copy(tokenizer), reference_copy(tokenizer)
        assert fast.encode_ordinary(text) == slow.encode_ordinary(text)
        assert fast.encode(text + EOT, allowed_special={EOT}) == slow.encode(text + EOT, allowed_special={EOT})


def test_ids_equal_tiktoken_on_shakespeare_through_every_entry_point(pair, shakespeare_documents):
    ours, reference = pair
    ours = compiled_copy(ours)
    documents = shakespeare_documents[:6]
    text = "".join(documents)
    expected = reference.encode_ordinary(text)
    assert ours.encode_ordinary(text) == expected
    assert ours.encode(text) == expected
    assert list(ours.encode_iterable(text[i : i + 777] for i in range(0, len(text), 777))) == expected
    expected_each = [reference.encode_ordinary(document) for document in documents]
    assert ours.encode_many(documents) == expected_each
    assert ours.encode_batch(documents, workers=2) == expected_each
    packed, counts = ours.encode_ordinary_packed(documents)
    assert counts == [len(ids) for ids in expected_each]
    assert packed.tolist() == [i for ids in expected_each for i in ids]


@pytest.mark.parametrize("name", ["gpt4", "none", "gpt2"])
def test_long_pieces_use_the_heap_merge_and_match_the_reference(trained, shakespeare_documents, name):
    """Pieces longer than SMALL_PIECE bytes (no pre-split, long space or digit runs) take the O(n log n) path."""
    tokenizer = trained[name]
    fast, slow = compiled_copy(tokenizer), reference_copy(tokenizer)
    texts = [
        shakespeare_documents[0][:5000],
        " " * 300 + "x" + "\n" * 200 + "\t " * 150,
        "1234567890" * 40 + " " + "aaaa" * 100 + "ab" * 200,
        "thethethe" * 60,
    ]
    for text in texts:
        assert fast.encode_ordinary(text) == slow.encode_ordinary(text)
    assert max(len(piece.encode()) for piece in split(texts[1], compile_pattern(name))) > _fastbpe.SMALL_PIECE


def test_vocabulary_tokens_that_bpe_cannot_reach_keep_the_reference_ids():
    """A token whose bytes BPE splits differently must not be emitted whole (the precomputed table holds BPE's result)."""
    vocab = {i: bytes([i]) for i in range(256)}
    vocab.update({256: b"ab", 257: b"bc", 258: b"abc"})
    tokenizer = Tokenizer(vocab, [(b"a", b"b"), (b"b", b"c"), (b"ab", b"c")], [], "gpt2")
    # "abc": (a, b) has the lowest rank -> [ab, c] -> [abc]; with the order of the first two swapped, "abc" -> [a, bc]
    swapped = Tokenizer(vocab, [(b"b", b"c"), (b"a", b"b"), (b"ab", b"c")], [], "gpt2")
    for candidate in (tokenizer, swapped):
        assert compiled_copy(candidate).encode("abc abc") == reference_copy(candidate).encode("abc abc")
    assert compiled_copy(swapped).encode("abc") == [97, 257]


@PROPERTY
@given(
    parts=st.lists(st.one_of(mixed_text, st.just(EOT), st.just("  \n ")), max_size=12),
    cut=st.integers(min_value=1, max_value=50),
)
def test_streamed_encoding_equals_whole_text_encoding(trained, parts, cut):
    text = "".join(parts)
    chunks = [text[i : i + cut] for i in range(0, len(text), cut)]
    for tokenizer in trained.values():
        fast = compiled_copy(tokenizer)
        expected = reference_copy(tokenizer).encode(text, allowed_special="all")
        assert list(fast.encode_iterable(chunks, allowed_special="all")) == expected


def test_streaming_with_small_buffers_holds_back_open_pieces(trained, monkeypatch):
    """encode_stable must leave pieces that the next chunk could extend (buffer far smaller than the text)."""
    from gptlab.tokenizer import stream

    monkeypatch.setattr(stream.stream_parts, "__defaults__", (16,))
    text = "Hello   world\n\n  it's 12345 O'Neil " + EOT + " done   \n" * 20
    for tokenizer in trained.values():
        chunks = [text[i : i + 5] for i in range(0, len(text), 5)]
        expected = reference_copy(tokenizer).encode(text, allowed_special="all")
        assert list(compiled_copy(tokenizer).encode_iterable(chunks, allowed_special="all")) == expected


def test_batch_encoding_checks_disallowed_special_tokens(gpt2_pair):
    from gptlab.runtime import GptlabError

    tokenizer = compiled_copy(gpt2_pair[0])
    with pytest.raises(GptlabError, match="endoftext"):
        tokenizer.encode_batch(["fine", "not " + EOT] * 40000, workers=2)
    ids = tokenizer.encode_batch(["a" + EOT], allowed_special="all")
    assert ids == [[64, tokenizer.special_tokens[EOT]]]


def test_surrogates_raise_like_the_reference(gpt2_pair):
    with pytest.raises(UnicodeEncodeError):
        compiled_copy(gpt2_pair[0]).encode("a\ud800b")
    with pytest.raises(UnicodeEncodeError):
        reference_copy(gpt2_pair[0]).encode("a\ud800b")


# ---------------------------------------------------------------- counting for training


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4", "none", "o200k", r"\w+|\W"])
@pytest.mark.parametrize("workers", [1, 2])
def test_piece_counts_equal_the_reference(shakespeare_documents, tmp_path, pattern, workers):
    documents = shakespeare_documents[:4]
    path = tmp_path / "corpus.txt"
    path.write_text(EOT.join(shakespeare_documents[4:7]), encoding="utf-8")
    arguments = dict(texts=documents, files=[path], pattern=resolve_pattern(pattern), special_tokens=[EOT], workers=workers)
    with pure_python():
        expected = count_words(**arguments)
    assert count_words(**arguments) == expected


def test_piece_counter_streams_and_merges_like_one_pass(shakespeare_documents):
    text = "".join(shakespeare_documents[:2])
    for name, scanner in SCANNED.items():
        whole = _fastbpe.PieceCounter(scanner)
        whole.add(text)
        streamed, rest = _fastbpe.PieceCounter(scanner), ""
        for i in range(0, len(text), 1000):
            rest += text[i : i + 1000]
            rest = rest[streamed.add(rest, final=False) :]
        streamed.add(rest)
        middle = len(text) // 2
        first, second, merged = (_fastbpe.PieceCounter(scanner) for _ in range(3))
        first.add(text[:middle])
        second.add(text[middle:])
        merged.update(first)
        merged.update(second)
        compiled = compile_pattern(name)
        expected = Counter(split(text, compiled))
        assert Counter(whole.counts()) == expected == Counter(streamed.counts())
        assert Counter(merged.counts()) == Counter(split(text[:middle], compiled)) + Counter(split(text[middle:], compiled))
        assert whole.counts(as_bytes=True) == {piece.encode(): n for piece, n in expected.items()}


@pytest.mark.parametrize("pattern", ["gpt4", "gpt2", "none"])
def test_training_gives_the_reference_merges(shakespeare_documents, pattern):
    documents = shakespeare_documents[:2] if pattern != "none" else [d[:3000] for d in shakespeare_documents[:5]]
    with pure_python():
        expected = Tokenizer.train(documents, vocab_size=1200, pattern=pattern)
    tokenizer = Tokenizer.train(documents, vocab_size=1200, pattern=pattern)
    assert tokenizer.merges == expected.merges
    assert tokenizer.vocab == expected.vocab
