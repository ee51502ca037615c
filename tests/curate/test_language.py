"""Language ID: paragraphs written here in six languages, the filter's keep/drop reasons, and the threshold edge."""

import math

import pytest

from gptlab.curate import language
from gptlab.curate.document import Document
from gptlab.curate.language import LanguageConfig, LanguageFilter, identify
from gptlab.runtime import GptlabError

PARAGRAPHS = {
    "en": "The library opens at nine in the morning, and most students arrive before lunch to find a quiet table near "
          "the windows.\nThey read, take notes and talk in low voices until the evening.",
    "fr": "La bibliothèque ouvre à neuf heures du matin, et la plupart des étudiants arrivent avant le déjeuner pour "
          "trouver une table tranquille près des fenêtres.",
    "de": "Die Bibliothek öffnet um neun Uhr morgens, und die meisten Studenten kommen vor dem Mittagessen, um einen "
          "ruhigen Tisch am Fenster zu finden.",
    "es": "La biblioteca abre a las nueve de la mañana, y la mayoría de los estudiantes llegan antes del almuerzo para "
          "encontrar una mesa tranquila cerca de las ventanas.",
    "ru": "Библиотека открывается в девять часов утра, и большинство студентов приходят до обеда, чтобы найти тихий "
          "стол у окна.",
    "zh": "图书馆早上九点开门，大多数学生在午饭前到达，在窗户旁边找一张安静的桌子。他们读书、做笔记，一直到晚上。",
}


def documents() -> list[Document]:
    return [Document(id=code, text=text) for code, text in PARAGRAPHS.items()]


@pytest.mark.parametrize("code", sorted(PARAGRAPHS))
def test_identify_names_each_language_above_the_default_threshold(code):
    found, score = identify(PARAGRAPHS[code])
    assert found == code
    assert LanguageConfig().threshold <= score <= 1.0


def test_identify_reads_newlines_as_spaces():
    assert identify("one line\nand another line") == identify("one line and another line")


def test_language_filter_keeps_english_and_drops_the_rest_by_language():
    stage = LanguageFilter()
    batch = documents()
    kept = list(stage.run(batch))
    assert [document.id for document in kept] == ["en"]
    assert stage.stats.reasons == {f"language: {code}": 1 for code in ("fr", "de", "es", "ru", "zh")}
    assert [document.metadata["language"] for document in batch] == list(PARAGRAPHS)  # recorded on the dropped too
    assert all(0.65 <= document.metadata["language_score"] <= 1.0 for document in batch)


def test_language_filter_keeps_each_configured_language():
    kept = list(LanguageFilter(LanguageConfig(languages=("de", "fr"))).run(documents()))
    assert [document.id for document in kept] == ["fr", "de"]


def test_language_filter_any_language_keeps_all_and_records_them():
    kept = list(LanguageFilter(LanguageConfig(languages=())).run(documents()))
    assert [document.metadata["language"] for document in kept] == list(PARAGRAPHS)


def test_language_filter_threshold_keeps_a_score_equal_to_it(monkeypatch):
    stage = LanguageFilter(LanguageConfig(threshold=0.65))
    monkeypatch.setattr(language, "identify", lambda text: ("en", 0.65))
    assert stage.reject(Document(id="at", text="x")) is None
    monkeypatch.setattr(language, "identify", lambda text: ("en", math.nextafter(0.65, 0.0)))
    assert stage.reject(Document(id="below", text="x")) == "language score below 0.65"


def test_language_filter_threshold_at_a_real_score():
    document = Document(id="es", text=PARAGRAPHS["es"])
    _, score = identify(document.text)
    assert LanguageFilter(LanguageConfig(languages=("es",), threshold=score)).reject(document) is None
    above = LanguageFilter(LanguageConfig(languages=("es",), threshold=math.nextafter(score, 1.0)))
    assert above.reject(document) == f"language score below {math.nextafter(score, 1.0):g}"


def test_language_filter_drops_unsure_text_by_score():
    stage = LanguageFilter(LanguageConfig(languages=(), threshold=0.65))
    assert list(stage.run([Document(id="noise", text="ok 42 :)")])) == []
    assert list(stage.stats.reasons) == ["language score below 0.65"]


def test_language_config_refuses_bad_values():
    with pytest.raises(GptlabError, match="threshold must be between 0 and 1, got 1.5"):
        LanguageConfig(threshold=1.5)
    with pytest.raises(GptlabError, match="holds 'EN'; use lower-case ISO 639 codes"):
        LanguageConfig(languages=("EN",))
    with pytest.raises(GptlabError, match="codes py3langid does not know: xx; it knows ace, af, am"):
        LanguageFilter(LanguageConfig(languages=("en", "xx")))
    assert LanguageConfig(languages=["en", "fr"]).languages == ("en", "fr")
