"""The compiled SentencePiece BPE encoder (spbpe.c) against the `sentencepiece` library: identical ids.

Models are trained here by the library itself (tiny vocabularies, under a second each) or written by hand with
gptlab.tokenizer.sp_model.write_model to reach the corners training never makes: "▁" inside a piece, UNUSED
pieces, equal scores, no "▁" piece at all. The encoder takes the normalised string; the library's own
`normalize` makes it, and for identity models it is checked against "▁" + text with spaces as "▁".
"""

import io
import threading

import pytest
import sentencepiece as spm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptlab.tokenizer import native
from gptlab.tokenizer.sp_model import (
    BYTE,
    CONTROL,
    NORMAL,
    UNKNOWN,
    UNUSED,
    USER_DEFINED,
    NormalizerSpec,
    Piece,
    SentencePieceModel,
    model_bytes,
    parse_model,
)

_spbpe = native.spbpe()
assert _spbpe is not None, "the compiled core is not built: run `.venv/bin/python setup.py build_ext --inplace`"

CORPUS = [
    "The quick brown fox jumps over the lazy dog, and the dog sleeps on.",
    "Le cœur a ses raisons que la raison ne connaît point. Über die Brücke, ça coûte 12,50 €.",
    "Москва — столица России. Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας. اللغة العربية هي إحدى أكثر اللغات انتشارًا.",
    "自然语言处理是人工智能的一个重要分支。吾輩は猫である。名前はまだ無い。한국어는 한글로 표기하며.",
    "Emoji 🎉🎉 party! 👩‍💻 writes code, 🇫🇷🇯🇵 flags wave. Mood: 😀😃😄 ∑ᵢ xᵢ² ≤ ∞.",
    "def encode(text):\n    return [ord(c) for c in text]  # 1234 5678",
    "    indented    lines   with   long    runs   of   spaces    ",
]
TEXTS = CORPUS + [
    "",
    " ",
    "      ",
    "a" * 300 + " " + "ab" * 200,
    "unseen characters: \U0001d518\U0001d52b\U0001d526 ⓐⓑⓒ \U0010ffff\u0378 and 𝔘𝔫𝔦",
    "Quick  brown   foxes    and     dogs      run",
    "中文混合English文本和😀😀😀emoji🎉🎉",
    "\t tabs\tand\nnewlines\n\n  mixed ",
    "ⓐⓑ ⓒⓓ",  # unknown characters on both sides of a space
]


def train(*, vocab_size: int, byte_fallback: bool = False, coverage: float = 1.0, **options) -> bytes:
    """A BPE model trained by the library on CORPUS (repeated, so merges have counts to rank)."""
    options.setdefault("normalization_rule_name", "identity")
    options.setdefault("remove_extra_whitespaces", False)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 20), model_writer=model, model_type="bpe", vocab_size=vocab_size,
        byte_fallback=byte_fallback, character_coverage=coverage, hard_vocab_limit=False, minloglevel=3, num_threads=1,
        **options,
    )
    return model.getvalue()


def encoder(model: bytes, **options):
    """The compiled encoder for a `.model`'s bytes."""
    parsed = parse_model(model)
    pieces = parsed.pieces
    unk_id = next(i for i, piece in enumerate(pieces) if piece.kind == UNKNOWN)
    return _spbpe.Encoder([p.text for p in pieces], [p.score for p in pieces], [p.kind for p in pieces], parsed.byte_fallback,
                          unk_id, **options)


def assert_same_ids(model: bytes, texts: list[str], expected_mode: str) -> None:
    """Both paths (words when the model allows it, and the whole string) give the library's ids."""
    library = spm.SentencePieceProcessor(model_proto=model)
    words, whole = encoder(model), encoder(model, split_words=False)
    assert (words.split_mode, whole.split_mode) == (expected_mode, "none")
    normalized = [library.normalize(text) for text in texts]
    for text, norm in zip(texts, normalized):
        expected = library.encode(text)
        assert words.encode(norm) == expected, (text, norm)
        assert whole.encode(norm) == expected, (text, norm)
    assert words.encode_many(normalized) == library.encode(texts, num_threads=1)


@pytest.mark.parametrize(
    ("vocab_size", "byte_fallback", "coverage"),
    [(420, False, 1.0), (800, False, 1.0), (1500, False, 0.9995), (700, True, 1.0), (600, True, 0.98), (400, False, 0.98)],
)
def test_spbpe_ids_equal_library_when_trained_by_library(vocab_size, byte_fallback, coverage):
    model = train(vocab_size=vocab_size, byte_fallback=byte_fallback, coverage=coverage)
    assert_same_ids(model, TEXTS, "before_space")


def test_spbpe_ids_equal_library_for_llama_and_nfkc_options():
    llama = train(vocab_size=900, byte_fallback=True, split_digits=True, add_dummy_prefix=True)
    assert_same_ids(llama, TEXTS, "before_space")
    nfkc = train(vocab_size=900, normalization_rule_name="nmt_nfkc", remove_extra_whitespaces=True)
    assert_same_ids(nfkc, TEXTS + ["ﬁ ① Ｆｕｌｌｗｉｄｔｈ ｶﾀｶﾅ"], "before_space")


