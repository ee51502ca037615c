"""The compiled scanners' character-class table is kept on disk, and a bad or unwritable cache changes nothing."""

from gptlab.tokenizer import native

FLAGS = {name: 1 << bit for bit, name in enumerate(native.CHAR_CLASSES)}


def test_the_table_is_built_once_then_read_back_equal(tmp_path, monkeypatch):
    monkeypatch.setenv("GPTLAB_CACHE", str(tmp_path))
    built = native.cached_char_class_table(FLAGS)
    assert built == native.char_class_table(FLAGS)
    [file] = (tmp_path / "tokenizer").glob("char_classes_*.bin")
    monkeypatch.setattr(native, "char_class_table", lambda flags: (_ for _ in ()).throw(AssertionError("rebuilt")))
    assert native.cached_char_class_table(FLAGS) == built  # read, not rebuilt
    assert file.stat().st_size == len(built)
    other = {name: flag << 1 for name, flag in FLAGS.items()}
    monkeypatch.undo()
    monkeypatch.setenv("GPTLAB_CACHE", str(tmp_path))
    assert native.cached_char_class_table(other) != built  # other flags: another file
    assert len(list((tmp_path / "tokenizer").glob("char_classes_*.bin"))) == 2


def test_a_damaged_file_is_rebuilt_and_an_unwritable_cache_is_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("GPTLAB_CACHE", str(tmp_path))
    good = native.cached_char_class_table(FLAGS)
    [file] = (tmp_path / "tokenizer").glob("char_classes_*.bin")
    file.write_bytes(good[:1000])  # cut short
    assert native.cached_char_class_table(FLAGS) == good and file.read_bytes() == good
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("GPTLAB_CACHE", str(blocked))
    assert native.cached_char_class_table(FLAGS) == good
