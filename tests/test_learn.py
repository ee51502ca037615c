"""Every snippet of the learning path (docs/learn/*.md) runs as written, so the lessons cannot drift from the code.

Each page's ```python and ```bash blocks run in order in a fresh workspace (a tmp folder as the current folder,
this environment's bin first on PATH, as after `source .venv/bin/activate`, seeing only the plain install and the
extras that the page's `make install-EXTRA` lines before the block install: tests/plain_install.py, the lines
themselves not run): a python block as a script of its own,
a bash block as one script under `set -e`, so a later block may use what an earlier one made (a tokenizer, shards).
Every block must exit 0; the snippets assert the claims they print. A block that must not run here (a GPU-only
command) is preceded by `<!-- not run: the reason -->`, and a marker without a reason fails.

Commands that open the first bash block of several pages (SHARED_STARTS: the same tokenizer and shards) run once
per session (per xdist worker: a few seconds, so the pages stay free to spread over the workers) in an empty folder,
and each of those pages starts from a copy of what they made.

The pages themselves are checked too: the index links every page, and every topic page has its explanation's
companions, the sections "In gptlab", "Run it" and "Try this", with at least one block that runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.plain_install import plain_environment

pytestmark = pytest.mark.slow

LEARN = Path(__file__).resolve().parents[1] / "docs" / "learn"
PAGES = sorted(LEARN.glob("*.md"))
TOPICS = [page for page in PAGES if page.name != "index.md"]
BIN = str(Path(sys.executable).parent)
TIMEOUT = 120  # seconds per block: each is meant to take a few
FENCE = re.compile(r"^\s*```(\w*)\s*$")  # indented too: blocks inside list items
NOT_RUN = re.compile(r"^<!--\s*not run\b:?\s*(.*?)\s*-->$")
SECTIONS = ("In gptlab", "Run it", "Try this")
# glibc hands every allocation over 32 MB (a GPT-2-vocabulary logits tensor) back to the OS when freed, so each eval
# batch pays ~100k page faults again (7 of 13 s of a `gptlab eval` of a GPT-2-vocabulary model); the snippets keep it instead
KEEP_FREED_MEMORY = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 34)}
# Lines that open the first bash block of more than one page, as written there (less a `> /dev/null`): each runs once
# per session in an empty folder, as it would in a page's fresh workspace, and the pages start from a copy of its files
SHARED_STARTS = (
    ("gptlab tokenizer train --corpus shakespeare --vocab-size 2048 --out tok/",
     "gptlab data prepare shakespeare -t tok/ --out data/ --quiet"),  # accumulation, alignment, evaluation, gpt2, parallelism
)
QUIET = " > /dev/null"
INSTALL = re.compile(r"^make install-([\w-]+)\s*(#.*)?$")  # a page's install line: the extra it names, for what follows


@dataclass(frozen=True)
class Block:
    language: str
    code: str
    line: int  # where the fence opens, 1-based, for messages
    not_run: str | None  # the reason given in a `<!-- not run: ... -->` marker, "" if none was given


def read_blocks(page: Path) -> list[Block]:
    """The page's fenced python and bash blocks, each with the skip marker on the line before it (blank lines between allowed)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, index = [], 0
    while index < len(lines):
        opened = FENCE.match(lines[index])
        if not opened:
            index += 1
            continue
        end = next((j for j in range(index + 1, len(lines)) if lines[j].lstrip().startswith("```")), None)
        assert end is not None, f"{page.name}:{index + 1}: a code fence is never closed"
        if opened.group(1) in ("python", "bash"):
            before = next((line.strip() for line in reversed(lines[:index]) if line.strip()), "")
            marker = NOT_RUN.match(before)
            blocks.append(Block(opened.group(1), textwrap.dedent("\n".join(lines[index + 1 : end])) + "\n", index + 1,
                                marker.group(1) if marker else None))
        index = end + 1
    return blocks


def learn_env(extras: tuple[str, ...] = ()) -> dict[str, str]:
    """This environment's tools first, the plain install and these extras only; one thread, so a block's speed and
    numbers do not depend on the host's cores."""
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""), OMP_NUM_THREADS="1", MPLBACKEND="Agg",
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1", **KEEP_FREED_MEMORY)
    return plain_environment(env, extras)


def take_installs(block: Block) -> tuple[Block, tuple[str, ...]]:
    """A bash block less its `make install-EXTRA` lines, and the extras they name."""
    if block.language != "bash":
        return block, ()
    lines = block.code.splitlines()
    extras = tuple(match.group(1) for match in map(INSTALL.match, lines) if match)
    kept = [line for line in lines if not INSTALL.match(line)]
    return Block(block.language, "\n".join(kept) + "\n", block.line, block.not_run), extras


def run_block(block: Block, page: Path, workspace: Path, number: int, extras: tuple[str, ...] = ()) -> None:
    """Run one block in the page's workspace; fail naming the page, the block's line and its output."""
    if block.language == "python":
        script = workspace / f".block_{number}.py"
        script.write_text(block.code, encoding="utf-8")
        command = [sys.executable, script.name]
    else:
        script = workspace / f".block_{number}.sh"
        # ERR trap: name the command that failed, not just the block
        script.write_text("set -eo pipefail\ntrap 'echo \"failed: $BASH_COMMAND\" >&2' ERR\n" + block.code, encoding="utf-8")
        command = ["bash", script.name]
    where = f"{page.relative_to(LEARN.parents[1])}:{block.line} ({block.language} block {number})"
    try:
        result = subprocess.run(command, cwd=workspace, env=learn_env(extras), capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{where} ran past {TIMEOUT} s; the learning path's snippets must take seconds")
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-4000:]
        pytest.fail(f"{where} exited {result.returncode}:\n{output}")