def test_spbpe_identity_normalised_string_is_escaped_text():
    """The input the tests hand the encoder: for identity models, "▁" + text with spaces as "▁"."""
    model = train(vocab_size=500)
    library = spm.SentencePieceProcessor(model_proto=model)
    for text in [text for text in TEXTS if text]:
        normalized = "▁" + text.replace(" ", "▁")
        assert library.normalize(text) == normalized
        assert encoder(model).encode(normalized) == library.encode(text)


def test_spbpe_ids_equal_library_when_whitespace_is_suffix():
    model = train(vocab_size=700, treat_whitespace_as_suffix=True)
    assert_same_ids(model, TEXTS, "after_space")


def test_spbpe_user_defined_symbols_are_frozen_longest_match():
    model = train(vocab_size=700, user_defined_symbols=["<tool>", "<tool_call>", "ab", "▁▁", "🎉"])
    texts = TEXTS + ["<tool_call><tool>abab <tool_c ab▁▁ 🎉🎉 a b", "xab<tool>ab", "   ▁▁"]
    assert_same_ids(model, texts, "before_space")


def test_spbpe_user_defined_symbol_with_inner_space_runs_whole_string():
    model = train(vocab_size=700, user_defined_symbols=["New▁York", "a▁b"])
    assert_same_ids(model, TEXTS + ["New York is big a b ab a  b", "NewNew York"], "none")


# ---------------------------------------------------------------- hand-built models


def handmade(pieces: list[tuple[str, float, int]], *, byte_fallback: bool = False) -> bytes:
    """A `.model` holding exactly `pieces` (after <unk>, <s>, </s> and, with byte fallback, the 256 byte pieces)."""
    head = [Piece("<unk>", 0.0, UNKNOWN), Piece("<s>", 0.0, CONTROL), Piece("</s>", 0.0, CONTROL)]
    if byte_fallback:
        head += [Piece(f"<0x{b:02X}>", 0.0, BYTE) for b in range(256)]
    model = SentencePieceModel(
        pieces=tuple(head + [Piece(text, score, kind) for text, score, kind in pieces]),
        normalizer=NormalizerSpec(name="identity", add_dummy_prefix=True, remove_extra_whitespaces=False),
        byte_fallback=byte_fallback,
    )
    return model_bytes(model)


CHARACTERS = [("▁", -1.0, NORMAL), ("a", -1.0, NORMAL), ("b", -1.0, NORMAL), ("c", -1.0, NORMAL)]
# "▁" inside pieces ("a▁", "a▁b"), UNUSED pieces formed and split back, equal scores everywhere.
INNER_SPACE = CHARACTERS + [
    ("ab", 1.0, NORMAL), ("ba", 1.0, NORMAL), ("a▁", 1.0, NORMAL), ("a▁b", 2.0, NORMAL), ("▁a", 1.0, NORMAL),
    ("aba", 1.5, UNUSED), ("abab", 1.5, NORMAL), ("bc", 1.0, UNUSED), ("abc", 3.0, NORMAL), ("cc", 0.5, NORMAL),
    ("▁▁", 1.0, NORMAL), ("ccc", 0.5, UNUSED), ("cccc", 0.5, NORMAL),
]
EQUAL_SCORES = CHARACTERS + [("ab", 0.0, NORMAL), ("ba", 0.0, NORMAL), ("bc", 0.0, NORMAL), ("aba", 0.0, NORMAL)]
NO_SPACE_PIECE = [("a", -1.0, NORMAL), ("b", -1.0, NORMAL), ("ab", 0.0, NORMAL)]  # "▁" itself is unknown
# "\n" joins ("\n\n", ".\n"), so words must not be cut at it; "\t" and unknown "x" join nothing, so they may be.
NEWLINES = CHARACTERS + [
    ("\n", -1.0, NORMAL), ("\t", -1.0, NORMAL), (".", -1.0, NORMAL), ("\n\n", 2.0, NORMAL), (".\n", 1.0, NORMAL),
    ("a.", 1.5, NORMAL), ("▁a", 1.0, NORMAL), ("ab", 0.5, NORMAL), ("\n▁", 0.7, NORMAL),
]


def test_spbpe_inner_space_piece_and_unused_pieces_equal_library():
    texts = ["a b", "aba ab abab", "abc bc abcabc", "a  b a   b", "ccccc ccc cc", "ba ab a", "a b ab a b", "x a y b"]
    assert_same_ids(handmade(INNER_SPACE), texts, "none")
    assert_same_ids(handmade(INNER_SPACE, byte_fallback=True), texts, "none")


