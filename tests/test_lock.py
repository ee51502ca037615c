"""requirements.lock: the suite runs with exactly the versions it pins, and it pins every dependency."""

import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

LOCK = Path(__file__).resolve().parents[1] / "requirements.lock"


def locked() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def test_every_installed_dependency_has_the_locked_version():
    pins = locked()
    wrong = []
    for distribution in metadata.distributions():
        name = canonicalize_name(distribution.metadata["Name"])
        local = re.sub(r"\+.*$", "", distribution.version)  # torch 2.13.0+cpu is the lock's 2.13.0
        if name in pins and pins[name] != local:
            wrong.append(f"{name} {distribution.version} (locked {pins[name]})")
    assert not wrong, "installed versions differ from requirements.lock: " + ", ".join(wrong)


def requirements_with(extras: set[str], requirements: list[Requirement]) -> list[Requirement]:
    """gptlab's requirements that hold with these extras, an extra naming others (dev: gptlab[all,llama]) expanded."""
    wanted = {"", *extras}
    while True:
        held = [r for r in requirements if r.marker is None or any(r.marker.evaluate({"extra": extra}) for extra in wanted)]
        more = {extra for r in held if canonicalize_name(r.name) == "gptlab" for extra in r.extras} - wanted
        if not more:
            break
        wanted |= more
    return [r for r in held if canonicalize_name(r.name) != "gptlab"]


def test_an_extra_naming_other_extras_brings_their_requirements():
    requirements = [Requirement(text) for text in ['a; extra == "x"', 'gptlab[x]; extra == "all"', 'gptlab[all]; extra == "dev"',
                                                   'b; extra == "dev"', 'c; extra == "y"', "d"]]
    assert [r.name for r in requirements_with({"dev"}, requirements)] == ["a", "b", "d"]
    assert [r.name for r in requirements_with(set(), requirements)] == ["d"]


def test_the_lock_pins_every_requirement_of_gptlab_and_its_dev_extras():
    pins = locked()
    requirements = [Requirement(text) for text in metadata.requires("gptlab") or []]
    needed = requirements_with({"dev"}, requirements)  # here: tomli is for 3.10
    missing = [str(r.name) for r in needed if canonicalize_name(r.name) not in pins]
    assert not missing, f"requirements.lock lacks {missing}: run `make lock`"
    assert "regex" in pins and "torch" in pins
