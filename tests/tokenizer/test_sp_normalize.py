"""gptlab's SentencePiece normaliser against the `sentencepiece` library's own (normalizer.cc).

Both gptlab paths are checked: the fast `normalize` and the byte-level port `normalize_bytes`/`normalize_reference`.
The rule sets come from the library (`SentencePieceNormalizer(rule_name=...)`); user-defined symbols and
treat_whitespace_as_suffix need a whole model, so a tiny one is trained here with the library.
"""

from __future__ import annotations

import itertools
import struct

import pytest

spm = pytest.importorskip("sentencepiece")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from sentencepiece import sentencepiece_model_pb2 as pb2  # noqa: E402

from gptlab.runtime import GptlabError  # noqa: E402
from gptlab.tokenizer.sp_model import NormalizerSpec, parse_model  # noqa: E402
from gptlab.tokenizer.sp_normalize import SentencePieceNormalizer  # noqa: E402

RULES = ("identity", "nfkc", "nmt_nfkc", "nfkc_cf", "nmt_nfkc_cf")
FLAGS = list(itertools.product((True, False), repeat=3))  # add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces
TEXTS = [
    "", " ", "   ", "\t", "\n\n", "Hello world", "  Hello   world  ", "a" + " " * 40 + "b", " leading", "trailing ",
    "ﬁne ﬂow", "①②③ ⑩", "ＡＢＣ　１２３！", "Ｈｅｌｌｏ,\u3000ｗｏｒｌｄ", "x²+y³", "Straße ÇA İ ǅ Σσς", "\u00a0nbsp\u00a0",
    "tab\there\r\nnew\x0bline\x0cfeed", "bell\x07 del\x7f esc\x1b nul\x00 end", "\x01\x02", " \x01 ", "\x01 a",
    "e\u0301 A\u0301\u0323 o\u0308\u0304 \u0301lone", "\u1100\u1161\u11a8 가각 ㄱㅏ", "ᄀ\u1161", "க\u0bca கொ க\u0bc6\u0bbe",
    "日本語のテキスト、カタカナ ｶﾀｶﾅ", "中文，标点。", "한국어 텍스트", "Русский текст", "ελληνικά", "עברית", "العربية ﷺ",
    "हिन्दी क़", "ไทย", "emoji 👍🏽 👨‍👩‍👧 🇫🇷 ❤️", "\ufeffbom", "zero\u200bwidth\u200djoiner", "▁already▁escaped▁", "▁ ▁",
    "…‥", "℡ ㎏ ㍻", "\ufffd replacement", "\U0010ffff max", "ℌ𝔢𝔩𝔩𝔬 𝐁𝐨𝐥𝐝", "Ⅻ ⅻ", "½ ¼",
]


def _spec(library) -> pb2.NormalizerSpec:
    spec = pb2.NormalizerSpec()
    spec.ParseFromString(library.serialized_normalizer_spec())
    return spec


def _pair(rule: str, dummy: bool = True, remove: bool = True, escape: bool = True):
    """The library's normaliser for a rule set and options, and gptlab's built from the same spec."""
    library = spm.SentencePieceNormalizer(rule_name=rule, add_dummy_prefix=dummy, remove_extra_whitespaces=remove,
                                          escape_whitespaces=escape)
    spec = _spec(library)
    ours = SentencePieceNormalizer(NormalizerSpec(rule, spec.precompiled_charsmap, spec.add_dummy_prefix,
                                                  spec.remove_extra_whitespaces, spec.escape_whitespaces))
    return library, ours


PAIRS = {(rule, flags): _pair(rule, *flags) for rule in RULES for flags in FLAGS}


def _check(library, ours: SentencePieceNormalizer, text: str) -> None:
    expected = library.normalize(text)
    assert ours.normalize(text) == expected, (text, expected)
    assert ours.normalize_reference(text) == expected, (text, expected)


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "dummy{}-remove{}-escape{}".format(*map(int, f)))
@pytest.mark.parametrize("rule", RULES)
def test_sp_normalize_equals_library_for_every_rule_set_and_whitespace_option(rule, flags):
    library, ours = PAIRS[rule, flags]
    for text in TEXTS:
        _check(library, ours, text)


