"""Tokenizers that declare Unicode normalisation (NFC, NFKC, NFD, NFKD): gptlab's ids equal `tokenizers`' own on
a multilingual corpus and on random text, on every encode path, compiled and pure Python; refusals name the rest."""

import json
import sys
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import ByteLevelBPETokenizer, normalizers  # a dev extra: make test installs it

from gptlab.runtime import GptlabError
from gptlab.tokenizer import Tokenizer
from gptlab.tokenizer.native import pure_python
from gptlab.tokenizer.normalize import FORMS, form_of_sequence, normalize, normalizing_take, safe_cut
from gptlab.tokenizer.specials import SpecialMatcher
from gptlab.tokenizer.stream import stream_parts

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
EOT = "<|endoftext|>"
# Where normal forms differ: composed vs decomposed é, stacked accents out of order, full-width forms, ligatures,
# Korean as syllables and as jamo, Arabic presentation forms, half-width katakana, CJK compatibility ideographs,
# superscripts, fractions, the Angstrom and Ohm signs, and the Dives Akuru pair Python composes and `tokenizers` not.
CORPUS = [
    "café café cafe\u0301 CAFE\u0301 naïve nai\u0308ve Ångström \u212bngstro\u0308m 5\u2126",
    "a\u0323\u0307 a\u0307\u0323 q\u0307\u0323 e\u0301\u0301 \u1e9b\u0323 o\u0328\u0304",
    "\uff28\uff45\uff4c\uff4c\uff4f \uff37\uff4f\uff52\uff4c\uff44\uff01 \uff11\uff12\uff13 \u3000full width",
    "\ufb01nd the \ufb02ow \ufb00 o\ufb03ce \ufb06 \u2460\u2461 x\u00b2 \u00bd \u2153 \u33a1 \u2122",
    "한국어 \u1112\u1161\u11ab\u1100\u1173\u11af \u1100\u1161 \u110b\u1175 \ud55c\uae00",
    "العربية \ufefb \ufe8d\ufedf\ufecc\ufeae\ufe91\ufbfe\ufe94 ٤٠٠",
    "\uff76\uff80\uff76\uff85 \uff8a\uff9f\uff8a\uff9f \u30ab\u30bf\u30ab\u30ca \u30cf\u309a",
    "\uf900\uf901 \u2f800\u2f801 \ufa10 \u8c48\u66f4 漢字 吾輩は猫である",
    "\U00011935\U00011930 \U00011938 \u32ff \U0001fbf5 \u1e9b\u0323 \u0345\u0301",
]
FORM_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cn")), max_size=60)
MIXED_TEXT = st.lists(st.one_of(FORM_TEXT, st.sampled_from(CORPUS).map(lambda line: line[:20])), max_size=4).map("".join)
HF_NORMALIZERS = {
    "NFC": normalizers.NFC, "NFKC": normalizers.NFKC, "NFD": normalizers.NFD, "NFKD": normalizers.NFKD,
    "NFD+NFC": lambda: normalizers.Sequence([normalizers.NFD(), normalizers.NFC()]),
    "NFKD+NFC": lambda: normalizers.Sequence([normalizers.NFKD(), normalizers.NFC()]),
}
OUR_FORM = {"NFD+NFC": "NFC", "NFKD+NFC": "NFKC"}


