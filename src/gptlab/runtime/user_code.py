"""Code a user hands gptlab as a file: a .py file run as a module without installing it, and an exception's message
in one line for the error that names it. Used by the stages that take user functions (reward functions in
gptlab.align.rl.rewards, tools in gptlab.tools.registry), so both load and report a file the same way.

    module = load_module_from_file("my_rewards.py", "reward 'my_rewards.py:brevity'")
    -> the module; or GptlabError("reward 'my_rewards.py:brevity': file my_rewards.py not found; give the path ...")

Not here: choosing a function of the module, or what a stage does with it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from gptlab.runtime.errors import GptlabError


def load_module_from_file(path: str | Path, purpose: str) -> ModuleType:
    """The module run from a .py file, under a name made from its path (so two files called tools.py differ).
    `purpose` opens every error message, naming what the file was given for (e.g. "reward 'my.py:brevity'")."""
    path = Path(path)
    if not path.is_file():
        raise GptlabError(f"{purpose}: file {path} not found; give the path of a .py file (relative to {Path.cwd()})")
    resolved = path.resolve()
    module_name = f"gptlab_user_{resolved.stem}_{hashlib.sha1(str(resolved).encode()).hexdigest()[:8]}"
    module_spec = importlib.util.spec_from_file_location(module_name, resolved)
    assert module_spec is not None and module_spec.loader is not None  # a .py path always has a source loader
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # dataclasses and pickle look the module up while it runs
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[module_name]
        raise GptlabError(f"{purpose}: running {path} raised {type(error).__name__}: {first_line(error)}; fix the file") from None
    return module


def public_functions(module: ModuleType) -> dict[str, Callable]:
    """The functions a module defines itself (not imported ones) whose names do not start with "_", in file order."""
    return {name: value for name, value in vars(module).items()
            if inspect.isfunction(value) and value.__module__ == module.__name__ and not name.startswith("_")}


def first_line(error: BaseException) -> str:
    """The first line of an exception's message, or "(no message)": what a one-line error quotes of it."""
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"
