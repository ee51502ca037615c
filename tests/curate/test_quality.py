"""Gopher's rules at each threshold's edge, and the repetition measures against brute-force counts."""

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gptlab.curate.document import Document
from gptlab.curate.quality import (
    DUPLICATE_NGRAM_SIZES,
    TOP_NGRAM_SIZES,
    GopherConfig,
    GopherFilter,
    RepetitionConfig,
    RepetitionFilter,
    duplicate_fractions,
    duplicate_ngram_character_fraction,
    top_ngram_character_fraction,
)
from gptlab.runtime import GptlabError


def gopher(text: str, **overrides) -> str | None:
    return GopherFilter(GopherConfig(**overrides)).reject(Document(id="doc", text=text))


def unique_words(count: int, length: int = 1) -> list[str]:
    """`count` distinct words of `length` characters each (CJK letters, so none repeats and each is alphabetic)."""
    return [chr(0x4E00 + index) * length for index in range(count)]


# Gopher: each rule exactly at its threshold keeps the document; one step beyond drops it.

def test_gopher_keeps_exactly_min_words_and_drops_one_fewer():
    assert gopher(" ".join(["word"] * 50)) is None
    assert gopher(" ".join(["word"] * 49)) == "gopher: fewer than 50 words"


def test_gopher_keeps_exactly_max_words_and_drops_one_more():
    assert gopher("word " * 100_000) is None
    assert gopher("word " * 100_001) == "gopher: more than 100,000 words"


def test_gopher_keeps_mean_word_length_exactly_at_both_edges():
    assert gopher(" ".join(["abc"] * 50)) is None  # mean 3
    assert gopher(" ".join(["abc"] * 49 + ["ab"])) == "gopher: mean word length below 3"  # 149 / 50
    assert gopher(" ".join(["abcdefghij"] * 50)) is None  # mean 10
    assert gopher(" ".join(["abcdefghij"] * 49 + ["abcdefghijk"])) == "gopher: mean word length above 10"


def test_gopher_keeps_30_percent_ellipsis_lines_and_drops_above():
    line = " ".join(["word"] * 10)
    kept = [line + "..."] * 3 + [line] * 7  # 3 of 10 lines
    assert gopher("\n".join(kept)) is None
    dropped = [line + "\u2026"] * 31 + [line] * 69  # 31 of 100, with the single-character ellipsis
    assert gopher("\n".join(dropped)) == "gopher: more than 30% of lines end in an ellipsis"


def test_gopher_ellipsis_rule_ignores_blank_lines():
    line = " ".join(["word"] * 10)
    text = "\n\n".join([line + "..."] * 4 + [line] * 6)  # 4 of 10 lines of text, 4 of 19 lines with the blank ones
    assert gopher(text) == "gopher: more than 30% of lines end in an ellipsis"


def test_gopher_keeps_80_percent_alphabetic_words_and_drops_below():
    assert gopher(" ".join(["word"] * 40 + ["1234"] * 10)) is None  # 40 of 50
    assert gopher(" ".join(["word"] * 39 + ["1234"] * 11)) == "gopher: fewer than 80% of words have a letter"


def test_gopher_counts_a_word_alphabetic_when_any_character_is_a_letter():
    words = ["x1234"] * 20 + ["\u00e9t\u00e9"] * 20 + ["\u0436\u0443\u043a"] * 10  # mixed, accented, Cyrillic
    assert gopher(" ".join(words)) is None


def test_gopher_reports_the_first_rule_broken():
    text = " ".join(["1..."] * 10)  # too few words, one line ending in an ellipsis, no letters
    assert gopher(text) == "gopher: fewer than 50 words"
    assert gopher(text, min_words=5) == "gopher: more than 30% of lines end in an ellipsis"
    assert gopher(text, min_words=5, max_ellipsis_lines=1.0) == "gopher: fewer than 80% of words have a letter"


@pytest.mark.parametrize("field, value", [("min_words", -1), ("max_ellipsis_lines", 1.5), ("min_alpha_words", -0.1),
                                          ("max_mean_word_length", 2.0)])
def test_gopher_config_names_the_bad_field(field, value):
    with pytest.raises(GptlabError, match=field):
        GopherConfig(**{field: value})


