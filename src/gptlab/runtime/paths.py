"""Where gptlab keeps downloaded and derived data.

The cache is `$GPTLAB_CACHE` if set, else `$XDG_CACHE_HOME/gptlab`, else
`~/.cache/gptlab`. Nothing is created until a caller asks for a directory.
"""

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """Return (and create) a directory inside the gptlab cache."""
    root = os.environ.get("GPTLAB_CACHE")
    if root:
        base = Path(root)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg) / "gptlab" if xdg else Path.home() / ".cache" / "gptlab"
    path = base.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
