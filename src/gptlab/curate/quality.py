"""Gopher's heuristic quality rules (Rae et al. 2021, appendix A.1.1): word counts and shapes, then repetition.

    GopherFilter      drops a document with too few or too many words, odd mean word length, many lines ending in
                      an ellipsis, or few words holding a letter (the subset the CS336 data assignment states)
    RepetitionFilter  drops a document whose lines, paragraphs or word n-grams repeat (Gopher table A1)

Both split words on whitespace (`str.split`), where Gopher ran a tokeniser: punctuation stays attached to its word
("end." is one word of 4 characters), and text written without spaces (Chinese, Japanese, Thai) reads as few, very
long words, so these rules suit space-separated languages only. Each filter's first failing rule is its drop reason.
Not here: model-based quality scores (gptlab.curate.classifier), language ID, PII, deduplication across documents.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, fields

from gptlab.curate.document import Document, Filter
from gptlab.runtime import GptlabError

ELLIPSES = ("...", "\u2026")  # three full stops, or the single character "…"


def _percent(fraction: float) -> str:
    return f"{fraction * 100:g}%"  # 0.3 -> "30%", 0.155 -> "15.5%": a reason names its threshold as set


def _check_fraction(config: object, name: str) -> None:
    value = getattr(config, name)
    if not 0.0 <= value <= 1.0:
        raise GptlabError(f"{type(config).__name__}.{name}={value!r} is not a fraction: give a value from 0 to 1")


@dataclass(frozen=True, kw_only=True)
class GopherConfig:
    """Gopher's thresholds. A document exactly at a threshold is kept: only beyond it is a document dropped."""

    min_words: int = 50  # fewer words: dropped (exactly 50 kept)
    max_words: int = 100_000  # more words: dropped (exactly 100,000 kept)
    min_mean_word_length: float = 3.0  # characters per word, below: dropped
    max_mean_word_length: float = 10.0  # above: dropped
    max_ellipsis_lines: float = 0.3  # fraction of non-blank lines ending in "..." or "…", above: dropped
    min_alpha_words: float = 0.8  # fraction of words with a character where str.isalpha() holds, below: dropped

    def __post_init__(self) -> None:
        if self.min_words < 0:
            raise GptlabError(f"GopherConfig.min_words={self.min_words} is negative: give 0 or more")
        if self.max_words < self.min_words:
            raise GptlabError(f"GopherConfig.max_words={self.max_words} is below min_words={self.min_words}: raise max_words")
        if self.min_mean_word_length < 0:
            raise GptlabError(f"GopherConfig.min_mean_word_length={self.min_mean_word_length} is negative: give 0 or more")
        if self.max_mean_word_length < self.min_mean_word_length:
            raise GptlabError(f"GopherConfig.max_mean_word_length={self.max_mean_word_length} is below "
                              f"min_mean_word_length={self.min_mean_word_length}: raise max_mean_word_length")
        _check_fraction(self, "max_ellipsis_lines")
        _check_fraction(self, "min_alpha_words")


class GopherFilter(Filter):
    """Gopher's document rules, in the paper's order; the first one broken names the drop.

    Worked example: "Buy now..." is 2 words, so with the defaults it is dropped as "gopher: fewer than 50 words".
    Blank lines do not count as lines for the ellipsis rule, so spacing between paragraphs does not dilute it.
    """

    name = "gopher"

    def __init__(self, config: GopherConfig | None = None) -> None:
        super().__init__()
        self.config = config or GopherConfig()

    def reject(self, document: Document) -> str | None:
        config = self.config
        words = document.text.split()
        if len(words) < config.min_words:
            return f"gopher: fewer than {config.min_words:,} words"
        if len(words) > config.max_words:
            return f"gopher: more than {config.max_words:,} words"
        if words:
            mean_length = sum(len(word) for word in words) / len(words)
            if mean_length < config.min_mean_word_length:
                return f"gopher: mean word length below {config.min_mean_word_length:g}"
            if mean_length > config.max_mean_word_length:
                return f"gopher: mean word length above {config.max_mean_word_length:g}"
        lines = [line.rstrip() for line in document.text.splitlines() if line.strip()]
        if lines and sum(line.endswith(ELLIPSES) for line in lines) / len(lines) > config.max_ellipsis_lines:
            return f"gopher: more than {_percent(config.max_ellipsis_lines)} of lines end in an ellipsis"
        if words and sum(any(character.isalpha() for character in word) for word in words) / len(words) < config.min_alpha_words:
            return f"gopher: fewer than {_percent(config.min_alpha_words)} of words have a letter"
        return None


