"""Language identification with py3langid (langid.py's naive Bayes over byte n-grams), as a filter.

    identify("Le chat dort sur le canapé depuis ce matin.")  ->  ("fr", 0.98...)

Scores are py3langid's normalised probabilities (0 to 1). Every document gets metadata["language"] and
metadata["language_score"]; `LanguageFilter` keeps the configured languages scored at or above the threshold and drops
the rest as "language: fr" or "language score below 0.65", so the report shows what went. The model loads once per
process, on first use. Not here: the other quality filters (gptlab.curate's quality modules).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from gptlab.curate.document import Document, Filter
from gptlab.runtime import GptlabError


@dataclass(frozen=True, kw_only=True)
class LanguageConfig:
    languages: tuple[str, ...] = ("en",)  # ISO 639 codes to keep, as py3langid names them; () keeps any (still recorded)
    threshold: float = 0.65  # the least score kept; applies with any language too, where it drops unsure guesses

    def __post_init__(self) -> None:
        object.__setattr__(self, "languages", tuple(self.languages))  # a list from a config file reads the same
        if not 0.0 <= self.threshold <= 1.0:
            raise GptlabError(f"language.threshold must be between 0 and 1, got {self.threshold}")
        for code in self.languages:
            if not (isinstance(code, str) and code.isalpha() and code.islower()):
                raise GptlabError(f"language.languages holds {code!r}; use lower-case ISO 639 codes such as 'en', 'fr', 'arz'")


@functools.cache
def _identifier():
    """py3langid's model with normalised probabilities, loaded once per process (under a second) and kept."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def known_languages() -> list[str]:
    """The codes py3langid can answer, sorted: mostly ISO 639-1 ("en"), some ISO 639-3 ("arz"), "zxx" for no language."""
    return sorted(_identifier().labels)


def identify(text: str) -> tuple[str, float]:
    """The most likely language of `text` and its probability. Newlines become spaces: the model was trained on
    running text, and a page's line breaks would otherwise join words across lines as n-grams."""
    language, score = _identifier().classify(text.replace("\n", " "))
    return language, float(score)


class LanguageFilter(Filter):
    """Records each document's language and score, and keeps the configured languages scored at least `threshold`."""

    name = "language"

    def __init__(self, config: LanguageConfig | None = None) -> None:
        super().__init__()
        self.config = config or LanguageConfig()
        unknown = sorted(set(self.config.languages) - set(known_languages()))
        if unknown:
            raise GptlabError(f"language.languages has codes py3langid does not know: {', '.join(unknown)}; "
                              f"it knows {', '.join(known_languages())}")

    def reject(self, document: Document) -> str | None:
        language, score = identify(document.text)
        document.metadata["language"] = language
        document.metadata["language_score"] = score
        if self.config.languages and language not in self.config.languages:
            return f"language: {language}"
        if score < self.config.threshold:
            return f"language score below {self.config.threshold:g}"
        return None