def train_hf(tmp_path, normalizer):
    """A byte-level BPE tokenizer trained by `tokenizers` on the corpus, written to a file first, with `normalizer`."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS * 3), encoding="utf-8")
    theirs = ByteLevelBPETokenizer(add_prefix_space=False)
    theirs.normalizer = normalizer
    theirs.train([str(corpus)], vocab_size=600, min_frequency=1, special_tokens=[EOT], show_progress=False)
    theirs.save(str(tmp_path / "tokenizer.json"))
    return theirs


@pytest.fixture(scope="module", params=sorted(HF_NORMALIZERS))
def pair(request, tmp_path_factory):
    """(gptlab Tokenizer read from the file, the `tokenizers` Tokenizer, its form) for each declared normaliser."""
    folder = tmp_path_factory.mktemp(request.param.replace("+", "_"))
    theirs = train_hf(folder, HF_NORMALIZERS[request.param]())
    return Tokenizer.from_huggingface(folder), theirs, OUR_FORM.get(request.param, request.param)


def hf_ids(theirs, texts: list[str]) -> list[list[int]]:
    return [encoding.ids for encoding in theirs.encode_batch(texts)]


def test_from_huggingface_keeps_the_declared_normalizer(pair):
    ours, theirs, form = pair
    assert ours.normalizer == form
    assert json.loads(theirs.to_str())["normalizer"] is not None


def test_normalized_tokenizer_ids_equal_tokenizers_on_the_multilingual_corpus(pair):
    ours, theirs, _ = pair
    texts = [*CORPUS, "\n".join(CORPUS), f"{CORPUS[0]}{EOT}\u0301{CORPUS[1]}"]
    expected = hf_ids(theirs, texts)
    assert any(normalize(text, ours.normalizer) != text for text in texts)  # the corpus does need normalising
    assert [ours.encode(text, allowed_special="all") for text in texts] == expected
    assert [ours.encode_ordinary(text) for text in texts[:-1]] == expected[:-1]
    assert ours.encode_many(texts[:-1]) == expected[:-1]
    assert ours.encode_batch(texts[:-1], workers=1) == expected[:-1]
    packed, counts = ours.encode_ordinary_packed(texts[:-1])
    assert counts == [len(ids) for ids in expected[:-1]] and list(packed) == [i for ids in expected[:-1] for i in ids]
    assert list(ours.encode_iterable(texts[-1], allowed_special="all")) == expected[-1]


def test_normalized_tokenizer_pure_python_path_equals_compiled(pair):
    ours, theirs, _ = pair
    with pure_python():
        reference = Tokenizer(ours.vocab, ours.merges, ours.special_tokens, ours.pattern, normalizer=ours.normalizer)
        assert reference._fast() is None
        texts = list(CORPUS)
        assert [reference.encode_ordinary(text) for text in texts] == hf_ids(theirs, texts)
        assert reference.encode_many(texts) == hf_ids(theirs, texts)


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_streaming_normalises_across_chunk_boundaries_as_the_whole_text(pair, chunk):
    """Small buffers make every cut land mid-text: between a letter and its accent, inside a jamo syllable."""
    ours, theirs, form = pair
    text = f"{EOT}".join(CORPUS[:5]) + "e\u0301"
    chunks = [text[i:i + chunk] for i in range(0, len(text), chunk)]
    take = normalizing_take(ours._encode_text, form)
    parts = stream_parts(chunks, SpecialMatcher([EOT]), take, buffer_chars=16)
    ids = [i for part, special in parts for i in ([ours.special_tokens[part]] if special else part)]
    assert ids == theirs.encode(text).ids


@PROPERTY
@given(text=MIXED_TEXT)
def test_normalized_tokenizer_ids_equal_tokenizers_on_random_text(pair, text):
    """`tokenizers` always matches added tokens in text (Hypothesis draws this module's `EOT` literal too), so the
    reference is gptlab's encode with every special allowed; without one in the text, encode_ordinary agrees."""
    ours, theirs, _ = pair
    expected = theirs.encode(text).ids
    assert ours.encode(text, allowed_special="all") == expected
    if EOT not in normalize(text, ours.normalizer):
        assert ours.encode_ordinary(text) == expected


def test_normalized_tokenizer_decode_is_unchanged(pair):
    """Decoding does not undo normalisation: it gives the normalised text, as `tokenizers` does."""
    ours, theirs, form = pair
    for text in CORPUS:
        ids = ours.encode_ordinary(text)
        assert ours.decode(ids) == normalize(text, form) == theirs.decode(ids)


def test_normalized_tokenizer_saves_loads_and_fingerprints_with_its_normalizer(pair, tmp_path):
    ours, _, form = pair
    ours.save(tmp_path / "gptlab")
    saved = json.loads((tmp_path / "gptlab" / "tokenizer.json").read_text(encoding="utf-8"))
    assert (saved["version"], saved["normalizer"]) == (2, form)
    loaded = Tokenizer.load(tmp_path / "gptlab")
    assert loaded.normalizer == form and loaded.fingerprint() == ours.fingerprint()
    assert loaded.encode_ordinary(CORPUS[0]) == ours.encode_ordinary(CORPUS[0])
    plain = Tokenizer(ours.vocab, ours.merges, ours.special_tokens, ours.pattern)
    assert plain.fingerprint() != ours.fingerprint()
    plain.save(tmp_path / "plain")
    assert json.loads((tmp_path / "plain" / "tokenizer.json").read_text(encoding="utf-8"))["version"] == 1
    assert "normalizer" not in (tmp_path / "plain" / "tokenizer.json").read_text(encoding="utf-8")
    assert ours.to_huggingface().encode(CORPUS[2]).ids == ours.encode_ordinary(CORPUS[2])  # written back with it


def test_gptlab_file_with_an_unknown_normalizer_is_refused_in_one_line(pair, tmp_path):
    ours, _, _ = pair
    ours.save(tmp_path)
    path = tmp_path / "tokenizer.json"
    path.write_text(path.read_text(encoding="utf-8").replace(f'"normalizer": "{ours.normalizer}"', '"normalizer": "NFX"'), encoding="utf-8")
    with pytest.raises(GptlabError, match="normalizer 'NFX' is not one of NFC, NFKC, NFD, NFKD") as error:
        Tokenizer.load(tmp_path)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("normalizer, named", [
    (normalizers.Lowercase(), r"\(Lowercase\)"),
    (normalizers.Sequence([normalizers.Lowercase(), normalizers.Strip()]), r"Lowercase \+ Strip"),
    (normalizers.Sequence([normalizers.NFKC(), normalizers.Replace("a", "b")]), r"NFKC \+ Replace.*\(Replace would"),
])
def test_from_huggingface_refuses_a_normalizer_it_cannot_apply_exactly(tmp_path, normalizer, named):
    train_hf(tmp_path, normalizer)
    with pytest.raises(GptlabError, match=f"normalizes text first.*{named}") as error:
        Tokenizer.from_huggingface(tmp_path)
    assert "\n" not in str(error.value)


# ---------------------------------------------------------------- the normaliser itself against `tokenizers`


@pytest.mark.parametrize("form", FORMS)
def test_normalize_equals_tokenizers_on_every_code_point(form):
    """Every code point alone, and every combining mark after and before others: the table of characters the
    older Unicode tables of `tokenizers` do not know (UNKNOWN_TO_TOKENIZERS) is complete."""
    theirs = getattr(normalizers, form)()
    points = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c < 0xE000 and c != 0x0A]
    marks = [point for point in points if unicodedata.combining(point)]
    for texts in (points, ["\u0345" + mark for mark in marks], [mark + "\u0334" for mark in marks],
                  ["\U00011935\U00011930", "a\u0334\u0301", "\u1100\u1161\u11a8"]):
        expected = theirs.normalize_str("\n".join(texts)).split("\n")
        assert [normalize(text, form) for text in texts] == expected


@PROPERTY
@given(steps=st.lists(st.sampled_from(FORMS), max_size=4), text=MIXED_TEXT)
def test_a_sequence_of_forms_is_the_one_form_it_names(steps, text):
    theirs = normalizers.Sequence([getattr(normalizers, step)() for step in steps])
    assert normalize(text, form_of_sequence(steps)) == theirs.normalize_str(text)


@PROPERTY
@given(text=MIXED_TEXT, form=st.sampled_from(FORMS))
def test_normalizing_apart_at_safe_cut_equals_normalizing_whole(text, form):
    cut = safe_cut(text)
    assert cut == 0 or text[cut].isascii()
    assert normalize(text[:cut], form) + normalize(text[cut:], form) == normalize(text, form)


def test_no_composition_ends_in_an_ascii_character():
    """Why a cut before ASCII is safe: no canonical decomposition has an ASCII character after its first."""
    for code in range(sys.maxunicode + 1):
        parts = unicodedata.decomposition(chr(code)).split()
        if parts and not parts[0].startswith("<"):
            assert all(int(part, 16) > 0x7F for part in parts[1:]), hex(code)
