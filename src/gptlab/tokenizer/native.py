"""The compiled core, when it was built: loading it, or saying once why the pure-Python reference runs.

`pip install` compiles two small C extensions (setup.py): `_fastbpe` (pre-tokenizer
scanners for the gpt2/gpt4/o200k patterns, BPE, piece counting) and `_fasttrain` (the
merge learner). Both give exactly what the pure-Python reference in core.py and
train.py gives; tests/tokenizer/test_native.py proves it. The scanners' character
classes are read from the installed `regex` module at first use (`char_class_table`),
so both sides follow the same Unicode version whatever `regex` release is installed. Without a C compiler,
or with GPTLAB_PURE_PYTHON=1 in the environment, the reference runs instead.

Not here: the algorithms (core.py, train.py keep the readable versions).
"""

from __future__ import annotations

import array
import importlib
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

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


def char_class_table(flags: dict[str, int]) -> bytes:
    """One byte per code point: the OR of `flags[name]` for every class of CHAR_CLASSES holding it (~0.1 s)."""
    import regex

    everything = array.array("I", range(N_CODE_POINTS)).tobytes().decode("utf-32-le", "surrogatepass")
    table = 0
    for name, pattern in CHAR_CLASSES.items():
        flag, layer = bytes([flags[name]]), bytearray(N_CODE_POINTS)
        for run in regex.finditer(f"(?:{pattern})+", everything):
            start, end = run.span()
            layer[start:end] = flag * (end - start)
        table |= int.from_bytes(layer, "little")
    return table.to_bytes(N_CODE_POINTS, "little")


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
                module.set_char_classes(char_class_table(flags))
    return module


def fasttrain() -> ModuleType | None:
    """The compiled merge learner, or None (pure Python)."""
    return _load("_fasttrain")


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
