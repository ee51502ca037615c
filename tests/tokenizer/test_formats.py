"""Tokenizer files and interop: own format, explicit vocab/merges, tiktoken and Hugging Face exports."""

import json
import random

import pytest

from gptlab.runtime import GptlabError
from gptlab.tokenizer import Tokenizer

from .conftest import SAMPLES

EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def trained(shakespeare_documents):
    return Tokenizer.train(shakespeare_documents[:6], vocab_size=2000, special_tokens=[EOT, "<|pad|>"])


@pytest.fixture(scope="module")
def tiktoken_export():
    """`tokenizer.to_tiktoken()`, built once per tokenizer: a 100K vocabulary takes seconds to export."""
    built = {}  # id -> (tokenizer, encoding): holding the tokenizer keeps its id from being reused

    def export(tokenizer):
        if id(tokenizer) not in built:
            built[id(tokenizer)] = (tokenizer, tokenizer.to_tiktoken())
        return built[id(tokenizer)][1]

    return export


def probe_text(shakespeare_documents):
    return shakespeare_documents[10][:100_000] + "".join(SAMPLES.values()) + "\x00\\xff \\\\ caf\u00e9"


def test_save_load_round_trip(tmp_path, trained, shakespeare_documents):
    path = trained.save(tmp_path / "tok")
    loaded = Tokenizer.load(tmp_path / "tok")
    assert path.name == "tokenizer.json"
    assert (loaded.vocab, loaded.merges, loaded.special_tokens, loaded.pattern) == (
        trained.vocab,
        trained.merges,
        trained.special_tokens,
        trained.pattern,
    )
    assert loaded.fingerprint() == trained.fingerprint()
    text = probe_text(shakespeare_documents)
    assert loaded.encode(text) == trained.encode(text)
    assert [p.name for p in (tmp_path / "tok").iterdir()] == ["tokenizer.json"]  # no temporary left behind


def test_saved_file_is_human_readable_json(tmp_path):
    tokenizer = Tokenizer.train(["caf\u00e9 caf\u00e9 \\\\ 世界 世界 " * 20], vocab_size=280, special_tokens=[EOT])
    text = tokenizer.save(tmp_path).read_text(encoding="utf-8")
    data = json.loads(text)
    assert data["format"] == "gptlab-bpe" and data["version"] == 1
    assert data["special_tokens"] == {EOT: tokenizer.vocab_size - 1}
    tokens = dict(data["vocab"])
    assert tokens[ord("a")] == "a" and tokens[0] == "\x00" and tokens[0xFF] == "\\xff"
    assert "世" in text and "caf\u00e9" in text  # tokens appear as text, not base64
    assert Tokenizer.load(tmp_path).vocab == tokenizer.vocab  # a lone UTF-8 byte survives as \xNN


def test_every_byte_sequence_survives_the_file_format(tmp_path):
    rng = random.Random(0)
    vocab = {i: bytes([i]) for i in range(256)}
    merges = []
    for _ in range(200):
        left, right = rng.choice(list(vocab.values())), rng.choice(list(vocab.values()))
        if left + right not in vocab.values():
            merges.append((left, right))
            vocab[len(vocab)] = left + right
    tokenizer = Tokenizer(vocab, merges, [EOT], pattern=None)
    tokenizer.save(tmp_path)
    loaded = Tokenizer.load(tmp_path)
    assert loaded.vocab == tokenizer.vocab and loaded.merges == tokenizer.merges


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda text: text[: len(text) // 2], "truncated or not JSON"),
        (lambda text: "", "truncated or not JSON"),
        (lambda text: text.replace('"gptlab-bpe"', '"other"'), "format"),
        (lambda text: text.replace('"version": 1', '"version": 99'), "version"),
        (lambda text: text.replace('"merges": [', '"merges": [["zz", "q"],', 1), "not in the vocab"),
        (lambda text: text.replace("[97, \"a\"]", "[97, 5]"), "vocab must be"),
        (lambda text: text.replace("[98, \"b\"]", "[98, \"a\"]"), "same bytes"),
    ],
)
def test_damaged_files_are_clear_errors(tmp_path, trained, damage, message):
    path = trained.save(tmp_path)
    path.write_text(damage(path.read_text(encoding="utf-8")), encoding="utf-8")
    with pytest.raises(GptlabError, match=message):
        Tokenizer.load(tmp_path)


def test_missing_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(GptlabError, match="no tokenizer"):
        Tokenizer.load(tmp_path / "nothing")


def test_explicit_vocab_and_merges_take_ids_from_vocab():
    """Ids come from `vocab` (here the bytes are shuffled), merge ranks from list order."""
    rng = random.Random(1)
    ids = list(range(260))
    rng.shuffle(ids)
    vocab = {ids[b]: bytes([b]) for b in range(256)}
    merges = [(b"a", b"b"), (b"ab", b"c"), (b"c", b"c"), (b"x", b"y")]
    for n, (left, right) in enumerate(merges):
        vocab[ids[256 + n]] = left + right
    tokenizer = Tokenizer(vocab, merges, {EOT: 1000}, pattern="gpt2")
    assert tokenizer.merges == merges and tokenizer.special_tokens == {EOT: 1000}
    assert tokenizer.vocab[1000] == EOT.encode()
    assert tokenizer.encode("abc xy") == [ids[257], vocab_id(vocab, b" "), ids[259]]
    assert tokenizer.encode("abcc") == [ids[257], ids[ord("c")]]  # (a, b) ranks before (c, c)
    assert tokenizer.decode(tokenizer.encode(f"abc{EOT}", allowed_special="all")) == f"abc{EOT}"


