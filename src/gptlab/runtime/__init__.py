"""Runtime: errors, paths and file helpers shared by every stage. Imports nothing else of gptlab."""

from gptlab.runtime.errors import GptlabError
from gptlab.runtime.files import atomic_path, atomic_write, atomic_write_bytes, atomic_write_text, check_out_dir, read_json, read_text
from gptlab.runtime.paths import cache_dir
from gptlab.runtime.processes import default_workers, process_context

__all__ = [
    "GptlabError",
    "atomic_path",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_text",
    "cache_dir",
    "check_out_dir",
    "default_workers",
    "process_context",
    "read_json",
    "read_text",
]
