"""o200k_base without an offline package (gptlab.tokenizer.tiktoken_files): found in $GPTLAB_TOKENIZER_FILES or in
tiktoken's own cache (named as tiktoken names it), else downloaded with the sha256 checked. Every test uses a small
fake rank file it writes itself and file:// URLs: no network."""

import base64
import hashlib
import tempfile
from pathlib import Path

import pytest
import tiktoken
import tiktoken.load

from gptlab.runtime import GptlabError
from gptlab.tokenizer import pretrained
from gptlab.tokenizer.patterns import O200K_PATTERN
from gptlab.tokenizer.pretrained import O200K_SPECIAL_TOKENS, available_offline, load_any
from gptlab.tokenizer.tiktoken_files import O200K_BASE, TiktokenFile, cache_dir, cached_path, find_tiktoken_file

MERGED = [b"he", b"ll", b"llo", b"hello", b" w", b"or", b" wor", b"ld", b" world"]  # each is two lower-ranked tokens
TEXT = "hello world<|endofprompt|> Hello, wörld! 😀<|endoftext|>"


def fake_ranks() -> dict[bytes, int]:
    ranks = {bytes([b]): b for b in range(256)}
    ranks.update({token: 256 + n for n, token in enumerate(MERGED)})
    return ranks


def write_fake(path: Path) -> bytes:
    data = b"".join(base64.b64encode(token) + b" " + str(rank).encode() + b"\n" for token, rank in fake_ranks().items())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


def reference(ranks) -> tiktoken.Encoding:
    return tiktoken.Encoding(name="fake_o200k", pat_str=O200K_PATTERN, mergeable_ranks=ranks, special_tokens=O200K_SPECIAL_TOKENS)


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """No user folder, tiktoken's cache under tmp_path: nothing outside the test is read or written."""
    monkeypatch.delenv("GPTLAB_TOKENIZER_FILES", raising=False)
    monkeypatch.delenv("DATA_GYM_CACHE_DIR", raising=False)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))


def test_o200k_loads_from_gptlab_tokenizer_files_with_tiktokens_ids(monkeypatch, tmp_path):
    write_fake(tmp_path / "files" / "o200k_base.tiktoken")
    assert not available_offline("o200k_base")
    monkeypatch.setenv("GPTLAB_TOKENIZER_FILES", str(tmp_path / "files"))
    assert available_offline("o200k_base")
    tokenizer = load_any("o200k_base")
    assert tokenizer.encode(TEXT, allowed_special="all") == reference(fake_ranks()).encode(TEXT, allowed_special="all")
    assert tokenizer.special_tokens == O200K_SPECIAL_TOKENS


def test_o200k_cache_file_is_the_one_tiktoken_reads_and_is_used_only_when_its_hash_matches(monkeypatch, tmp_path):
    data = write_fake(cached_path(O200K_BASE))
    assert cached_path(O200K_BASE).parent == tmp_path / "cache"
    fake = TiktokenFile(name=O200K_BASE.name, url=O200K_BASE.url, sha256=hashlib.sha256(data).hexdigest())
    # tiktoken itself finds the same file (no network: a cached file with the expected hash is returned as it is)
    assert tiktoken.load.read_file_cached(O200K_BASE.url, fake.sha256) == data
    assert find_tiktoken_file(O200K_BASE, download=False) is None  # the published hash differs: not o200k_base
    monkeypatch.setattr(pretrained, "O200K_BASE", fake)
    assert available_offline("o200k_base")
    ids = load_any("o200k_base").encode(TEXT, allowed_special="all")
    assert ids == reference(tiktoken.load.load_tiktoken_bpe(O200K_BASE.url, fake.sha256)).encode(TEXT, allowed_special="all")


def test_o200k_cache_folder_follows_tiktokens_variables(monkeypatch, tmp_path):
    assert cache_dir() == tmp_path / "cache"
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR")
    monkeypatch.setenv("DATA_GYM_CACHE_DIR", str(tmp_path / "gym"))
    assert cache_dir() == tmp_path / "gym"
    monkeypatch.delenv("DATA_GYM_CACHE_DIR")
    assert cache_dir() == Path(tempfile.gettempdir()) / "data-gym-cache"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    assert cache_dir() is None and cached_path(O200K_BASE) is None  # caching off, as in tiktoken


def test_o200k_download_is_hash_checked_and_cached_atomically(tmp_path):
    data = write_fake(tmp_path / "server" / "o200k_base.tiktoken")
    url = (tmp_path / "server" / "o200k_base.tiktoken").as_uri()
    wrong = TiktokenFile(name="o200k_base.tiktoken", url=url, sha256="0" * 64)
    with pytest.raises(GptlabError, match="sha256 .* expected 0{64}; not used"):
        find_tiktoken_file(wrong)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())  # nothing half-written
    right = TiktokenFile(name="o200k_base.tiktoken", url=url, sha256=hashlib.sha256(data).hexdigest())
    path = find_tiktoken_file(right)
    assert path == cached_path(right) and path.read_bytes() == data
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary file left beside it
    (tmp_path / "server" / "o200k_base.tiktoken").unlink()
    assert find_tiktoken_file(right) == path  # the second time from the cache


def test_o200k_failed_download_says_how_to_provide_the_file_in_one_line(monkeypatch, tmp_path):
    missing = TiktokenFile(name="o200k_base.tiktoken", url=(tmp_path / "nowhere.tiktoken").as_uri(), sha256=O200K_BASE.sha256)
    monkeypatch.setattr(pretrained, "O200K_BASE", missing)
    with pytest.raises(GptlabError) as error:
        load_any("o200k_base")
    message = str(error.value)
    assert "\n" not in message and "could not download o200k_base.tiktoken" in message and "GPTLAB_TOKENIZER_FILES" in message
    assert not available_offline("o200k_base")
