"""The compiled core, when it was built: loading it, or saying once why the pure-Python reference runs.

`pip install` compiles four small C extensions (setup.py): for byte-level BPE, `_fastbpe`
(pre-tokenizer scanners for the gpt2/gpt4/o200k patterns, BPE, piece counting) and `_fasttrain`
(the merge learner); for SentencePiece, `_spbpe` (the encoder) and `_sptrain` (the merge learner).
Each gives exactly what its pure-Python reference (core.py, train.py, sentencepiece.py, sp_train.py)
gives; tests/tokenizer/test_native.py, test_spbpe.py and test_sp_train_native.py prove it. The scanners' character
classes are read from the installed `regex` module at first use (`char_class_table`),
so both sides follow the same Unicode version whatever `regex` release is installed. Without a C compiler,
or with GPTLAB_PURE_PYTHON=1 in the environment, the reference runs instead.

Not here: the algorithms (core.py, train.py keep the readable versions).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from gptlab.runtime import atomic_write_bytes, cache_dir
from gptlab.tokenizer.patterns import GPT2_PATTERN, GPT4_PATTERN, O200K_PATTERN

ENV_PURE_PYTHON = "GPTLAB_PURE_PYTHON"
_warned = False
_classes_lock = threading.Lock()

# The classes the C scanners test, as the split patterns write them; each sets the bit CLASS_<name>.
CHAR_CLASSES = {
    "LETTER": r"\p{L}",
    "NUMBER": r"\p{N}",
    "SPACE": r"\s",
    "UPPERISH": r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]",  # o200k's first letter class
    "LOWERISH": r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]",  # o200k's second letter class
}
N_CODE_POINTS = 0x110000
PLANE = 1 << 16  # code points per Unicode plane


def _class_parts(pattern: str) -> list[str]:
    r"""The properties a class is the union of: r"\p{L}" -> [r"\p{L}"], r"[\p{Ll}\p{M}]" -> [r"\p{Ll}", r"\p{M}"]."""
    parts = re.findall(r"\\p\{\w+\}|\\s", pattern)
    if pattern not in ("".join(parts), f"[{''.join(parts)}]") or not parts:
        raise ValueError(f"character class {pattern!r} is not a union of \\p{{...}} and \\s")
    return parts


def _plane_zero() -> bytes:
    """Code points 0..65535 as UTF-32-LE (low byte, middle byte, 0, 0), written byte by byte: faster than array("I", range(...))."""
    data = bytearray(4 * PLANE)
    data[0::4] = bytes(range(256)) * 256
    data[1::4] = b"".join(bytes([middle]) * 256 for middle in range(256))
    return bytes(data)


def _plane(number: int, plane_zero: bytes) -> str:
    """The 65,536 code points of one Unicode plane, in order (surrogates included), as a string."""
    data = bytearray(plane_zero)
    data[2::4] = bytes([number]) * PLANE  # byte 2 of each code point is its plane
    return data.decode("utf-32-le", "surrogatepass")


def _assigned_spans(regex, plane: str) -> list[tuple[int, int]]:
    """Stretches of a plane that hold every code point of any class: all but the unassigned (Cn) and private-use (Co) ones.

    By Unicode's definitions no letter, number, mark or white space is unassigned or private use
    (tests/tokenizer/test_native.py checks the table against a scan of every code point).
    Gaps under 1024 stay in, for fewer scans.
    """
    spans: list[tuple[int, int]] = []
    private = regex.compile(r"\p{Co}+")
    for run in regex.finditer(r"\P{Cn}+", plane):
        start, end = run.span()
        if private.fullmatch(plane, start, end):  # planes 15 and 16 hold nothing else
            continue
        if spans and start - spans[-1][1] < 1024:
            start = spans.pop()[0]
        spans.append((start, end))
    return spans


def _plane_classes(regex, plane: str, scans: list) -> bytearray:
    """The table's bytes for one plane: each (finditer, add_flag) in `scans` ORs its flag over its runs."""
    table = bytearray(PLANE)
    for span_start, span_end in _assigned_spans(regex, plane):
        for finditer, add_flag in scans:
            for run in finditer(plane, span_start, span_end):
                start, end = run.span()
                table[start:end] = table[start:end].translate(add_flag)
    return table


