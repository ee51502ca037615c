"""Hides the distributions a plain install would not have (tests/plain_install.py), at this interpreter's start.

$_GPTLAB_TEST_REFUSE holds {"modules": [top-level names], "distributions": [canonical names]}. Every import
finder is wrapped so that a hidden module is not found (ModuleNotFoundError, find_spec None) and a hidden
distribution is not listed by importlib.metadata; child processes inherit the variable, so they see the same.
"""

import json
import os
import re
import sys

_REFUSED = json.loads(os.environ.get("_GPTLAB_TEST_REFUSE") or '{"modules": [], "distributions": []}')
_MODULES = frozenset(_REFUSED["modules"])
_DISTRIBUTIONS = frozenset(_REFUSED["distributions"])


class _Hiding:
    """One of sys.meta_path's finders, blind to the hidden modules and distributions."""

    def __init__(self, finder):
        self._finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _MODULES or not hasattr(self._finder, "find_spec"):
            return None
        return self._finder.find_spec(name, path, target)

    def find_distributions(self, *args, **kwargs):
        find = getattr(self._finder, "find_distributions", None)
        for distribution in find(*args, **kwargs) if find else ():
            if re.sub(r"[-_.]+", "-", distribution.metadata["Name"] or "").lower() not in _DISTRIBUTIONS:
                yield distribution

    def invalidate_caches(self):
        if hasattr(self._finder, "invalidate_caches"):
            self._finder.invalidate_caches()


if _MODULES or _DISTRIBUTIONS:
    sys.meta_path[:] = [_Hiding(finder) for finder in sys.meta_path]
