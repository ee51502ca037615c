"""SentencePieceTokenizer against the `sentencepiece` library, on models the library trains inside the tests."""

import contextlib
import pickle

import pytest
import sentencepiece as spm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptlab.runtime import GptlabError
from gptlab.tokenizer import SentencePieceTokenizer, Tokenizer, native
from gptlab.tokenizer.pretrained import load_any
from gptlab.tokenizer.sentencepiece import BPEEncoder, decode_byte_run
from gptlab.tokenizer.sp_model import BYTE, CONTROL, UNUSED, Piece, read_model, write_model
from tests.tokenizer.sp_fixtures import PROBES, corpus, model_maker, reference


@pytest.fixture(scope="session")
def sp_models(tmp_path_factory):
    return model_maker(tmp_path_factory)

# The model options the tests cover, each a library-trained BPE model.
CONFIGS = {
    "small": dict(vocab_size=400),
    "medium": dict(vocab_size=1500),
    "large": dict(vocab_size=5000),
    "bytes": dict(vocab_size=1100, byte_fallback=True),
    "bytes_rare": dict(vocab_size=900, byte_fallback=True, character_coverage=0.98),
    "unk_rare": dict(vocab_size=500, character_coverage=0.98),
    "nmt_nfkc": dict(vocab_size=600, normalization_rule_name="nmt_nfkc"),
    "nfkc_cf": dict(vocab_size=600, normalization_rule_name="nmt_nfkc_cf", byte_fallback=True, vocab_size_extra=300),
    "symbols": dict(vocab_size=600, user_defined_symbols=("<sep>", "ab", "☃", "▁▁"), control_symbols=("<ctl>", "<|im_start|>")),
    "no_prefix": dict(vocab_size=600, add_dummy_prefix=False),
    "keep_spaces": dict(vocab_size=600, remove_extra_whitespaces=False),
    "suffix": dict(vocab_size=600, treat_whitespace_as_suffix=True),
    "raw_whitespace": dict(vocab_size=900, byte_fallback=True, add_dummy_prefix=False, remove_extra_whitespaces=False,
                           treat_whitespace_as_suffix=True),
}
CONFIGS["nfkc_cf"]["vocab_size"] += CONFIGS["nfkc_cf"].pop("vocab_size_extra")

# Text built from the characters where the rules bite: spaces, "▁", user-defined and control text, unseen characters.
TRICKY = st.lists(st.sampled_from(list(" \t\n\r▁abé你😀☃ﬁ①\u00a0\u200d") + ["<sep>", "<ctl>", "<s>", "</s>", "▁▁", "  "]), max_size=24).map("".join)
TEXTS = st.text(max_size=40) | TRICKY


@pytest.fixture(params=list(CONFIGS))
def model_path(request, sp_models):
    return sp_models(**CONFIGS[request.param])


@pytest.mark.parametrize("pure", [False, True], ids=["compiled_if_built", "pure_python"])
def test_sentencepiece_encode_and_decode_match_the_library_on_many_scripts(model_path, pure):
    with native.pure_python() if pure else contextlib.nullcontext():
        tokenizer, library = SentencePieceTokenizer.from_file(model_path), reference(model_path)
        for text in PROBES + corpus(40, seed=1):
            ids = library.encode(text)
            assert tokenizer.encode(text) == ids, text
            assert tokenizer.decode(ids) == library.decode(ids), text


@pytest.mark.parametrize("name", ["small", "bytes_rare", "unk_rare", "nfkc_cf", "symbols", "keep_spaces", "raw_whitespace"])
def test_sentencepiece_round_trip_is_lossy_exactly_where_the_library_is(sp_models, name):
    path = sp_models(**CONFIGS[name])
    tokenizer, library = SentencePieceTokenizer.from_file(path), reference(path)

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(TEXTS)
    def check(text):
        ids = tokenizer.encode(text)
        assert ids == library.encode(text)
        assert tokenizer.decode(ids) == library.decode(library.encode(text))

    check()


