"""The compiled SentencePiece piece learner (_sptrain.c) equals the readable reference (sp_train.learn_pieces)
piece for piece, and the whole trainer, compiled, still equals the `sentencepiece` library's trainer on
Shakespeare; the fast corpus counting equals the character-by-character definition."""

from __future__ import annotations

import io
import random
from collections import Counter

import pytest
import sentencepiece as spm

from gptlab.data.corpus import shakespeare_documents
from gptlab.tokenizer import native
from gptlab.tokenizer.sp_model import SPACE, parse_model
from gptlab.tokenizer.sp_train import PieceRules, count_words, learn_pieces, learn_pieces_fast, required_characters, train_sentencepiece

from .sp_fixtures import SCRIPT_SAMPLES


@pytest.fixture(autouse=True)
def compiled_learner():
    """Every test here compares the compiled learner: without it they would compare the reference with itself."""
    assert native.sptrain() is not None, "the compiled core is not built: run `.venv/bin/python setup.py build_ext --inplace`"


RULES = [
    PieceRules(max_length=16, split_digits=True, split_by_script=True),
    PieceRules(max_length=16, split_digits=False, split_by_script=False),
    PieceRules(max_length=3, split_digits=True, split_by_script=False),
    PieceRules(max_length=1, split_digits=False, split_by_script=True),
]


def sample_words(seed: int, n_words: int = 300) -> Counter:
    """Random words over an alphabet that trips every rule: "▁", digits, combining marks, scripts, repeats ("aaaa")."""
    rng = random.Random(seed)
    alphabet = ["a", "a", "b", "c", SPACE, "1", "2", "\u0301", "ж", "я", "日", "の", ".", "!", "é", " ", "\t"]
    words: Counter = Counter()
    for _ in range(n_words):
        body = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9)))
        words[rng.choice([SPACE, ""]) + body] += rng.choice([1, 1, 2, 3, 7])
    words["aaaaaaaa"] += 5  # "aa" + "a" and "a" + "aa" spell one text: merged into, not a new piece
    return words


def corpus_words() -> Counter:
    segments = Counter({SPACE + text.replace(" ", SPACE): 1 + i % 3 for i, text in enumerate(SCRIPT_SAMPLES.values())})
    return count_words(segments, set(required_characters(segments, 1.0)))


@pytest.mark.parametrize("rules", RULES, ids=["llama", "no-rules", "max3", "max1"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compiled_learner_equals_reference_on_random_words(rules, seed):
    words = sample_words(seed)
    for n_pieces in (1, 25, 10_000):  # one, some, and until no pair is left
        expected = learn_pieces(words, n_pieces, rules)
        assert learn_pieces_fast(words, n_pieces, rules) == expected
    assert len(expected) < 10_000  # the last run stopped early, as the reference does


@pytest.mark.parametrize("rules", RULES[:3], ids=["llama", "no-rules", "max3"])
def test_compiled_learner_equals_reference_on_many_scripts(rules):
    words = corpus_words()
    expected = learn_pieces(words, 10_000, rules)
    assert learn_pieces_fast(words, 10_000, rules) == expected
    assert len(expected) > 100


def test_compiled_learner_falls_back_for_another_rule():
    always = lambda piece: True  # noqa: E731 - not a PieceRules: the reference runs
    assert learn_pieces_fast({"▁aab": 2, "▁ab": 1}, 10, always) == ["ab", "▁a", "▁aab", "▁ab"]


def test_compiled_trainer_equals_pure_python_and_the_library_on_shakespeare():
    text = "".join(shakespeare_documents())[:600_000]
    options = {"vocab_size": 2000, "byte_fallback": True, "split_digits": True, "character_coverage": 0.9995}
    model = train_sentencepiece([text], **options)
    with native.pure_python():
        assert train_sentencepiece([text], **options) == model
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text.split("\n")), model_writer=writer, model_type="bpe", normalization_rule_name="identity",
        remove_extra_whitespaces=False, num_threads=1, minloglevel=2, **options,
    )
    assert [(piece.text, piece.score) for piece in parse_model(writer.getvalue()).pieces] == [(p.text, p.score) for p in model.pieces]


def brute_force_characters(segments: dict, coverage: float) -> list[str]:
    counts: Counter = Counter()
    for segment, count in segments.items():
        for char in segment:
            counts[char] += count
    counts.pop("\t", None), counts.pop("\0", None)
    total, kept, covered = sum(counts.values()), [], 0
    for char, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        if coverage < 1 and covered / total >= coverage:
            break
        kept.append(char)
        covered += count
    return kept


def brute_force_words(segments: dict, characters: set[str]) -> Counter:
    words: Counter = Counter()
    for segment, count in segments.items():
        word = ""
        for char in segment:
            if char not in characters or char == SPACE:
                if word:
                    words[word] += count
                word = char if char in characters else ""
            else:
                word += char
        if word:
            words[word] += count
    return words


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_corpus_counting_equals_the_character_by_character_definition(seed):
    rng = random.Random(seed)
    alphabet = "ab▁▁\t\0]^-\\[日\U0001f600\u0301"
    segments = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))): rng.choice([1, 1, 4]) for _ in range(200)}
    for coverage in (1.0, 0.9, 0.5):
        characters = required_characters(segments, coverage)
        assert characters == brute_force_characters(segments, coverage)
        assert count_words(segments, set(characters)) == brute_force_words(segments, set(characters))
    assert count_words(segments, {"a", "b"}) == brute_force_words(segments, {"a", "b"})  # "▁" rare: only runs