TOP_NGRAM_SIZES = (2, 3, 4)  # Gopher: the most common n-gram, for these n
DUPLICATE_NGRAM_SIZES = (5, 6, 7, 8, 9, 10)  # Gopher: all duplicated n-grams, for these n


@dataclass(frozen=True, kw_only=True)
class RepetitionConfig:
    """Gopher's repetition thresholds (Rae et al. 2021, table A1); a fraction above its threshold drops the document.

    A threshold of 1.0 switches its rule off (no fraction exceeds 1).
    """

    max_duplicate_lines: float = 0.30  # fraction of non-blank lines that repeat an earlier line
    max_duplicate_line_characters: float = 0.20  # fraction of line characters in those repeats
    max_duplicate_paragraphs: float = 0.30  # the same for paragraphs (text between blank lines)
    max_duplicate_paragraph_characters: float = 0.20
    max_top_ngram_characters: tuple[float, ...] = (0.20, 0.18, 0.16)  # for n = 2, 3, 4 (TOP_NGRAM_SIZES)
    max_duplicate_ngram_characters: tuple[float, ...] = (0.15, 0.14, 0.13, 0.12, 0.11, 0.10)  # n = 5..10

    def __post_init__(self) -> None:
        for name, sizes in (("max_top_ngram_characters", TOP_NGRAM_SIZES), ("max_duplicate_ngram_characters", DUPLICATE_NGRAM_SIZES)):
            values = tuple(getattr(self, name))  # a list read back from JSON becomes the tuple again
            object.__setattr__(self, name, values)
            if len(values) != len(sizes):
                raise GptlabError(f"RepetitionConfig.{name} has {len(values)} values: give {len(sizes)}, "
                                  f"one per n in {sizes}")
            for n, value in zip(sizes, values):
                if not 0.0 <= value <= 1.0:
                    raise GptlabError(f"RepetitionConfig.{name} for n={n} is {value!r}: give a fraction from 0 to 1")
        for field in fields(self):
            if not field.name.endswith("ngram_characters"):
                _check_fraction(self, field.name)


def duplicate_fractions(items: list[str]) -> tuple[float, float]:
    """(fraction of items that repeat an earlier item, fraction of all items' characters in those repeats).

    The first occurrence is not a duplicate: ["a", "bb", "a"] -> (1/3, 1/4), the share a reader would skip.
    """
    seen: set[str] = set()
    duplicates = duplicate_characters = 0
    for item in items:
        if item in seen:
            duplicates += 1
            duplicate_characters += len(item)
        else:
            seen.add(item)
    total_characters = sum(len(item) for item in items)
    return (duplicates / len(items) if items else 0.0,
            duplicate_characters / total_characters if total_characters else 0.0)


def _prefix_lengths(words: list[str]) -> list[int]:
    """prefix[i] = characters in words[:i], so a run of words' characters is one subtraction."""
    prefix = [0]
    for word in words:
        prefix.append(prefix[-1] + len(word))
    return prefix


def _ngrams(words: list[str], n: int):
    return zip(*(words[offset:] for offset in range(n)))


def _covered_characters(starts: list[int], n: int, prefix: list[int]) -> int:
    """Characters of the words under n-grams starting at `starts` (ascending), each word counted once."""
    covered = until = 0
    for start in starts:
        begin = max(start, until)
        until = start + n
        covered += prefix[until] - prefix[begin]
    return covered