@pytest.mark.parametrize("name", ["bytes", "symbols", "no_prefix", "keep_spaces", "suffix"])
def test_sentencepiece_decode_of_any_ids_matches_the_library(sp_models, name):
    """Ids no encoder would give too: control pieces first, stray byte pieces (malformed UTF-8), <unk>, "▁" runs."""
    path = sp_models(**CONFIGS[name])
    tokenizer, library = SentencePieceTokenizer.from_file(path), reference(path)

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.lists(st.integers(0, tokenizer.vocab_size - 1) | st.sampled_from(range(min(tokenizer.vocab_size, 270))), max_size=12))
    def check(ids):
        assert tokenizer.decode(ids) == library.decode(ids)

    check()


# (model, text, what both the library and gptlab give back): SentencePiece is lossy by design here.
LOSSY = [
    ("nmt_nfkc", "ﬁne Ｔhe ｆox", "fine The fox"),  # NFKC folds compatibility characters
    ("nmt_nfkc", "tab\there\nnewline", "tab here newline"),  # nmt_ rules turn tabs and newlines into spaces
    ("nfkc_cf", "Hello WORLD", "hello world"),  # _cf folds case
    ("small", "  many    spaces  ", "many spaces"),  # remove_extra_whitespaces collapses and strips
    ("unk_rare", "snow ☃☃ man", "snow  ⁇  man"),  # an unseen run is one <unk>, read back as " ⁇ "
]


@pytest.mark.parametrize(("name", "text", "expected"), LOSSY)
def test_sentencepiece_changes_text_in_the_same_way_as_the_library(sp_models, name, text, expected):
    path = sp_models(**CONFIGS[name])
    tokenizer, library = SentencePieceTokenizer.from_file(path), reference(path)
    assert library.decode(library.encode(text)) == expected
    assert tokenizer.decode(tokenizer.encode(text)) == expected


def test_sentencepiece_byte_fallback_spells_unseen_characters_in_bytes(sp_models):
    path = sp_models(**CONFIGS["bytes_rare"])
    tokenizer, library = SentencePieceTokenizer.from_file(path), reference(path)
    ids = tokenizer.encode("☃")
    assert ids == library.encode("☃")
    assert [tokenizer.piece(i) for i in ids[-3:]] == ["<0xE2>", "<0x98>", "<0x83>"]
    assert tokenizer.decode(ids) == "☃"
    assert b"".join(tokenizer.token_bytes(i) for i in ids[-3:]) == "☃".encode()


def test_sentencepiece_decode_replaces_each_malformed_byte_like_the_library(sp_models):
    path = sp_models(**CONFIGS["bytes"])
    tokenizer, library = SentencePieceTokenizer.from_file(path), reference(path)
    byte = {b: library.piece_to_id(f"<0x{b:02X}>") for b in range(256)}
    for data in [b"\xe2\x98", b"\xff\xfe", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"a\xe2\x98\x83\x80", b"\xef\xbf\xbd"]:
        ids = [byte[b] for b in data]
        assert tokenizer.decode(ids) == library.decode(ids) == decode_byte_run(data)
        assert tokenizer.decode_bytes(ids) == data
    assert decode_byte_run(b"\xe2\x98") == "\ufffd\ufffd"  # per byte, where Python's "replace" gives one


def test_sentencepiece_unused_pieces_are_split_back_as_the_library_does(sp_models, tmp_path):
    model = read_model(sp_models(**CONFIGS["medium"]))
    library_before = reference(sp_models(**CONFIGS["medium"]))
    common = [i for i in sorted({i for text in corpus(40) for i in library_before.encode(text)}) if len(model.pieces[i].text) > 2]
    unused = set(common[::3])
    pieces = tuple(Piece(p.text, p.score, UNUSED) if i in unused else p for i, p in enumerate(model.pieces))
    path = write_model(model.with_pieces(pieces), tmp_path / "unused.model")
    tokenizer, library = SentencePieceTokenizer.from_file(path), reference(path)
    texts = PROBES + corpus(60, seed=2)
    assert any(library.encode(text) != library_before.encode(text) for text in texts)
    for text in texts:
        assert tokenizer.encode(text) == library.encode(text), text
        assert not unused & set(tokenizer.encode(text))