def test_spbpe_equal_scores_merge_leftmost_first():
    model = handmade(EQUAL_SCORES)
    library = spm.SentencePieceProcessor(model_proto=model)
    ids = {piece: library.piece_to_id(piece) for piece in ("ab", "a", "b", "bc", "aba")}
    # "aba": "ab" (left) and "ba" tie; leftmost wins, then "ab"+"a" -> "aba". "abc": "ab" before "bc".
    assert encoder(model).encode("abab") == [ids["aba"], ids["b"]] == library.encode("abab", add_bos=False)[1:]
    assert encoder(model).encode("abc") == [ids["ab"], library.piece_to_id("c")]
    assert_same_ids(model, ["abab", "abc", "babab", "bcab ab"], "before_space")


def test_spbpe_unknown_run_across_words_is_one_unknown():
    model = handmade(NO_SPACE_PIECE)
    library = spm.SentencePieceProcessor(model_proto=model)
    assert library.encode("ab ab") == [0, 5, 0, 5]  # "▁" has no piece: unknown, between "ab"s (id 5)
    assert library.encode("xy z") == [0]  # "▁x", "y", "▁", "z": one run of unknowns
    assert_same_ids(model, ["ab ab", "xy z", "ab xy ab", "  ", "a x b"], "before_space")
    assert_same_ids(handmade(NO_SPACE_PIECE, byte_fallback=True), ["ab ab", "xy z", "ab xy ab"], "before_space")


def test_spbpe_words_cut_only_at_characters_that_never_merge():
    texts = ["a.\n\nb", "a.\n b\n\n\na.", "a\tb\t\t.\n", "x\nx a.x\tab", "\n\n\n", " \n a"]
    assert_same_ids(handmade(NEWLINES), texts, "none")  # "\n▁" holds "▁" after a character
    no_space_after = handmade([piece for piece in NEWLINES if piece[0] != "\n▁"])
    assert_same_ids(no_space_after, texts, "before_space")


MODELS = {
    "newlines": handmade([piece for piece in NEWLINES if piece[0] != "\n▁"]),
    "inner_space": handmade(INNER_SPACE),
    "equal_scores": handmade(EQUAL_SCORES),
    "no_space_piece_bytes": handmade(NO_SPACE_PIECE, byte_fallback=True),
}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(MODELS)),
    text=st.text(alphabet=st.sampled_from(["a", "b", "c", " ", "▁", "x", "é", "😀", "\n", "\t", "."]), max_size=40),
)
def test_spbpe_random_strings_equal_library(name, text):
    model = MODELS[name]
    library = spm.SentencePieceProcessor(model_proto=model)
    expected = library.encode(text)
    normalized = library.normalize(text)
    assert encoder(model).encode(normalized) == expected
    assert encoder(model, split_words=False).encode(normalized) == expected


@pytest.fixture(scope="module")
def trained_with_fallback() -> bytes:
    return train(vocab_size=600, byte_fallback=True)


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("the quick fox  ▁Москва自然😀🎉\u0378é")), max_size=60))
def test_spbpe_random_strings_equal_library_on_trained_model(trained_with_fallback, text):
    library = spm.SentencePieceProcessor(model_proto=trained_with_fallback)
    assert encoder(trained_with_fallback).encode(library.normalize(text)) == library.encode(text)


def test_spbpe_threads_share_one_encoder(trained_with_fallback):
    """encode_many releases the GIL; calls from several threads on one Encoder give each its own ids."""
    library = spm.SentencePieceProcessor(model_proto=trained_with_fallback)
    shared = encoder(trained_with_fallback)
    normalized = [library.normalize(text) for text in TEXTS * 5]
    expected = library.encode(TEXTS * 5, num_threads=1)
    results: list = [None] * 4

    def work(slot: int) -> None:
        results[slot] = shared.encode_many(normalized)

    threads = [threading.Thread(target=work, args=(slot,)) for slot in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected] * 4


def test_spbpe_refuses_inconsistent_models():
    pieces = ["<unk>", "a", "a"]
    with pytest.raises(ValueError, match="already defined"):
        _spbpe.Encoder(pieces, [0.0] * 3, [UNKNOWN, NORMAL, NORMAL], False, 0)
    with pytest.raises(ValueError, match="differ in length"):
        _spbpe.Encoder(pieces[:2], [0.0], [UNKNOWN, NORMAL], False, 0)
    with pytest.raises(ValueError, match="unk_id 1"):
        _spbpe.Encoder(pieces[:2], [0.0] * 2, [UNKNOWN, NORMAL], False, 1)
    with pytest.raises(ValueError, match="no byte piece <0x00>"):
        _spbpe.Encoder(pieces[:2], [0.0] * 2, [UNKNOWN, NORMAL], True, 0)
    with pytest.raises(ValueError, match="kinds are 1"):
        _spbpe.Encoder(pieces[:2], [0.0] * 2, [UNKNOWN, 9], False, 0)
    with pytest.raises(ValueError, match="empty"):
        _spbpe.Encoder(["<unk>", ""], [0.0] * 2, [UNKNOWN, USER_DEFINED], False, 0)