def char_class_table(flags: dict[str, int]) -> bytes:
    r"""One byte per code point: the OR of `flags[name]` for every class of CHAR_CLASSES holding it.

    Every process builds it on its first compiled encode or train, so it is kept cheap (~20 ms, not 0.13 s):
    each property the classes name (\p{L}, \p{Lo}, \s, ...) is scanned once, as `regex` scans one property
    several times faster than a [...] set; only assigned code points are scanned, one plane at a time
    (a few small strings, not one of 4 MB).
    """
    import regex

    property_flags: dict[str, int] = {}
    for name, pattern in CHAR_CLASSES.items():
        for part in _class_parts(pattern):
            property_flags[part] = property_flags.get(part, 0) | flags[name]
    scans = [(regex.compile(f"{part}+").finditer, bytes(value | flag for value in range(256))) for part, flag in property_flags.items()]
    plane_zero = _plane_zero()
    return b"".join(_plane_classes(regex, _plane(number, plane_zero), scans) for number in range(N_CODE_POINTS // PLANE))


def _load(name: str) -> ModuleType | None:
    global _warned
    if os.environ.get(ENV_PURE_PYTHON, "") not in ("", "0"):
        return None
    try:
        module = importlib.import_module(f"gptlab.tokenizer.{name}")
    except ImportError as error:
        if not _warned:
            _warned = True
            print(
                f"gptlab: the compiled tokenizer core is not built ({error}); using the pure-Python tokenizer, "
                "which is several times slower. Reinstall with a C compiler (e.g. `apt install build-essential`, "
                "then `pip install -e .`) to build it.",
                file=sys.stderr,
            )
        return None
    return module


def fastbpe() -> ModuleType | None:
    """The compiled encoder module, its character classes set, or None (pure Python)."""
    module = _load("_fastbpe")
    if module is not None and not module.has_char_classes():
        with _classes_lock:
            if not module.has_char_classes():
                flags = {name: getattr(module, f"CLASS_{name}") for name in CHAR_CLASSES}
                module.set_char_classes(cached_char_class_table(flags))
    return module


def cached_char_class_table(flags: dict[str, int]) -> bytes:
    """`char_class_table`, kept on disk: it costs ~20 ms, a training run on a small corpus ~10 ms more.

    The file's name holds a hash of the `regex` release (its Unicode data), the classes and their flags, so a new
    release or class builds a new table; a file of the wrong size is rebuilt; a cache that cannot be written is skipped.
    """
    import regex

    key = hashlib.sha256(repr((regex.__version__, sorted(CHAR_CLASSES.items()), sorted(flags.items()))).encode()).hexdigest()[:16]
    try:
        path = cache_dir("tokenizer") / f"char_classes_{key}.bin"
    except OSError:  # no cache folder can be made (a read-only home): build the table each time
        return char_class_table(flags)
    if path.is_file() and path.stat().st_size == N_CODE_POINTS:
        return path.read_bytes()
    table = char_class_table(flags)
    try:
        atomic_write_bytes(path, table)
    except OSError:
        pass  # a read-only cache folder: build it each time, as before
    return table


def fasttrain() -> ModuleType | None:
    """The compiled merge learner, or None (pure Python)."""
    return _load("_fasttrain")


def spbpe() -> ModuleType | None:
    """The compiled SentencePiece BPE encoder (_spbpe.c), or None (pure Python)."""
    return _load("_spbpe")


def sptrain() -> ModuleType | None:
    """The compiled SentencePiece piece learner (_sptrain.c), or None (pure Python)."""
    return _load("_sptrain")


def scanner_id(regex_text: str | None) -> int | None:
    """The C scanner for a split pattern: 0 none, 1 gpt2, 2 gpt4, 3 o200k; None when only `regex` can split it."""
    if regex_text is None:
        return 0
    return {GPT2_PATTERN: 1, GPT4_PATTERN: 2, O200K_PATTERN: 3}.get(regex_text)


@contextmanager
def pure_python() -> Iterator[None]:
    """Run the pure-Python reference for everything built or called inside (to compare or time it).

    A Tokenizer keeps the choice made at its first encode, so one built and used inside stays pure Python.
    """
    before = os.environ.get(ENV_PURE_PYTHON)
    os.environ[ENV_PURE_PYTHON] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[ENV_PURE_PYTHON]
        else:
            os.environ[ENV_PURE_PYTHON] = before
