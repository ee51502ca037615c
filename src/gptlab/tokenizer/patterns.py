"""Pre-tokenization: the split patterns, and splitting text into pieces.

BPE never merges across a piece boundary. A piece is one regex match; text the
pattern does not match becomes a piece of its own, so nothing is ever dropped
(the built-in patterns match every character anyway).

    >>> split("Hello world!!", compile_pattern("gpt2"))
    ['Hello', ' world', '!!']

Not here: special tokens (gptlab.tokenizer.specials), BPE (gptlab.tokenizer.core; the C scanners for the built-in patterns are in _native/fastbpe.c).
"""

from __future__ import annotations

import regex

from gptlab.runtime import GptlabError

# tiktoken's r50k/gpt2 pattern (same splits as GPT-2's original encoder.py).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
# tiktoken's cl100k_base (GPT-4) pattern: case-insensitive contractions, digits in groups of 3.
GPT4_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
# tiktoken's o200k_base (GPT-4o) pattern: splits camel case, no leading space on punctuation runs.
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

PATTERNS: dict[str, str] = {"gpt2": GPT2_PATTERN, "gpt4": GPT4_PATTERN, "cl100k": GPT4_PATTERN, "o200k": O200K_PATTERN}
NO_SPLIT = "none"


class SplitRegex(str):
    """Text that is a split regex, never a pattern name: what `resolve_pattern` returns, and how to pass
    a regex that happens to look like a name (`SplitRegex("abc")` splits on the text "abc")."""

    __slots__ = ()


NAME_LIKE = regex.compile(r"[A-Za-z0-9_-]+")  # "gpt9", "cl100k_base": meant as names, not regexes


def resolve_pattern(pattern: str | None) -> SplitRegex | None:
    """Map a pattern name (gpt2, gpt4, cl100k, o200k, none) or a regex to its checked regex text.

    Returns None for "no pre-split" (each text between special tokens is one piece). A string
    made only of letters, digits, `_` and `-` is taken as a name, so a typo such as "gpt9" is an
    error rather than a regex that splits on the text "gpt9".
    """
    if pattern is None:
        return None
    if not isinstance(pattern, str):
        raise GptlabError(f"pattern must be a name or a regex string, got {pattern!r}")
    if not isinstance(pattern, SplitRegex):
        if pattern == NO_SPLIT:
            return None
        if pattern in PATTERNS:
            return SplitRegex(PATTERNS[pattern])
        if NAME_LIKE.fullmatch(pattern):
            names = ", ".join([*PATTERNS, NO_SPLIT])
            raise GptlabError(
                f"unknown split pattern {pattern!r}: use one of {names}, or a regex (wrap it as SplitRegex({pattern!r}) "
                f"to split on that literal text; CLI: --regex REGEX)"
            )
    return SplitRegex(check_regex(pattern))


def check_regex(text: str) -> str:
    """`text` if the `regex` module compiles it, else a GptlabError naming it."""
    if not text:
        raise GptlabError("the split regex is empty; use the pattern name 'none' for no pre-split")
    try:
        regex.compile(text)
    except regex.error as error:
        raise GptlabError(f"split regex {str(text)!r} does not compile: {error}") from None
    return str(text)


def oniguruma_form(regex_text: str) -> str:
    """The pattern as Hugging Face `tokenizers` (Oniguruma) must be given it.

    Oniguruma reads `{1,3}+` as "one or more runs of 1-3", not as a possessive {1,3}; plain `{1,3}`
    matches what the possessive form does in GPT-4's pattern (nothing after it could backtrack into it).
    """
    return regex_text.replace(r"\p{N}{1,3}+", r"\p{N}{1,3}")


def from_oniguruma_form(text: str) -> str:
    """A built-in pattern back from its Oniguruma form, so an export and re-import keeps the fingerprint; other text as is."""
    for known in PATTERNS.values():
        if oniguruma_form(known) == text:
            return known
    return text


def pattern_name(regex_text: str | None) -> str:
    """The short name of a known pattern, for messages ("gpt4"), else "custom"."""
    if regex_text is None:
        return NO_SPLIT
    for name, text in PATTERNS.items():
        if text == regex_text:
            return name
    return "custom"


def compile_pattern(pattern: str | None) -> regex.Pattern | None:
    regex_text = resolve_pattern(pattern)
    return None if regex_text is None else regex.compile(regex_text)


def split(text: str, compiled: regex.Pattern | None) -> list[str]:
    """Split `text` into pieces; the pieces always join back to `text`."""
    if compiled is None:
        return [text] if text else []
    pieces = compiled.findall(text)
    if sum(map(len, pieces)) == len(text):
        return pieces
    # The pattern skipped some characters: keep them as pieces of their own.
    pieces, position = [], 0
    for match in compiled.finditer(text):
        if match.start() > position:
            pieces.append(text[position : match.start()])
        if match.end() > match.start():
            pieces.append(match.group())
        position = match.end()
    if position < len(text):
        pieces.append(text[position:])
    return pieces


# A piece ending this close to the end of a buffer may change once more text
# arrives (a run of letters or spaces may go on), so it is held back. The
# built-in patterns look at most one character past a match.
STREAM_MARGIN = 64


def split_stable(text: str, compiled: regex.Pattern | None, final: bool) -> tuple[list[str], int]:
    """Split a buffer whose text may continue: return (final pieces, characters they cover).

    Pieces ending within STREAM_MARGIN of the end are held back and must be
    re-split together with the text that follows, so streaming gives exactly
    the pieces of the whole text.
    """
    if final:
        return split(text, compiled), len(text)
    if compiled is None:
        return [], 0
    pieces = split(text, compiled)
    limit, end, kept = len(text) - STREAM_MARGIN, 0, 0
    for piece in pieces:
        if end + len(piece) > limit:
            break
        end += len(piece)
        kept += 1
    return pieces[:kept], end