def test_sp_normalize_is_lossy_exactly_where_the_library_is():
    """The folds the module docstring promises: compatibility forms, case (_cf), controls (nmt_), space runs."""
    cases = {
        "nfkc": {"ﬁ": "▁fi", "①": "▁1", "ＡＢＣ１": "▁ABC1", "x²": "▁x2", "a\u00a0 b": "▁a▁b", "  a   b  ": "▁a▁b", "a▁": "▁a"},
        "nmt_nfkc": {"a\tb\nc": "▁a▁b▁c", "a\x07b": "▁ab"},
        "nfkc_cf": {"ÀB": "▁àb"},
        "identity": {"ﬁ ①": "▁ﬁ▁①", "  a  ": "▁a"},
    }
    for rule, examples in cases.items():
        library, ours = PAIRS[rule, (True, True, True)]
        for text, folded in examples.items():
            assert library.normalize(text) == folded
            assert ours.normalize(text) == folded


@settings(max_examples=300, deadline=None)
@given(text=st.text(), rule=st.sampled_from(RULES), flags=st.sampled_from(FLAGS))
def test_sp_normalize_equals_library_on_any_text(text, rule, flags):
    library, ours = PAIRS[rule, flags]
    _check(library, ours, text)


# characters where the charsmap's longer keys start, end or overlap, mixed with spaces and controls
TRICKY = list("aAeEoO<=> \t\n\x01\x7f\u3000\u00a0\u0301\u0323\u0308\u0338\u0bc6\u0bbe\u0bca\u1100\u1161\u11a8가ㄱㅏﬁ①Ａ▁…")


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(TRICKY), max_size=30), rule=st.sampled_from(RULES), flags=st.sampled_from(FLAGS))
def test_sp_normalize_equals_library_where_multi_character_rules_overlap(text, rule, flags):
    library, ours = PAIRS[rule, flags]
    _check(library, ours, text)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=40) | st.lists(st.sampled_from([b" ", b"\xe2\x96\x81", b"\xe2\x96", b"\xed\xa0\x80", b"\xff",
                                                               b"e\xcc\x81", b"\xc3", b"\xef\xbf\xbd", b"A"])).map(b"".join),
       rule=st.sampled_from(RULES))
def test_sp_normalize_bytes_equals_library_on_malformed_utf8(data, rule):
    library, ours = PAIRS[rule, (True, True, True)]
    assert ours.normalize_bytes(data) == library.normalize(data)


def test_sp_normalize_turns_a_lone_surrogate_into_the_library_result_for_its_bytes():
    library, ours = PAIRS["nfkc", (True, True, True)]
    text = "a\ud800b \udcff"
    expected = library.normalize(text.encode("utf-8", "surrogatepass")).decode("utf-8")
    assert ours.normalize(text) == ours.normalize_reference(text) == expected


def test_sp_normalize_keeps_a_long_text_equal_to_the_library():
    library, ours = PAIRS["nmt_nfkc_cf", (True, True, True)]
    text = "".join(TEXTS) * 200
    _check(library, ours, text)


@pytest.fixture(scope="module")
def user_model(tmp_path_factory):
    """A tiny BPE model with user-defined symbols, whitespace as suffix and nmt_nfkc, trained by the library."""
    folder = tmp_path_factory.mktemp("sp_normalize")
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(["the quick brown fox <tag> jumps ﬁx", "over the lazy dog x  y", "①②③ ＡＢＣ"] * 50), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(folder / "m"), model_type="bpe", vocab_size=60,
                                   user_defined_symbols=["<tag>", "ﬁx", "a b", "x  y", "e\u0301"], treat_whitespace_as_suffix=True,
                                   normalization_rule_name="nmt_nfkc", minloglevel=2)
    return (folder / "m.model").read_bytes()


def _model_pair(raw: bytes, dummy: bool, remove: bool, escape: bool, suffix: bool):
    proto = pb2.ModelProto()
    proto.ParseFromString(raw)
    proto.normalizer_spec.add_dummy_prefix = dummy
    proto.normalizer_spec.remove_extra_whitespaces = remove
    proto.normalizer_spec.escape_whitespaces = escape
    proto.trainer_spec.treat_whitespace_as_suffix = suffix
    data = proto.SerializeToString()
    model = parse_model(data)
    user = [piece.text for piece in model.pieces if piece.kind == 4]
    ours = SentencePieceNormalizer(model.normalizer, treat_whitespace_as_suffix=model.treat_whitespace_as_suffix, user_defined=user)
    return spm.SentencePieceProcessor(model_proto=data), ours


