"""Unicode normalisation before pre-tokenisation, applied exactly as Hugging Face `tokenizers` applies it.

A tokenizer.json may declare `"normalizer": {"type": "NFC"}` (Qwen2's does), NFKC, NFD, NFKD, or a Sequence of
them. `tokenizers` normalises the text between special tokens, then splits and merges what results; so does
gptlab's Tokenizer when its `normalizer` is set. A Sequence of forms is one form: NFC(NFKD(s)) == NFKC(s), and in
general the result is compatibility-decomposed if any step is, and composed or not as the last step leaves it:

    [NFD, NFC] -> "NFC"     [NFKD, NFC] -> "NFKC"     [NFC, NFKD] -> "NFKD"     [] -> None (no normaliser)

Python's unicodedata (Unicode 14.0 in Python 3.11) is newer than the tables `tokenizers` normalises with. Unicode
promises that a character's normal form never changes once it is assigned, so the two differ only at characters
the older tables do not know: there `tokenizers` sees a plain starter (no decomposition, combining class 0,
composing with nothing). UNKNOWN_TO_TOKENIZERS lists those whose normalisation Python would change (found by
comparing every code point with `tokenizers`, tests/tokenizer/test_hf_normalizer.py); `normalize` passes them
through untouched and normalises the text between them, which is what the older tables compute.

Normalising a text in parts gives the same result as normalising it whole when every cut falls before an ASCII
character: ASCII is its own normal form in every form, has combining class 0 and is never the second half of a
composition, so nothing before the cut changes with what follows. `safe_cut` finds such a cut for streaming.

Not here: which tokenizer.json settings are read (gptlab.tokenizer.huggingface), encoding (gptlab.tokenizer.core).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from functools import lru_cache

import regex

from gptlab.runtime import GptlabError

FORMS = ("NFC", "NFKC", "NFD", "NFKD")
# (first, last) code points Python 3.11 normalises and `tokenizers` leaves alone (see the module docstring).
UNKNOWN_TO_TOKENIZERS = (
    (0x07FD, 0x07FD), (0x0898, 0x089F), (0x08CA, 0x08D3), (0x09FE, 0x09FE), (0x0C3C, 0x0C3C), (0x0D3B, 0x0D3C),
    (0x0EBA, 0x0EBA), (0x1715, 0x1715), (0x1ABF, 0x1ACE), (0x1DF6, 0x1DFA), (0x32FF, 0x32FF), (0xA7F2, 0xA7F4),
    (0xA82C, 0xA82C), (0xAB69, 0xAB69), (0x10781, 0x10785), (0x10787, 0x107B0), (0x107B2, 0x107BA), (0x10D24, 0x10D27),
    (0x10EAB, 0x10EAC), (0x10F46, 0x10F50), (0x10F82, 0x10F85), (0x11070, 0x11070), (0x1133B, 0x1133B),
    (0x1145E, 0x1145E), (0x11839, 0x1183A), (0x11930, 0x11930), (0x11935, 0x11935), (0x11938, 0x11938),
    (0x1193D, 0x1193E), (0x11943, 0x11943), (0x119E0, 0x119E0), (0x11A34, 0x11A34), (0x11A47, 0x11A47),
    (0x11A99, 0x11A99), (0x11D42, 0x11D42), (0x11D44, 0x11D45), (0x11D97, 0x11D97), (0x16FF0, 0x16FF1),
    (0x1E130, 0x1E136), (0x1E2AE, 0x1E2AE), (0x1E2EC, 0x1E2EF), (0x1F16C, 0x1F16C), (0x1FBF0, 0x1FBF9),
)
TAIL_AFTER_LAST_ASCII = regex.compile(r"[\x00-\x7f][^\x00-\x7f]*\Z")


@lru_cache(maxsize=1)
def _unknown() -> regex.Pattern:
    ranges = "".join(f"\\U{first:08x}-\\U{last:08x}" for first, last in UNKNOWN_TO_TOKENIZERS)
    return regex.compile(f"([{ranges}])")


def check_form(form: str | None) -> str | None:
    if form is not None and form not in FORMS:
        raise GptlabError(f"unknown normalizer {form!r}; gptlab applies {', '.join(FORMS)} (or None: no normalisation)")
    return form


def normalize(text: str, form: str | None) -> str:
    """`text` in Unicode normal form `form` as `tokenizers` computes it; None leaves it as it is."""
    if form is None or text.isascii():  # ASCII is its own normal form: the common case costs one check
        return text
    unknown = _unknown()
    if unknown.search(text) is None:
        return unicodedata.normalize(form, text)
    parts = unknown.split(text)  # [text, unknown char, text, ...]: the unknown characters stay as they are
    return "".join(part if index % 2 else unicodedata.normalize(form, part) for index, part in enumerate(parts))


def safe_cut(text: str) -> int:
    """The last position before an ASCII character (0 if there is none): normalising text[:cut] and
    text[cut:] apart gives normalize(text). "abc é" -> 3 (before the space); "ééé" -> 0."""
    found = TAIL_AFTER_LAST_ASCII.search(text)
    return 0 if found is None else found.start()


def form_of_sequence(forms: list[str]) -> str | None:
    """The one form a Sequence of Unicode forms applies (module docstring); None for an empty Sequence."""
    if not forms:
        return None
    compatibility = any(form.startswith("NFK") for form in forms)
    composed = forms[-1] in ("NFC", "NFKC")
    return {(False, True): "NFC", (True, True): "NFKC", (False, False): "NFD", (True, False): "NFKD"}[compatibility, composed]


def form_from_huggingface(spec, refuse: Callable[[str], Exception]) -> str | None:
    """The form of a tokenizer.json "normalizer" entry; anything else raises refuse(reason) naming it."""
    if spec is None:
        return None
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind in FORMS:
        return kind
    if kind == "Sequence" and isinstance(spec.get("normalizers"), list):
        steps = [step.get("type") if isinstance(step, dict) else step for step in spec["normalizers"]]
        others = [str(step) for step in steps if step not in FORMS]
        if not others:
            return form_of_sequence(steps)
        raise refuse(f"it normalizes text first with {' + '.join(map(str, steps))}; gptlab applies only "
                     f"{', '.join(FORMS)} ({', '.join(others)} would give other ids)")
    raise refuse(f"it normalizes text first ({kind}); gptlab applies only {', '.join(FORMS)}, alone or in a Sequence")


def normalizing_take(take: Callable[[str, bool], tuple[list[int], int]], form: str) -> Callable[[str, bool], tuple[list[int], int]]:
    """A `take(text, final)` for gptlab.tokenizer.stream that normalises first, with bounded memory.

    Streaming offers raw text in pieces. The raw text up to `safe_cut` is normalised and consumed; the
    normalised characters `take` cannot yet encode wait here, in front of the next raw text. safe_cut never
    consumes the whole offer, so the next call always continues this text (never a special token first).
    """
    pending = ""

    def take_normalized(text: str, final: bool) -> tuple[list[int], int]:
        nonlocal pending
        cut = len(text) if final else safe_cut(text)
        normalized = pending + normalize(text[:cut], form)
        ids, used = take(normalized, final)
        pending = normalized[used:]
        return ids, cut

    return take_normalized
