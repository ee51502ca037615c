"""SentencePiece-style BPE training: the `.model` files it writes are read by the `sentencepiece` library,
which encodes them exactly as a brute-force SentencePiece BPE encoder does, and, where no pair counts tie,
the pieces equal the library's own trainer's."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import sentencepiece as spm

from gptlab.runtime import GptlabError
from gptlab.tokenizer.sp_model import BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED, read_model, write_model
from gptlab.tokenizer.sp_train import PieceRules, count_words, learn_pieces, required_characters, train_sentencepiece

LINES = [
    "The quick brown fox jumps over the lazy dog, and the dog sleeps.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Быстрая коричневая лиса прыгает через ленивую собаку.",
    "Η γρήγορη καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο.",
    "敏捷的棕色狐狸跳过了懒狗。日本語のテキストもあります。",
    "الثعلب البني السريع يقفز فوق الكلب الكسول",
    "तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है।",
    "Numbers 12345 and 2024-06-01, prices $3.50 and €7,99!",
    "Emoji 😀 and 👍🏽 show up 😀 sometimes 🎉.",
]
HELD_OUT = [
    "The lazy fox sleeps over the brown dog.",
    "Über den Hund: ленивая лиса, σκύλο, 狐狸跳, テキスト.",
    "rare: ǅ ꙮ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🦜 and \u0301 combining",
    "digits 0987654321 and   runs   of    spaces ",
    " leading space",
    "",
    "tab\tand\nnewline",
]


def corpus_text(repeats: int = 6) -> str:
    """The lines with varied repetition, so pair counts differ."""
    return "\n".join(line for i in range(repeats) for line in LINES[: len(LINES) - i % 3])


def brute_force_encode(model, text: str, processor) -> list[int]:
    """SentencePiece BPE by its definition: start from characters, merge the adjacent pair whose join is the
    highest-scoring piece (leftmost on ties) until none is; unknown characters become bytes or <unk>."""
    normalized = processor.normalize(text) if text else ""
    scores = {piece.text: (piece.score, i) for i, piece in enumerate(model.pieces) if piece.kind in (NORMAL, USER_DEFINED)}
    user_defined = sorted((piece.text for piece in model.pieces if piece.kind == USER_DEFINED), key=len, reverse=True)
    symbols, position = [], 0
    while position < len(normalized):  # user-defined symbols are single symbols from the start
        length = next((len(text) for text in user_defined if normalized.startswith(text, position)), 1)
        symbols.append(normalized[position : position + length])
        position += length
    while True:
        candidates = [(scores[a + b][0], -i) for i, (a, b) in enumerate(zip(symbols, symbols[1:])) if a + b in scores]
        if not candidates:
            break
        _, negative = max(candidates)
        symbols[-negative : -negative + 2] = [symbols[-negative] + symbols[-negative + 1]]
    byte_ids = {piece.text: i for i, piece in enumerate(model.pieces) if piece.kind == BYTE}
    ids = []
    for symbol in symbols:
        if symbol in scores:
            ids.append(scores[symbol][1])
        elif byte_ids:
            ids.extend(byte_ids[f"<0x{byte:02X}>"] for byte in symbol.encode("utf-8"))
        elif not ids or ids[-1] != 0:  # unknown characters in a row fuse into one <unk>
            ids.append(0)
    return ids


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "multilingual.txt"
    path.write_text(corpus_text(), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "options",
    [
        {"vocab_size": 420},
        {"vocab_size": 600},
        {"vocab_size": 420, "character_coverage": 0.98},
        {"vocab_size": 300, "byte_fallback": False},
        {"vocab_size": 200, "byte_fallback": False, "character_coverage": 0.98},
        {"vocab_size": 450, "normalizer": "nmt_nfkc", "remove_extra_whitespaces": True},
        {"vocab_size": 450, "user_defined_symbols": ("<sep>", "😀")},
    ],
    ids=["420", "600", "coverage", "no-bytes", "no-bytes-coverage", "nmt_nfkc", "user-defined"],
)
def test_train_sentencepiece_writes_a_model_the_library_encodes_as_scored(tmp_path, corpus_file, options):
    model = train_sentencepiece(files=[corpus_file], **options)
    path = write_model(model, tmp_path / "tokenizer.model")
    processor = spm.SentencePieceProcessor(model_file=str(path))
    assert processor.vocab_size() == len(model.pieces) == options["vocab_size"]
    assert [processor.id_to_piece(i) for i in range(processor.vocab_size())] == [piece.text for piece in model.pieces]
    assert (processor.unk_id(), processor.bos_id(), processor.eos_id()) == (0, 1, 2)
    reread = read_model(path)
    for text in [*HELD_OUT, *LINES, "<sep> user 😀 symbols"]:
        ids = processor.encode(text)
        assert ids == brute_force_encode(reread, text, processor), text
        if options.get("byte_fallback", True) and "normalizer" not in options:
            assert processor.decode(ids) == text  # lossless: identity rules, and bytes for the rest


def test_train_sentencepiece_lays_out_the_vocabulary_as_the_library_does(corpus_file):
    model = train_sentencepiece(files=[corpus_file], vocab_size=480, user_defined_symbols=("<sep>",))
    kinds = [piece.kind for piece in model.pieces]
    assert [piece.text for piece in model.pieces[:4]] == ["<unk>", "<s>", "</s>", "<sep>"]
    assert kinds[:4] == [UNKNOWN, CONTROL, CONTROL, USER_DEFINED]
    assert [piece.text for piece in model.pieces[4:260]] == [f"<0x{byte:02X}>" for byte in range(256)]
    learned = model.pieces[260:]
    assert all(piece.kind == NORMAL for piece in learned)
    assert [piece.score for piece in learned] == [-float(i) for i in range(len(learned))]
    singles = [piece.text for piece in learned if len(piece.text) == 1]
    assert learned[-len(singles) :] == tuple(piece for piece in learned if len(piece.text) == 1)  # characters last
    assert singles[0] == "▁"  # the most frequent character comes first


def test_train_sentencepiece_pieces_equal_the_library_trainers(tmp_path, corpus_file):
    model = train_sentencepiece(files=[corpus_file], vocab_size=500)
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        input=str(corpus_file), model_writer=writer, model_type="bpe", vocab_size=500, byte_fallback=True,
        split_digits=True, normalization_rule_name="identity", remove_extra_whitespaces=False, character_coverage=0.9995,
        num_threads=1, minloglevel=2,
    )
    reference = tmp_path / "reference.model"
    reference.write_bytes(writer.getvalue())
    assert [(piece.text, piece.score) for piece in read_model(reference).pieces] == [(piece.text, piece.score) for piece in model.pieces]


def test_required_characters_stop_at_the_coverage_most_frequent_first():
    segments = {"▁aaaa": 10, "▁bb": 3, "▁c": 1}  # ▁ 14, a 40, b 6, c 1 of 61
    assert required_characters(segments, 1.0) == ["a", "▁", "b", "c"]
    assert required_characters(segments, 0.9) == ["a", "▁", "b"]  # 54/61 = 0.885 < 0.9 before b, 0.98 after
    assert required_characters(segments, 0.5) == ["a"]


def test_count_words_splits_before_spaces_and_at_rare_characters():
    assert count_words({"▁the▁cat": 2, "▁the": 1, "▁aéb": 1}, set("▁thecab")) == {"▁the": 3, "▁cat": 2, "▁a": 1, "b": 1}


def test_piece_rules_follow_the_library():
    rules = PieceRules(max_length=4, split_digits=True, split_by_script=True)
    assert rules("▁the") and rules("▁ж") and rules("日本語の") and rules("e\u0301t") and rules("..")
    assert not rules("a▁")  # "▁" only starts a piece
    assert not rules("▁a12") and not rules("12")  # split digits
    assert not rules("aж") and not rules("a.")  # one script: punctuation is Common
    assert not rules("▁abcd")  # longer than max_length


def test_learn_pieces_takes_the_most_frequent_pair_and_breaks_ties_as_the_library():
    always = PieceRules(max_length=16, split_digits=False, split_by_script=False)
    assert learn_pieces({"▁aab": 2, "▁ab": 1}, 1, always) == ["ab"]  # ab 3, ▁a 3, aa 2: "ab" < "▁a" (U+2581)
    # then ▁a 2 ties a+ab 2: the shorter piece wins
    assert learn_pieces({"▁aab": 2, "▁ab": 1}, 10, always) == ["ab", "▁a", "▁aab", "▁ab"]
    assert learn_pieces({"aaaa": 1}, 10, always) == ["aa", "aaaa"]  # stops when no pair is left


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"vocab_size": 300, "character_coverage": 0}, "character_coverage must be in (0, 1], got 0"),
        ({"vocab_size": 300, "character_coverage": 1.5}, "character_coverage must be in (0, 1], got 1.5"),
        ({"vocab_size": 100}, "vocab_size 100 is too small: this model needs at least 260 ids"),
        ({"vocab_size": 300, "normalizer": "nfd"}, "unknown normalizer 'nfd'"),
        ({"vocab_size": 300, "control_symbols": ("<s>", "<s>")}, "symbol '<s>' is given twice"),
    ],
)
def test_train_sentencepiece_refuses_bad_options_in_one_line(options, message):
    with pytest.raises(GptlabError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        train_sentencepiece(["some text"], **options)


def test_train_sentencepiece_names_the_minimum_vocab_for_the_corpus(tmp_path):
    corpus = tmp_path / "abc.txt"
    corpus.write_text("abc abc\nab", encoding="utf-8")  # characters ▁ a b c: 259 meta pieces + 4
    with pytest.raises(GptlabError, match=r"vocab_size 262 is too small: this model needs at least 263 ids \(259 meta pieces.* \+ 4 required"):
        train_sentencepiece(files=[corpus], vocab_size=262)
    assert len(train_sentencepiece(files=[corpus], vocab_size=263).pieces) == 263
    assert not list(tmp_path.glob("*.model"))  # training writes nothing