USER_TEXTS = TEXTS + ["<tag>", " <tag>  <tag> ", "ﬁx ﬁ", "a b", "a  b", "x  y", "x   y", "<ta<tag>g>", "e\u0301\u0323", "\x01<tag>\x01"]


@pytest.mark.parametrize("suffix", (True, False))
@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "dummy{}-remove{}-escape{}".format(*map(int, f)))
def test_sp_normalize_keeps_user_defined_symbols_and_honours_whitespace_as_suffix(user_model, flags, suffix):
    processor, ours = _model_pair(user_model, *flags, suffix)
    for text in USER_TEXTS:
        _check(processor, ours, text)


@pytest.mark.parametrize("suffix", (True, False))
def test_sp_normalize_fast_path_with_user_symbols_equals_library(user_model, suffix):
    """Without "x  y" (a symbol holding two spaces sends every text to the port) the fast path itself runs."""
    processor, ours = _model_pair(user_model, True, True, True, suffix)
    fast = SentencePieceNormalizer(ours.spec, treat_whitespace_as_suffix=suffix, user_defined=["<tag>", "ﬁx", "a b", "e\u0301"])
    assert fast._simple_spaces
    for text in USER_TEXTS:
        if "x  y" not in text and "x   y" not in text:
            assert fast.normalize(text) == processor.normalize(text), text


@pytest.mark.parametrize("blob", [b"", b"\x01\x00", struct.pack("<I", 100) + b"\x00" * 8, struct.pack("<I", 2) + b"\x00" * 8])
def test_sp_normalize_refuses_a_broken_charsmap_in_one_line(blob):
    if not blob:
        assert SentencePieceNormalizer(NormalizerSpec("identity", blob)).normalize(" a ") == "▁a"
        return
    with pytest.raises(GptlabError, match="precompiled_charsmap is broken"):
        SentencePieceNormalizer(NormalizerSpec("custom", blob))


# -- normalize_many: the charsmap applied to many texts in one pass ---------------------------------------------

# Neighbours that would form one charsmap key if the texts ran together ("A" + combining acute -> "Á", jamo + vowel).
BOUNDARY_TEXTS = ["A", "\u0301", "e", "\u0301\u0323", "\u1100", "\u1161", "க", "\u0bca", "", "x ", " y", "ﬁ", "\x07", "Hello world"]


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "dummy{}-remove{}-escape{}".format(*map(int, f)))
@pytest.mark.parametrize("rule", RULES)
def test_sp_normalize_many_equals_library_per_text_and_never_joins_neighbours(rule, flags):
    library, ours = PAIRS[rule, flags]
    for texts in (TEXTS, BOUNDARY_TEXTS, BOUNDARY_TEXTS[::-1], ["", ""], ["\u0301"], []):
        assert ours.normalize_many(texts) == [library.normalize(text) for text in texts], texts


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.text(alphabet=st.sampled_from("aA é\u0301\u0323\u1100\u1161\u11a8க\u0bca ﬁ①\t\x07\u3000日▁"), max_size=6), max_size=8),
       rule=st.sampled_from(RULES), flags=st.sampled_from(FLAGS))
def test_sp_normalize_many_equals_library_on_any_texts(texts, rule, flags):
    library, ours = PAIRS[rule, flags]
    assert ours.normalize_many(texts) == [library.normalize(text) for text in texts]


@pytest.mark.parametrize("suffix", (True, False))
def test_sp_normalize_many_keeps_user_defined_symbols_as_the_library(user_model, suffix):
    processor, ours = _model_pair(user_model, True, True, True, suffix)
    fast = SentencePieceNormalizer(ours.spec, treat_whitespace_as_suffix=suffix, user_defined=["<tag>", "ﬁx", "a b", "e\u0301"])
    texts = [text for text in USER_TEXTS if "x  y" not in text and "x   y" not in text] + ["<ta", "g>", "e", "\u0301"]
    assert fast.normalize_many(texts) == [processor.normalize(text) for text in texts]
    assert ours.normalize_many(USER_TEXTS) == [processor.normalize(text) for text in USER_TEXTS]  # "x  y": the port, per text