def test_gopher_filter_counts_drops_by_reason():
    stage = GopherFilter()
    documents = [Document(id="short", text="too short"), Document(id="good", text=" ".join(["word"] * 60))]
    assert [document.id for document in stage.run(documents)] == ["good"]
    assert stage.stats.reasons == {"gopher: fewer than 50 words": 1}
    assert stage.stats.examples["gopher: fewer than 50 words"][0]["id"] == "short"


# Repetition: the measures against brute-force counts, then each rule at its edge.

def brute_top_ngram(words: list[str], n: int) -> float:
    """The most common n-gram by counting every distinct one by comparison; ties: the one covering most characters."""
    grams = [tuple(words[start:start + n]) for start in range(len(words) - n + 1)]
    total = sum(len(word) for word in words)
    best_count, best_covered = 0, 0
    for gram in set(grams):
        count = sum(other == gram for other in grams)
        covered = {start + offset for start, other in enumerate(grams) if other == gram for offset in range(n)}
        characters = sum(len(words[position]) for position in covered)
        if (count, characters) > (best_count, best_covered):
            best_count, best_covered = count, characters
    return best_covered / total if best_count >= 2 and total else 0.0


def brute_duplicate_ngrams(words: list[str], n: int) -> float:
    """Words under any n-gram equal to one that starts earlier, each word counted once."""
    covered = set()
    for start in range(len(words) - n + 1):
        if any(words[earlier:earlier + n] == words[start:start + n] for earlier in range(start)):
            covered.update(range(start, start + n))
    total = sum(len(word) for word in words)
    return sum(len(words[position]) for position in covered) / total if total else 0.0


word_lists = st.lists(st.sampled_from(["a", "bb", "ccc", "a.", "Bb"]), max_size=40)


