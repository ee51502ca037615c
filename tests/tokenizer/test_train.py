"""BPE training: equal to a brute-force reference, deterministic across workers and chunking, specials as walls."""

from collections import Counter

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gptlab.runtime import GptlabError
from gptlab.tokenizer import Tokenizer
from gptlab.tokenizer import train as train_module
from gptlab.tokenizer.patterns import compile_pattern, resolve_pattern, split

EOT = "<|endoftext|>"


def reference_merges(documents, n_merges, pattern="gpt4", special_tokens=(EOT,)):
    """The textbook algorithm: recount every pair before every merge. Slow, obviously right."""
    import regex

    compiled = compile_pattern(resolve_pattern(pattern))
    words = Counter()
    for document in documents:
        parts = regex.split("|".join(map(regex.escape, special_tokens)), document) if special_tokens else [document]
        for part in parts:
            for piece in split(part, compiled):
                words[tuple(bytes([b]) for b in piece.encode("utf-8"))] += 1
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best = max(pairs, key=lambda pair: (pairs[pair], pair))  # most frequent, then greatest bytes
        merges.append(best)
        merged = Counter()
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return merges


def test_matches_reference_on_real_text(shakespeare_documents):
    documents = [shakespeare_documents[0][:60_000]]
    ours = Tokenizer.train(documents, vocab_size=256 + 200 + 1)
    assert ours.merges == reference_merges(documents, 200)


@settings(max_examples=60, deadline=None)
@given(
    documents=st.lists(st.text(alphabet="ab c\né世<|endoftext|>", max_size=80), min_size=1, max_size=4),
    n_merges=st.integers(min_value=1, max_value=30),
    pattern=st.sampled_from(["gpt2", "gpt4", None]),
)
def test_matches_reference_on_generated_text(documents, n_merges, pattern):
    """Ties everywhere (tiny alphabet): the tie-break rule is exercised constantly."""
    assume("".join(documents).replace(EOT, ""))  # an empty corpus is an error, tested below
    expected = reference_merges(documents, n_merges, pattern)
    ours = Tokenizer.train(documents, vocab_size=256 + n_merges + 1, pattern=pattern)
    assert ours.merges == expected  # the reference stops early when no pair is left, so must we


def test_tie_break_prefers_lexicographically_greatest_pair():
    # ab, "b ", " c" and cd all occur twice; (c, d) is the greatest pair byte-wise, so it merges first.
    ours = Tokenizer.train(["ab cd ab cd"], vocab_size=256 + 1 + 1, pattern=None)
    assert ours.merges == [(b"c", b"d")]
    ours = Tokenizer.train(["zy zy ab ab"], vocab_size=256 + 1 + 1, pattern="gpt2")
    assert ours.merges == [(b"z", b"y")]


def test_vocab_size_counts_bytes_merges_and_specials(shakespeare_documents):
    ours = Tokenizer.train(shakespeare_documents[:2], vocab_size=1000, special_tokens=[EOT, "<|pad|>"])
    assert ours.vocab_size == 1000
    assert len(ours.merges) == 1000 - 256 - 2
    assert ours.special_tokens == {EOT: 998, "<|pad|>": 999}
    assert len(ours.vocab) == 1000


def test_no_merge_crosses_a_special_token():
    """Training on "xy<eot>" repeated equals training on the separate documents "xy"."""
    joined = Tokenizer.train(["xy" + EOT] * 500 + ["xyxy"], vocab_size=300, pattern=None)
    separate = Tokenizer.train(["xy"] * 500 + ["xyxy"], vocab_size=300, pattern=None)
    assert joined.merges == separate.merges
    assert all(b"<" not in left + right for left, right in joined.merges)


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4", r"\w+|\s+|[^\w\s]+", None])
def test_patterns_train_and_round_trip(pattern, shakespeare_documents):
    text = shakespeare_documents[1][:30_000]
    ours = Tokenizer.train([text], vocab_size=400, pattern=pattern)
    assert ours.merges == reference_merges([text], 400 - 256 - 1, pattern)
    assert ours.decode(ours.encode(text)) == text


