"""The modules of gptlab.train and gptlab.align import each other without a circle (issue 29, §4).

A circle means neither module can be read, tested or replaced without the other; the one between
train/optim.py and train/muon.py hid behind an import inside a function, so every import counts here,
wherever it sits, except those under `if TYPE_CHECKING:` (annotations only: they never run).
"""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGES = ("gptlab.train", "gptlab.align")


def module_name(path: Path, src: Path) -> str:
    parts = path.relative_to(src).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """The nodes under `if TYPE_CHECKING:`, which only type checkers follow."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for inner in ast.walk(node))
    return skipped


def imported_modules(path: Path) -> set[str]:
    """Every module an import statement anywhere in the file names (`from a import b` names a and a.b)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _type_checking_nodes(tree)
    names = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def import_graph(src: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """module -> the modules of `packages` it imports (a package's __init__ left out: it only gathers names)."""
    files = {module_name(path, src): path for package in packages for path in (src / package.replace(".", "/")).rglob("*.py")
             if path.name != "__init__.py"}
    return {name: (imported_modules(path) & files.keys()) - {name} for name, path in files.items()}


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports (a -> b -> ... -> a), or None: a depth-first search for an edge back into the path."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return None
        for target in sorted(graph[module]):
            circle = visit(target, path + [module])
            if circle:
                return circle
        done.add(module)
        return None

    for module in sorted(graph):
        circle = visit(module, [])
        if circle:
            return circle
    return None


def test_find_circle_finds_one_hidden_in_a_function_and_ignores_type_checking_imports(tmp_path):
    package = tmp_path / "gptlab" / "train"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from gptlab.train.optim import build\n")
    (package / "muon.py").write_text("from gptlab.train.optim import AdamW\n")
    (package / "optim.py").write_text("def build():\n    from gptlab.train.muon import Muon\n")
    (package / "loop.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gptlab.train.hooks import Hooks\n")
    (package / "hooks.py").write_text("import gptlab.train.loop\n")
    graph = import_graph(tmp_path, ("gptlab.train",))
    assert graph["gptlab.train.loop"] == set() and graph["gptlab.train.hooks"] == {"gptlab.train.loop"}
    assert find_circle(graph) == ["gptlab.train.muon", "gptlab.train.optim", "gptlab.train.muon"]
    (package / "optim.py").write_text("def build():\n    return None\n")
    assert find_circle(import_graph(tmp_path, ("gptlab.train",))) is None


def test_train_and_align_modules_import_each_other_without_a_circle():
    graph = import_graph(SRC, PACKAGES)
    assert {"gptlab.train.optim", "gptlab.train.muon", "gptlab.train.trainer", "gptlab.align.rl.grpo"} <= graph.keys()
    circle = find_circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle)