def test_sentencepiece_pure_python_encoder_is_the_one_used_when_asked(sp_models):
    path = sp_models(**CONFIGS["bytes"])
    with native.pure_python():
        tokenizer = SentencePieceTokenizer.from_file(path)
        assert tokenizer._fast() is None
        assert isinstance(tokenizer._bpe(), BPEEncoder)
        assert tokenizer.encode_many(PROBES) == [reference(path).encode(text) for text in PROBES]


def test_sentencepiece_control_pieces_are_special_tokens_read_as_text_by_default(sp_models):
    path = sp_models(**CONFIGS["symbols"])
    tokenizer, library = SentencePieceTokenizer.from_file(path), reference(path)
    assert tokenizer.special_tokens == {library.id_to_piece(i): i for i in range(library.get_piece_size()) if library.is_control(i)}
    assert set(tokenizer.special_tokens) == {"<s>", "</s>", "<ctl>", "<|im_start|>"}
    assert (tokenizer.bos_id, tokenizer.eot_id) == (library.bos_id(), library.eos_id())
    text = "<|im_start|>user hi</s>"
    assert tokenizer.encode(text) == library.encode(text)
    # allowed control text becomes its id; the text between is encoded as the library encodes it alone
    start, eos = tokenizer.special_tokens["<|im_start|>"], library.eos_id()
    assert tokenizer.encode(text, allowed_special="all") == [start] + library.encode("user hi") + [library.eos_id()]
    assert tokenizer.encode("a </s>  b</s>", allowed_special={"</s>"}) == library.encode("a ") + [eos] + library.encode("  b") + [eos]
    assert tokenizer.encode(text, allowed_special={"</s>"}) == library.encode("<|im_start|>user hi") + [library.eos_id()]
    with pytest.raises(GptlabError, match="special token '<\\|im_start\\|>'"):
        tokenizer.encode(text, disallowed_special="all")


def test_sentencepiece_user_defined_pieces_stay_whole(sp_models):
    path = sp_models(**CONFIGS["symbols"])
    tokenizer = SentencePieceTokenizer.from_file(path)
    sep = tokenizer.model.pieces.index(next(p for p in tokenizer.model.pieces if p.text == "<sep>"))
    assert tokenizer.encode("x<sep>y").count(sep) == 1
    assert tokenizer.encode("x<sep>y") == reference(path).encode("x<sep>y")


def test_sentencepiece_with_special_tokens_saves_control_pieces_the_library_loads(sp_models, tmp_path):
    path = sp_models(**CONFIGS["bytes"])
    tokenizer = SentencePieceTokenizer.from_file(path)
    extended = tokenizer.with_special_tokens(["<|im_start|>", "<|im_end|>", "</s>"])
    assert extended.vocab_size == tokenizer.vocab_size + 2
    assert extended.special_tokens["<|im_end|>"] == tokenizer.vocab_size + 1
    assert extended.with_special_tokens(["<|im_end|>"]) is extended
    saved = extended.save(tmp_path / "out")
    assert saved == tmp_path / "out" / "tokenizer.model"
    library = reference(saved)
    assert library.is_control(extended.special_tokens["<|im_start|>"])
    for text in PROBES:
        assert extended.encode(text) == library.encode(text) == tokenizer.encode(text)
    assert extended.encode("<|im_end|>", allowed_special="all") == [tokenizer.vocab_size + 1]
    assert extended.fingerprint() != tokenizer.fingerprint()
    with pytest.raises(GptlabError, match="already piece"):
        tokenizer.with_special_tokens(["<0x41>"])


def test_sentencepiece_loads_through_every_entry_point(sp_models, tmp_path):
    path = sp_models(**CONFIGS["small"])
    tokenizer = SentencePieceTokenizer.from_file(path)
    folder = tmp_path / "tok"
    tokenizer.save(folder)
    for loaded in [Tokenizer.from_sentencepiece(path), load_any(str(path)), load_any(folder)]:
        assert isinstance(loaded, SentencePieceTokenizer)
        assert loaded.fingerprint() == tokenizer.fingerprint()
    assert tokenizer.file_bytes() == (folder / "tokenizer.model").read_bytes()
    assert pickle.loads(pickle.dumps(tokenizer)).encode(PROBES[6]) == tokenizer.encode(PROBES[6])