def test_no_presplit_lets_tokens_span_words():
    """Without a pre-split, merges (as the brute-force reference learns them) join across spaces; gpt4's never do."""
    text = "the cat " * 200
    ours = Tokenizer.train([text], vocab_size=270, pattern=None)
    assert ours.merges == reference_merges([text], 270 - 256 - 1, None)
    assert any(b" " in token.strip(b" ") for token in ours.vocab.values())  # e.g. b"the cat"
    presplit = Tokenizer.train([text], vocab_size=270, pattern="gpt4")
    assert presplit.merges == reference_merges([text], 270 - 256 - 1, "gpt4")
    assert not any(b" " in token[1:] for token in presplit.vocab.values() if len(token) > 1)


def test_workers_and_chunking_do_not_change_merges(tmp_path, shakespeare_documents, monkeypatch):
    """Serial vs parallel counting, texts vs files vs one file with documents joined by <|endoftext|>."""
    documents = shakespeare_documents[:12]
    monkeypatch.setattr(train_module, "PARALLEL_MIN_BYTES", 1 << 16)
    monkeypatch.setattr(train_module, "TEXTS_PER_TASK_CHARS", 1 << 18)
    monkeypatch.setattr(train_module, "READ_BLOCK", 1 << 16)
    files = []
    for i, document in enumerate(documents):
        files.append(tmp_path / f"{i}.txt")
        files[-1].write_text(document, encoding="utf-8")
    joined = tmp_path / "joined.txt"
    joined.write_text(EOT.join(documents), encoding="utf-8")
    serial = Tokenizer.train(documents, vocab_size=800, workers=1)
    assert Tokenizer.train(documents, vocab_size=800, workers=2).merges == serial.merges
    assert Tokenizer.train(iter(documents), vocab_size=800, workers=2).merges == serial.merges
    assert Tokenizer.train(files=files, vocab_size=800, workers=2).merges == serial.merges
    assert Tokenizer.train(files=[joined], vocab_size=800, workers=1).merges == serial.merges
    # The joined file is cut into ranges at <|endoftext|> and counted over two processes.
    assert len(train_module.file_ranges(joined, [EOT], 1 << 18)) > 4
    assert Tokenizer.train(files=[joined], vocab_size=800, workers=2).merges == serial.merges


def test_files_stream_with_characters_cut_across_reads(tmp_path, monkeypatch):
    """Reads of 7 bytes cut 2-, 3- and 4-byte characters; counts equal the in-memory ones."""
    text = ("naïve 世界 🎉 café x" * 50 + EOT) * 4
    path = tmp_path / "multibyte.txt"
    path.write_text(text, encoding="utf-8")
    monkeypatch.setattr(train_module, "READ_BLOCK", 7)
    assert "".join(train_module.read_text_chunks(path)) == text
    data = text.encode("utf-8")
    start = data.index(EOT.encode())  # ranges run from one special token to the next
    end = data.index(EOT.encode(), start + 1)
    assert "".join(train_module.read_text_chunks(path, start, end)) == data[start:end].decode("utf-8")
    from_file = Tokenizer.train(files=[path], vocab_size=300, workers=1)
    from_text = Tokenizer.train([text], vocab_size=300, workers=1)
    assert from_file.merges == from_text.merges


def test_progress_bar_reports_on_stderr(capsys, shakespeare_documents):
    Tokenizer.train(shakespeare_documents[:1], vocab_size=300, progress=True)
    err = capsys.readouterr().err
    assert "pre-tokenize" in err and "merges" in err


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"texts": [""], "vocab_size": 300}, "empty"),
        ({"texts": [EOT * 3], "vocab_size": 300}, "empty"),
        ({"texts": ["abc"], "vocab_size": 256}, "too small"),
        ({"texts": ["abc"], "vocab_size": 257, "special_tokens": [EOT, "<|pad|>"]}, "too small"),
        ({"vocab_size": 300}, "nothing to train on"),
        ({"files": ["/nonexistent/file.txt"], "vocab_size": 300}, "not found"),
    ],
)
def test_bad_training_input_is_one_clear_error(kwargs, message):
    texts = kwargs.pop("texts", None)
    with pytest.raises(GptlabError, match=message):
        Tokenizer.train(texts, **kwargs)


def test_invalid_utf8_file_is_a_clear_error(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("café".encode("latin-1") * 10)
    with pytest.raises(GptlabError, match="not valid UTF-8"):
        Tokenizer.train(files=[path], vocab_size=300)
