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
    "infer": {"runtime", "model"},
    "chat": {"runtime", "tokenizer", "data"},
    "eval": {"runtime", "model", "data", "infer", "chat"},
    "runs": {"runtime", "model"},
    "parallel": {"runtime"},
    "train": {"runtime", "model", "data", "eval", "runs", "parallel"},
    "align": {"runtime", "train", "chat", "infer", "eval", "model", "data"},
    "curate": {"runtime", "data"},
    "scaling": {"runtime", "train", "model", "data", "runs"},  # runs: a run's metrics.jsonl, pyplot on Agg
    "serve": {"runtime", "infer", "chat", "model", "tokenizer"},
    "export": {"runtime", "model", "tokenizer", "chat"},
    "cli": {"*"},
    "pipeline": {"*"},
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
                                     "gptlab.curate.pipeline, gptlab.curate.config, gptlab.curate.datatrove_steps"])
def test_stages_without_torch_import_without_torch(modules):
    code = f"import sys, {modules}; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_import_gptlab_has_no_side_effects():
    code = "import gptlab, gptlab.cli.main, gptlab.pipeline"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout == "" and result.stderr == ""