def test_sentencepiece_unigram_model_is_refused_in_one_line(sp_models):
    path = sp_models(vocab_size=400, model_type="unigram")
    with pytest.raises(GptlabError, match="unigram") as error:
        Tokenizer.from_sentencepiece(path)
    assert "\n" not in str(error.value) and "BPE" in str(error.value)


def test_sentencepiece_batch_apis_agree_with_encode(sp_models):
    path = sp_models(**CONFIGS["bytes_rare"])
    tokenizer = SentencePieceTokenizer.from_file(path)
    texts = PROBES + corpus(30)
    expected = [tokenizer.encode(text) for text in texts]
    assert tokenizer.encode_many(texts) == expected
    assert tokenizer.encode_batch(texts, workers=1) == expected
    assert list(tokenizer.encode_iterable(texts)) == tokenizer.encode("".join(texts))
    packed, counts = tokenizer.encode_ordinary_packed(texts)
    assert counts == [len(ids) for ids in expected] and list(packed) == [i for ids in expected for i in ids]


def test_sentencepiece_vocab_holds_the_bytes_each_piece_stands_for(sp_models):
    path = sp_models(**CONFIGS["bytes"])
    tokenizer, library = SentencePieceTokenizer.from_file(path), reference(path)
    for i in range(tokenizer.vocab_size):
        piece = library.id_to_piece(i)
        if library.is_byte(i):
            expected = bytes([int(piece[3:5], 16)])
        elif library.is_control(i) or library.is_unknown(i):
            expected = piece.encode()
        else:
            expected = piece.replace("▁", " ").encode()
        assert tokenizer.vocab[i] == tokenizer.token_bytes(i) == expected
        assert tokenizer.piece(i) == piece
    assert sum(kind == BYTE for kind in (p.kind for p in tokenizer.model.pieces)) == 256
    assert CONTROL in {p.kind for p in tokenizer.model.pieces}


def test_sentencepiece_decode_refuses_unknown_ids(sp_models):
    tokenizer = SentencePieceTokenizer.from_file(sp_models(**CONFIGS["small"]))
    for bad in ([tokenizer.vocab_size], [-1], ["3"]):
        with pytest.raises(GptlabError, match="unknown token id"):
            tokenizer.decode(bad)


def test_sentencepiece_hugging_face_folder_gives_the_same_ids(sp_models, tmp_path):
    import transformers  # imported here: slow to import, and only this test needs it
    tokenizer = SentencePieceTokenizer.from_file(sp_models(**CONFIGS["bytes"])).with_special_tokens(["<|im_start|>"])
    folder = tokenizer.save_huggingface_dir(tmp_path / "hf")
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    for text in PROBES:
        assert hf(text)["input_ids"] == tokenizer.encode(text, allowed_special="all"), text


def test_sentencepiece_decode_applies_the_models_denormaliser(tmp_path):
    rules = tmp_path / "denormalize.tsv"
    rules.write_text("61\t41\n6F\t4F 4F\n")  # "a" -> "A", "o" -> "OO" (code points in hex)
    path = tmp_path / "denormalizing.model"
    with open(path, "wb") as writer:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus()), model_writer=writer, model_type="bpe", vocab_size=600,
                                       minloglevel=2, num_threads=1, denormalization_rule_tsv=str(rules))
    tokenizer, library = SentencePieceTokenizer.from_file(path), reference(path)
    assert library.decode(library.encode("a boat")) == "A bOOAt"
    for text in PROBES:
        ids = library.encode(text)
        assert tokenizer.encode(text) == ids
        assert tokenizer.decode(ids) == library.decode(ids)


def test_a_hugging_face_llama_folder_loads_its_tokenizer_model(sp_models, tmp_path):
    """A folder holding a SentencePiece tokenizer.json (not byte-level) and tokenizer.model loads the model."""
    import shutil

    from gptlab.tokenizer.pretrained import load_any

    path = sp_models(vocab_size=900, byte_fallback=True)
    tok = SentencePieceTokenizer.from_file(path)
    tok.save_huggingface_dir(tmp_path / "hf")
    shutil.copy(path, tmp_path / "hf" / "tokenizer.model")
    loaded = load_any(tmp_path / "hf")
    assert isinstance(loaded, SentencePieceTokenizer) and loaded.fingerprint() == tok.fingerprint()
