"""The import graph between stages (STYLE.md, Layout): a forbidden edge fails here."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "gptlab"
ALLOWED = {
    "runtime": set(),
    "tokenizer": {"runtime"},
    "data": {"runtime", "tokenizer"},
    "kernels": {"runtime"},
    "model": {"runtime", "kernels"},
    "load": {"runtime", "model", "tokenizer", "data", "infer"},  # a model a user names, with its tokenizer (and infer's
    # quantising and draft check for decoding): below all who load one
    "infer": {"runtime", "model"},
    "chat": {"runtime", "tokenizer", "data"},
    "eval": {"runtime", "model", "data", "infer", "chat", "load"},
    "runs": {"runtime", "model"},
    "parallel": {"runtime"},
    "train": {"runtime", "model", "data", "eval", "runs", "parallel", "load"},
    "align": {"runtime", "train", "chat", "infer", "eval", "model", "data", "load", "tools"},
    "curate": {"runtime", "data"},
    "scaling": {"runtime", "train", "model", "data", "runs", "load"},  # runs: a run's metrics.jsonl, pyplot on Agg
    "serve": {"runtime", "infer", "chat", "model", "tokenizer", "load", "tools"},
    "tools": {"runtime", "eval", "chat", "tokenizer", "infer", "load"},  # tools a chat model calls; python runs in eval's sandbox
    "export": {"runtime", "model", "tokenizer", "chat", "load"},
    "cli": {"*"},
    "pipeline": {"*"},
    "tracks": {"runtime", "train", "pipeline"},  # record tracks: a budget and a history of runs of the pipeline
    "__main__": {"*"},
}


def _gptlab_imports(path: Path) -> set[str]:
    stages = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "gptlab" and len(parts) > 1:
                stages.add(parts[1])
    return stages


def test_layering_every_import_follows_the_stage_graph():
    violations = []
    for path in SRC.rglob("*.py"):
        relative = path.relative_to(SRC)
        stage = relative.parts[0].removesuffix(".py")
        if stage == "__init__":
            continue
        allowed = ALLOWED.get(stage)
        assert allowed is not None, f"{relative}: stage {stage!r} is not in the layering table"
        for target in _gptlab_imports(path) - {stage}:
            if (target == "cli" and stage != "__main__") or ("*" not in allowed and target not in allowed):
                violations.append(f"{relative} imports gptlab.{target}")
    assert not violations, "\n".join(violations)


@pytest.mark.parametrize("modules", ["gptlab.tokenizer, gptlab.tokenizer.train, gptlab.tokenizer.formats",
                                     "gptlab.curate.pipeline, gptlab.curate.config, gptlab.curate.datatrove_steps",
                                     "gptlab.tools, gptlab.tools.registry, gptlab.tools.worker"])
def test_stages_without_torch_import_without_torch(modules):
    code = f"import sys, {modules}; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_import_gptlab_has_no_side_effects():
    code = "import gptlab, gptlab.cli.main, gptlab.pipeline"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout == "" and result.stderr == ""


def _module_name(path: Path, root: Path) -> str:
    parts = ("gptlab", *path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, root: Path, modules: set[str]) -> set[str]:
    """Every gptlab module `path` imports, at the top or inside a function; `from M import y` is M.y when y is a module."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names)
    return {target for target in found if target in modules} - {name}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None: depth-first search for an edge back into the current path."""
    state: dict[str, str] = {}
    for root in sorted(graph):
        if root in state:
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = "open"
        while stack:
            target = next(stack[-1], None)
            if target is None:
                state[path.pop()] = "done"
                stack.pop()
            elif state.get(target) == "open":
                return [*path[path.index(target):], target]
            elif target not in state:
                state[target] = "open"
                path.append(target)
                stack.append(iter(sorted(graph[target])))
    return None


def _import_graph(root: Path) -> dict[str, set[str]]:
    files = {_module_name(path, root): path for path in root.rglob("*.py")}
    return {name: _imported_modules(path, root, set(files)) for name, path in files.items()}


def test_layering_no_modules_import_each_other_even_around_a_cycle():
    cycle = _find_cycle(_import_graph(SRC))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_layering_cycle_check_finds_a_three_module_cycle_through_relative_and_function_imports(tmp_path):
    for name, text in {"__init__.py": "", "a/__init__.py": "", "a/one.py": "from . import two\n",
                       "a/two.py": "def f():\n    from ..b import three\n", "b/__init__.py": "import gptlab.a\n",
                       "b/three.py": "from gptlab.a import one\nfrom gptlab.a.one import x\n"}.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = _import_graph(tmp_path)
    assert graph["gptlab.b"] == {"gptlab.a"} and graph["gptlab.a.two"] == {"gptlab.b.three"}
    assert _find_cycle(graph) == ["gptlab.a.one", "gptlab.a.two", "gptlab.b.three", "gptlab.a.one"]
    (tmp_path / "a/two.py").write_text("")
    assert _find_cycle(_import_graph(tmp_path)) is None
