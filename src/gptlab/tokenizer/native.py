"""The compiled core, when it was built: loading it, or saying once why the pure-Python reference runs.

`pip install` compiles two small C extensions (setup.py): `_fastbpe` (pre-tokenizer
scanners for the gpt2/gpt4/o200k patterns, BPE, piece counting) and `_fasttrain` (the
merge learner). Both give exactly what the pure-Python reference in core.py and
train.py gives; tests/tokenizer/test_native.py proves it. Without a C compiler,
or with GPTLAB_PURE_PYTHON=1 in the environment, the reference runs instead.

Not here: the algorithms (core.py, train.py keep the readable versions).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from gptlab.tokenizer.patterns import GPT2_PATTERN, GPT4_PATTERN, O200K_PATTERN

ENV_PURE_PYTHON = "GPTLAB_PURE_PYTHON"
_warned = False


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
    """The compiled encoder module, or None (pure Python)."""
    return _load("_fastbpe")


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
