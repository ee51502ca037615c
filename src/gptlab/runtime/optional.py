"""Optional packages and how a user reaches gptlab: what a command needs beyond the plain install, said in one line.

`require("lm_eval", extra="harness", purpose="--harness")` imports and returns the module, or raises a
GptlabError naming the extra that holds it and the make target that installs it, so a missing package reads as
one line, not a traceback. The extras are pyproject.toml's [project.optional-dependencies]; each has a target
`make install-EXTRA` (and `make install-all` installs all of them but llama, which compiles llama.cpp).

`gptlab_command()` is how to type gptlab from here: `gptlab` when it is on PATH, else the path of the one running
(`.venv/bin/gptlab` after `make demo`, before `source .venv/bin/activate`).
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

from gptlab.runtime.errors import GptlabError

# the distribution pip installs for a module whose name differs from it
DISTRIBUTIONS = {"llama_cpp": "llama-cpp-python", "lm_eval": "lm-eval", "fasttext": "fasttext-wheel"}


def require(module: str, *, extra: str, purpose: str, needs: str | None = None) -> ModuleType:
    """The module, imported; if the optional package it needs (`needs`, else the module's own top-level name) is
    missing, a GptlabError naming that package, the extra holding it and the make target that installs it."""
    needed = needs or module.partition(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as error:
        if (error.name or "").partition(".")[0] != needed:
            raise
        package = DISTRIBUTIONS.get(needed, needed)
        raise GptlabError(f"{purpose} needs the {package} package, from gptlab's {extra!r} extra: "
                          f"make install-{extra} (or pip install 'gptlab[{extra}]')") from None


def gptlab_command() -> str:
    """`gptlab` if that name runs this gptlab, else a path to the running one: what a hint tells the user to type."""
    running = sys.argv[0] if sys.argv else ""
    found = shutil.which("gptlab")
    if Path(running).name != "gptlab" or not os.path.isfile(running):  # python -m gptlab, or gptlab used as a library
        beside = Path(sys.executable).parent / "gptlab"  # the script of the environment running this
        if found and (not beside.is_file() or os.path.samefile(found, beside)):
            return "gptlab"
        return _as_typed(beside) if beside.is_file() else f"{sys.executable} -m gptlab"
    if found and os.path.samefile(found, running):
        return "gptlab"
    return _as_typed(Path(running))


def _as_typed(path: Path) -> str:
    """A path as a user types it from the current folder: .venv/bin/gptlab below it, ./gptlab in it, else absolute."""
    path = Path(os.path.abspath(path))
    try:
        relative = path.relative_to(Path.cwd())
    except ValueError:
        return str(path)
    return relative.as_posix() if len(relative.parts) > 1 else f"./{relative}"


def activation_hint(command: str) -> str:
    """For a command typed by its path (.venv/bin/gptlab): how to put gptlab on PATH instead; "" if nothing to say."""
    activate = Path(command).parent / "activate"
    if command == "gptlab" or not activate.is_file():
        return ""
    return f"to type gptlab alone: source {activate.as_posix()}"