def vocab_id(vocab, token):
    return next(i for i, t in vocab.items() if t == token)


@pytest.mark.parametrize(
    "vocab_edit, merges, message",
    [
        (lambda v: v.pop(65), [], "single-byte"),
        (lambda v: v.update({300: b"a"}), [], "same bytes"),
        (lambda v: None, [(b"a", b"b")], "not in the vocab"),
    ],
)
def test_inconsistent_vocab_and_merges_are_clear_errors(vocab_edit, merges, message):
    vocab = {i: bytes([i]) for i in range(256)}
    vocab_edit(vocab)
    with pytest.raises(GptlabError, match=message):
        Tokenizer(vocab, merges)


def test_from_tiktoken_file_recovers_cl100k_merges(cl100k_pair, tiktoken_export, tmp_path):
    """Re-exporting the loaded cl100k tokenizer gives tiktoken the same ranks it read."""
    ours, theirs = cl100k_pair
    assert tiktoken_export(ours)._mergeable_ranks == theirs._mergeable_ranks
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("IQ== 0\nnot-base64!! 1\n")
    with pytest.raises(GptlabError, match="line 2"):
        Tokenizer.from_tiktoken_file(bad)


@pytest.mark.parametrize(
    ("encoder_text", "merges_text", "message"),
    [
        ('{"a": 0', "#version: 0.2\na b\n", "malformed GPT-2 tokenizer files"),
        ('["a", "b"]', "#version: 0.2\n", "must map token strings to ids"),
        ('{"a": 0, "b": 1}', "#version: 0.2\na b c\n", "line 2: expected two tokens"),
        ('{"a": 0, "b": 1}', "#version: 0.2\na \u4e16\n", "is not a byte-level token"),
    ],
)
def test_malformed_gpt2_files_are_clear_errors(tmp_path, encoder_text, merges_text, message):
    encoder, merges = tmp_path / "encoder.json", tmp_path / "vocab.bpe"
    encoder.write_text(encoder_text, encoding="utf-8")
    merges.write_text(merges_text, encoding="utf-8")
    with pytest.raises(GptlabError, match=message):
        Tokenizer.from_gpt2_files(encoder, merges)
    with pytest.raises(GptlabError, match="GPT-2 tokenizer file not found"):
        Tokenizer.from_gpt2_files(encoder, tmp_path / "missing.bpe")


def test_to_tiktoken_gives_the_same_ids(trained, shakespeare_documents):
    text = probe_text(shakespeare_documents)
    encoding = trained.to_tiktoken()
    assert encoding.encode(text) == trained.encode(text)
    special = f"{text[:1000]}{EOT}<|pad|>{text[-1000:]}"
    assert encoding.encode(special, allowed_special="all") == trained.encode(special, allowed_special="all")
    assert encoding.n_vocab == trained.vocab_size


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4", None])
def test_huggingface_export_gives_the_same_ids(tmp_path, shakespeare_documents, pattern):
    from tokenizers import Tokenizer as HFTokenizer

    documents = shakespeare_documents[:3]
    text = probe_text(shakespeare_documents)
    if pattern is None:  # without a pre-split a document is one word: keep it short
        documents, text = [document[:8_000] for document in documents], text[:3000]
    tokenizer = Tokenizer.train(documents, vocab_size=1000, pattern=pattern, special_tokens=[EOT])
    hf = HFTokenizer.from_file(str(tokenizer.save_huggingface(tmp_path / "hf.json")))
    assert hf.encode(text).ids == tokenizer.encode(text)
    assert tokenizer.to_huggingface().encode(text).ids == tokenizer.encode(text)
    with_special = f"one{EOT}two"
    assert hf.encode(with_special).ids == tokenizer.encode(with_special, allowed_special="all")
    assert hf.decode(tokenizer.encode(text), skip_special_tokens=False) == text


def test_pretrained_exports_round_trip_through_tiktoken_and_huggingface(pair, shakespeare_documents, tiktoken_export):
    ours, theirs = pair
    text = shakespeare_documents[0][:50_000] + SAMPLES["multilingual"] + SAMPLES["whitespace"] + SAMPLES["numbers"]
    hf = ours.to_huggingface()  # built once: the build, not the encode, is the slow part
    assert hf.encode(text).ids == theirs.encode(text)
    assert tiktoken_export(ours).encode(text) == theirs.encode(text)
    special = f"a{EOT}b{EOT}"  # cl100k leaves id 100256 unused: the export must keep <|endoftext|> at 100257
    assert hf.encode(special).ids == theirs.encode(special, allowed_special="all")


def test_formats_module_never_imports_the_tokenizer_core():
    """Readers return parts and core builds the Tokenizer: no import of core, not even inside a function."""
    import ast
    from pathlib import Path

    import gptlab.tokenizer.formats as formats_module

    tree = ast.parse(Path(formats_module.__file__).read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.update(f"{node.module}.{alias.name}" for alias in node.names)
    assert "gptlab.runtime.GptlabError" in imported  # the walk sees imports at all
    assert not [name for name in imported if name.startswith(("gptlab.tokenizer.core", "gptlab.tokenizer.Tokenizer"))]
