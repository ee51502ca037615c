"""What every benchmark prints on top: the machine, the versions, and the command that reruns it.

Not a benchmark itself; the bench scripts import it from their own directory.
"""

from __future__ import annotations

import os
import platform
import shlex
import sys
import time
from importlib import metadata
from pathlib import Path

from gptlab.runs.machine import cpu_model, usable_cores  # the same description a run's machine.json gives

REPO_ROOT = Path(__file__).resolve().parent.parent


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def command_line() -> str:
    """The command that reruns this benchmark, from the repository root."""
    script = Path(sys.argv[0]).resolve()
    try:
        script = script.relative_to(REPO_ROOT)
    except ValueError:
        pass
    return shlex.join([".venv/bin/python", str(script), *sys.argv[1:]])


def header(title: str, packages: list[str]) -> str:
    versions = "  ".join(f"{name} {package_version(name)}" for name in packages)
    return "\n".join(
        [
            f"# {title}",
            f"# machine: {cpu_model()}, {usable_cores()} usable cores (os.cpu_count {os.cpu_count()}), "
            f"{platform.system()} {platform.release()}",
            f"# python {platform.python_version()} ({platform.python_implementation()})  {versions}",
            f"# date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
            f"# command: {command_line()}",
        ]
    )