def top_ngram_character_fraction(words: list[str], n: int) -> float:
    """Fraction of word characters inside the occurrences of the most common n-gram (0 if none occurs twice).

    Characters are those of the words (whitespace not counted), each counted once where occurrences overlap;
    among equally common n-grams the one covering the most characters counts.
    Worked example, n=2: "a b a b c" -> "a b" twice covers words 0, 1, 2, 3: 4 of 5 characters, 0.8.
    """
    prefix = _prefix_lengths(words)
    if not prefix[-1]:
        return 0.0
    counts = Counter(_ngrams(words, n))
    top = max(counts.values(), default=0)
    if top < 2:
        return 0.0
    starts: dict[tuple, list[int]] = {gram: [] for gram, count in counts.items() if count == top}
    for start, gram in enumerate(_ngrams(words, n)):
        if gram in starts:
            starts[gram].append(start)
    return max(_covered_characters(positions, n, prefix) for positions in starts.values()) / prefix[-1]


def duplicate_ngram_character_fraction(words: list[str], n: int) -> float:
    """Fraction of word characters inside n-grams that repeat an earlier n-gram, each character counted once.

    As with lines, the first occurrence is not a duplicate. Worked example, n=2: "a b a b" -> the 2-gram at
    position 2 repeats the one at 0: words 2, 3 covered, 2 of 4 characters, 0.5.
    """
    prefix = _prefix_lengths(words)
    if not prefix[-1]:
        return 0.0
    seen: set[tuple] = set()
    repeats = []
    for start, gram in enumerate(_ngrams(words, n)):
        if gram in seen:
            repeats.append(start)
        else:
            seen.add(gram)
    return _covered_characters(repeats, n, prefix) / prefix[-1]


def split_paragraphs(text: str) -> list[str]:
    """Paragraphs: the text between blank lines, stripped; blank ones left out."""
    return [paragraph.strip() for paragraph in re.split(r"\n\s*\n", text.replace("\r\n", "\n")) if paragraph.strip()]


class RepetitionFilter(Filter):
    """Gopher's repetition rules: lines, then paragraphs, then the most common n-grams, then duplicated n-grams.

    Lines and paragraphs are compared after stripping surrounding whitespace, blank ones left out; n-grams are
    over whitespace-split words, as written (no lower-casing), with characters counted from the words only.
    """

    name = "repetition"

    def __init__(self, config: RepetitionConfig | None = None) -> None:
        super().__init__()
        self.config = config or RepetitionConfig()

    def reject(self, document: Document) -> str | None:
        config = self.config
        lines = [line.strip() for line in document.text.splitlines() if line.strip()]
        reason = self._check_items("lines", duplicate_fractions(lines), config.max_duplicate_lines,
                                   config.max_duplicate_line_characters)
        if reason:
            return reason
        reason = self._check_items("paragraphs", duplicate_fractions(split_paragraphs(document.text)),
                                   config.max_duplicate_paragraphs, config.max_duplicate_paragraph_characters)
        if reason:
            return reason
        words = document.text.split()
        for n, threshold in zip(TOP_NGRAM_SIZES, config.max_top_ngram_characters):
            if threshold < 1.0 and top_ngram_character_fraction(words, n) > threshold:
                return f"repetition: most common {n}-gram above {_percent(threshold)} of characters"
        for n, threshold in zip(DUPLICATE_NGRAM_SIZES, config.max_duplicate_ngram_characters):
            if threshold < 1.0 and duplicate_ngram_character_fraction(words, n) > threshold:
                return f"repetition: duplicate {n}-grams above {_percent(threshold)} of characters"
        return None

    @staticmethod
    def _check_items(kind: str, fractions: tuple[float, float], max_items: float, max_characters: float) -> str | None:
        items, characters = fractions
        if items > max_items:
            return f"repetition: duplicate {kind} above {_percent(max_items)}"
        if characters > max_characters:
            return f"repetition: characters in duplicate {kind} above {_percent(max_characters)}"
        return None
