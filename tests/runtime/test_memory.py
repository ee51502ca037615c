"""keep_freed_memory: glibc then reuses freed temporaries instead of mapping (and faulting in) new pages every step."""

import json
import os
import subprocess
import sys

import pytest

from gptlab.runtime.memory import user_set_malloc

# A 16 MB block: is it mapped on its own (mallinfo2's hblkhd grows by it), and is its memory kept after free?
PROBE = """
import ctypes, json, sys, torch
from gptlab.runtime.memory import keep_freed_memory
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
applied = keep_freed_memory() if sys.argv[1] == "tuned" else False
before = libc.mallinfo2()
block = torch.empty(4 * 2**20)
mapped = libc.mallinfo2().hblkhd - before.hblkhd
del block
kept = libc.mallinfo2().arena - before.arena
print(json.dumps({"applied": applied, "mapped": mapped, "kept": kept}))
"""



def glibc_version() -> tuple[int, ...]:
    """(2, 36) under glibc, () elsewhere."""
    name = os.confstr("CS_GNU_LIBC_VERSION") if sys.platform.startswith("linux") else None
    return tuple(int(part) for part in name.split()[1].split(".")[:2]) if name and name.startswith("glibc") else ()


glibc = pytest.mark.skipif(glibc_version() < (2, 33), reason="mallopt's thresholds and mallinfo2 are glibc's (2.33 or later)")


def probe(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
    result = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, env=env)
    return json.loads(result.stdout)


@glibc
def test_freed_blocks_are_reused_instead_of_remapped():
    default, tuned = probe("default"), probe("tuned")
    assert tuned["applied"] is True
    size = 16 * 2**20
    # glibc's default: a block this size gets its own mapping, unmapped (and faulted in afresh) next time
    assert default["mapped"] >= size and default["kept"] < size
    # tuned: it comes from the heap and stays there for the next step
    # (the arena grows by the block less whatever free space its top already had: a few pages, depending on imports)
    assert tuned["mapped"] == 0 and tuned["kept"] >= size - 2**20


def test_a_users_own_malloc_settings_are_left_alone(monkeypatch):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    for name in [n for n in os.environ if n.startswith("MALLOC_")]:
        monkeypatch.delenv(name)
    assert not user_set_malloc()
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    assert user_set_malloc()
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    assert user_set_malloc()
