"""The environment a user has after `make demo` (and any `make install-EXTRA`), inside the dev one: no second venv.

A command run with `plain_environment(extras)` starts Python with tests/plain_site/ on PYTHONPATH, whose
sitecustomize.py hides every installed distribution outside what the user installed: gptlab's base requirements
and the extras named, followed recursively through the installed distributions' own requirements (with their
markers and extras), plus what `python -m venv` seeds (pip, setuptools). Hidden means what "not installed" means:
`import` raises ModuleNotFoundError, importlib.util.find_spec returns None, importlib.metadata does not list it.

gptlab's own requirements are read from pyproject.toml (this checkout's), the rest from the installed metadata.
"""

from __future__ import annotations

import functools
import json
import os
import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli, a base requirement there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(__file__).resolve().parent / "plain_site"
REFUSE_VARIABLE = "_GPTLAB_TEST_REFUSE"  # read by tests/plain_site/sitecustomize.py
SEEDED = ("pip", "setuptools")  # in every venv `make` creates (Python 3.11's venv seeds both)


def canonical(name: str) -> str:
    """PEP 503's normal form: "Llama_CPP.python" -> "llama-cpp-python"."""
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def gptlab_extras() -> dict[str, tuple[str, ...]]:
    """pyproject.toml's requirements of gptlab: "" for the base, then each extra's."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return {"": tuple(project["dependencies"]), **{k: tuple(v) for k, v in project["optional-dependencies"].items()}}


def _requirements(name: str, extras: frozenset[str]) -> list[Requirement]:
    """The requirements of an installed distribution (gptlab: of this checkout) that hold for these extras."""
    if name == "gptlab":
        texts = [text for extra in ("", *sorted(extras)) for text in gptlab_extras().get(extra, ())]
        return [Requirement(text) for text in texts if Requirement(text).marker is None or Requirement(text).marker.evaluate()]
    try:
        texts = metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        return []
    held = []
    for requirement in map(Requirement, texts):
        if requirement.marker is None or any(requirement.marker.evaluate({"extra": extra}) for extra in ("", *extras)):
            held.append(requirement)
    return held


@functools.cache
def closure(extras: tuple[str, ...] = ()) -> frozenset[str]:
    """The canonical names of every distribution that installing gptlab with these extras brings, found installed."""
    seen: set[tuple[str, frozenset[str]]] = set()
    found = {canonical(name) for name in SEEDED}
    todo = [("gptlab", frozenset(extras))]
    while todo:
        name, wanted = todo.pop()
        if (canonical(name), wanted) in seen:
            continue
        seen.add((canonical(name), wanted))
        found.add(canonical(name))
        todo += [(requirement.name, frozenset(requirement.extras)) for requirement in _requirements(name, wanted)]
    return frozenset(found)


@functools.cache
def refused(extras: tuple[str, ...] = ()) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(top-level modules, distributions) installed here but outside the closure: what the user does not have."""
    allowed = closure(tuple(sorted(extras)))
    modules = sorted(module for module, owners in metadata.packages_distributions().items()
                     if not any(canonical(owner) in allowed for owner in owners))
    distributions = sorted({canonical(d.metadata["Name"]) for d in metadata.distributions()} - allowed)
    return tuple(modules), tuple(distributions)


def plain_environment(env: dict[str, str], extras: tuple[str, ...] = ()) -> dict[str, str]:
    """`env` for a process that sees only what the plain install and these extras hold (and this checkout's gptlab)."""
    modules, distributions = refused(tuple(sorted(extras)))
    return {**env, "PYTHONPATH": os.pathsep.join([str(SITE), str(ROOT / "src")]),
            REFUSE_VARIABLE: json.dumps({"modules": modules, "distributions": distributions})}