def shared_start(blocks: list[Block]) -> tuple[str, ...]:
    """The SHARED_STARTS entry that the page's first bash block that runs opens with, or () if none."""
    first = next((block for block in blocks if block.language == "bash" and block.not_run is None), None)
    lines = tuple(line.removesuffix(QUIET) for line in first.code.splitlines()) if first else ()
    return next((start for start in SHARED_STARTS if lines[:len(start)] == start), ())


@pytest.fixture(scope="session")
def started() -> dict[tuple[str, ...], tuple[Path, int, str]]:
    """Each shared start once run: the folder it made, its exit status and output (filled by the first page to need it)."""
    return {}


def run_shared_start(start: tuple[str, ...], started: dict, tmp_path_factory) -> tuple[Path, int, str]:
    """Run the start's lines, as a bash block of their own, in an empty folder once per session."""
    if start not in started:
        folder = tmp_path_factory.mktemp("learn_start")
        script = folder.parent / f"{folder.name}.sh"  # beside the folder: only the commands' files go into the copies
        script.write_text("set -eo pipefail\n" + "\n".join(start) + "\n", encoding="utf-8")
        try:
            result = subprocess.run(["bash", str(script)], cwd=folder, env=learn_env(), capture_output=True, text=True, timeout=TIMEOUT)
            started[start] = (folder, result.returncode, (result.stdout + result.stderr)[-4000:])
        except subprocess.TimeoutExpired:
            started[start] = (folder, -1, f"ran past {TIMEOUT} s; the learning path's snippets must take seconds")
    return started[start]


@pytest.mark.parametrize("page", PAGES, ids=[page.stem for page in PAGES])
def test_learn_page_snippets_run(page: Path, tmp_path: Path, started, tmp_path_factory) -> None:
    blocks = read_blocks(page)
    start = shared_start(blocks)
    extras: tuple[str, ...] = ()
    for number, block in enumerate(blocks, start=1):
        if block.not_run is not None:
            assert block.not_run, f"{page.name}:{block.line}: `<!-- not run -->` needs a reason: `<!-- not run: why -->`"
            continue
        if start and block.language == "bash":  # the page's first bash block: its opening lines already ran
            folder, code, output = run_shared_start(start, started, tmp_path_factory)
            assert code == 0, f"{page.name}:{block.line}: its opening lines exited {code}:\n{output}"
            shutil.copytree(folder, tmp_path, symlinks=True, dirs_exist_ok=True)
            block = Block(block.language, "\n".join(block.code.splitlines()[len(start):]) + "\n", block.line, block.not_run)
            start = ()
        block, installed = take_installs(block)
        extras = tuple(sorted({*extras, *installed}))
        run_block(block, page, tmp_path, number, extras)


@pytest.mark.parametrize("page", TOPICS, ids=[page.stem for page in TOPICS])
def test_learn_page_has_explanation_code_and_experiment(page: Path) -> None:
    headings = {line.lstrip("#").strip() for line in page.read_text(encoding="utf-8").splitlines() if line.startswith("## ")}
    missing = [section for section in SECTIONS if section not in headings]
    assert not missing, f"{page.name} lacks the section(s) {missing} (## {' / ## '.join(SECTIONS)})"
    assert any(block.not_run is None for block in read_blocks(page)), f"{page.name} has no ```python or ```bash block that runs"


def test_learn_index_links_every_page() -> None:
    index = (LEARN / "index.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([\w-]+\.md)(?:#[\w-]*)?\)", index))
    assert linked <= {page.name for page in TOPICS}, f"the index links pages that do not exist: {sorted(linked - {p.name for p in TOPICS})}"
    assert {page.name for page in TOPICS} <= linked, f"pages the index does not list: {sorted({p.name for p in TOPICS} - linked)}"


def test_read_blocks_finds_markers_and_reasons(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n```python\nprint(1)\n```\n<!-- not run: needs a GPU -->\n\n```bash\nnvidia-smi\n```\n"
                    "<!-- not run -->\n```bash\nfalse\n```\n```text\nnot code\n```\n- item\n\n  ```python\n  print(2)\n  ```\n", encoding="utf-8")
    blocks = read_blocks(page)
    assert [(block.language, block.line, block.not_run) for block in blocks] == [
        ("python", 2, None), ("bash", 7, "needs a GPU"), ("bash", 11, ""), ("python", 19, None)]
    assert blocks[-1].code == "print(2)\n"


def test_install_lines_name_the_extras_and_are_not_run() -> None:
    block = Block("bash", "make install-hf   # transformers\ngptlab model info --preset gpt2\nmake install-harness\n", 3, None)
    kept, extras = take_installs(block)
    assert extras == ("hf", "harness") and kept.code == "gptlab model info --preset gpt2\n"
    assert take_installs(Block("python", "make install-hf\n", 1, None)) == (Block("python", "make install-hf\n", 1, None), ())