@settings(max_examples=150, deadline=None)
@given(words=word_lists, n=st.integers(min_value=2, max_value=10))
def test_ngram_measures_equal_brute_force_counts(words, n):
    assert top_ngram_character_fraction(words, n) == pytest.approx(brute_top_ngram(words, n), abs=1e-12)
    assert duplicate_ngram_character_fraction(words, n) == pytest.approx(brute_duplicate_ngrams(words, n), abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(items=st.lists(st.sampled_from(["x", "yy", "zzz", "w w"]), max_size=20))
def test_duplicate_fractions_equal_brute_force_counts(items):
    repeats = [index for index, item in enumerate(items) if item in items[:index]]
    total = sum(len(item) for item in items)
    expected = (len(repeats) / len(items) if items else 0.0,
                sum(len(items[index]) for index in repeats) / total if total else 0.0)
    assert duplicate_fractions(items) == pytest.approx(expected)


def test_ngram_measures_match_their_worked_examples():
    assert top_ngram_character_fraction("a b a b c".split(), 2) == pytest.approx(4 / 5)
    assert duplicate_ngram_character_fraction("a b a b".split(), 2) == pytest.approx(2 / 4)
    assert top_ngram_character_fraction("a b c d".split(), 2) == 0.0  # no n-gram occurs twice
    assert duplicate_fractions(["a", "bb", "a"]) == pytest.approx((1 / 3, 1 / 4))


OFF = {"max_duplicate_lines": 1.0, "max_duplicate_line_characters": 1.0, "max_duplicate_paragraphs": 1.0,
       "max_duplicate_paragraph_characters": 1.0, "max_top_ngram_characters": (1.0,) * 3,
       "max_duplicate_ngram_characters": (1.0,) * 6}


def repetition(text: str, **only) -> str | None:
    """The repetition filter with every rule off but `only`'s."""
    return RepetitionFilter(RepetitionConfig(**{**OFF, **only})).reject(Document(id="doc", text=text))


def test_repetition_keeps_30_percent_duplicate_lines_and_drops_above():
    unique = [f"line {index}" for index in range(7)]
    assert repetition("\n".join(unique + unique[:3]), max_duplicate_lines=0.3) is None  # 3 of 10
    unique = unique[:6]
    assert repetition("\n".join(unique + unique[:4]), max_duplicate_lines=0.3) == "repetition: duplicate lines above 30%"


def test_repetition_keeps_20_percent_duplicate_line_characters_and_drops_above():
    kept = "\n".join(["a" * 20, "b" * 60, "a" * 20])  # 20 of 100 characters repeat
    assert repetition(kept, max_duplicate_line_characters=0.2) is None
    dropped = "\n".join(["a" * 20, "b" * 59, "a" * 20])  # 20 of 99
    assert repetition(dropped, max_duplicate_line_characters=0.2) == "repetition: characters in duplicate lines above 20%"


def test_repetition_paragraph_rules_at_their_edges():
    paragraphs = [f"paragraph {index}\nsecond line" for index in range(7)]
    assert repetition("\n\n".join(paragraphs + paragraphs[:3]), max_duplicate_paragraphs=0.3) is None
    assert (repetition("\n\n".join(paragraphs[:6] + paragraphs[:4]), max_duplicate_paragraphs=0.3)
            == "repetition: duplicate paragraphs above 30%")
    kept = "\n\n \n".join(["a" * 20, "b" * 60, "a" * 20])  # a whitespace-only line still separates paragraphs
    assert repetition(kept, max_duplicate_paragraph_characters=0.2) is None
    dropped = "\n\n".join(["a" * 20, "b" * 59, "a" * 20])
    assert (repetition(dropped, max_duplicate_paragraph_characters=0.2)
            == "repetition: characters in duplicate paragraphs above 20%")


def repeated_ngram_words(n: int, threshold: float, covered_occurrences: int, extra_characters: int) -> list[str]:
    """Words holding one n-gram twice, sized so its measured characters are exactly `threshold` of the total,
    plus `extra_characters` (negative: fewer filler characters, so the fraction rises just above)."""
    fraction = Fraction(str(threshold))
    length = fraction.numerator  # so covered characters divide by the threshold exactly
    gram = [letter * length for letter in "abcdefghij"[:n]]
    covered = covered_occurrences * n * length
    fillers = unique_words(int(covered / fraction) - 2 * n * length + extra_characters)
    half = len(fillers) // 2
    return gram + fillers[:half] + gram + fillers[half:]


NGRAM_RULES = [  # (config field, sizes, measure, occurrences the repeat covers, the drop reason's words)
    ("max_top_ngram_characters", TOP_NGRAM_SIZES, top_ngram_character_fraction, 2, "most common {n}-gram"),
    ("max_duplicate_ngram_characters", DUPLICATE_NGRAM_SIZES, duplicate_ngram_character_fraction, 1, "duplicate {n}-grams"),
]


@pytest.mark.parametrize(("field", "index", "n", "measure", "covered", "reason"),
                         [(field, index, n, measure, covered, reason) for field, sizes, measure, covered, reason in NGRAM_RULES
                          for index, n in enumerate(sizes)])
def test_repetition_ngram_rules_at_their_edge(field, index, n, measure, covered, reason):
    thresholds = getattr(RepetitionConfig(), field)
    only = [1.0] * len(thresholds)
    only[index] = thresholds[index]
    kept = repeated_ngram_words(n, thresholds[index], covered_occurrences=covered, extra_characters=0)
    assert measure(kept, n) == thresholds[index]
    assert repetition(" ".join(kept), **{field: tuple(only)}) is None
    dropped = " ".join(repeated_ngram_words(n, thresholds[index], covered_occurrences=covered, extra_characters=-1))
    assert repetition(dropped, **{field: tuple(only)}) == f"repetition: {reason.format(n=n)} above {thresholds[index] * 100:g}% of characters"


def test_repetition_keeps_ordinary_prose_with_the_default_thresholds():
    text = ("The committee met on Tuesday to review the proposal. Several members raised concerns about the cost, "
            "while others argued that the long-term savings would justify it.\n\nAfter a lengthy debate, the vote "
            "was postponed until more figures could be gathered from the finance office.")
    assert RepetitionFilter().reject(Document(id="prose", text=text)) is None


def test_repetition_drops_a_page_of_repeated_navigation():
    text = "\n".join(["Home | About | Contact | Login"] * 5 + ["Welcome to the site of the local choir."])
    assert RepetitionFilter().reject(Document(id="nav", text=text)) == "repetition: duplicate lines above 30%"


def test_repetition_config_accepts_lists_and_names_a_bad_value():
    config = RepetitionConfig(max_top_ngram_characters=[0.2, 0.18, 0.16])  # as read back from JSON
    assert config.max_top_ngram_characters == (0.2, 0.18, 0.16)
    with pytest.raises(GptlabError, match="max_duplicate_ngram_characters has 2 values"):
        RepetitionConfig(max_duplicate_ngram_characters=(0.1, 0.1))
    with pytest.raises(GptlabError, match="max_duplicate_lines"):
        RepetitionConfig(max_duplicate_lines=2.0)
