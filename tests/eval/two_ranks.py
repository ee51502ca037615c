"""Run a script on two CPU ranks with torchrun (gloo), as the eval tests' DDP checks do."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_on_two_ranks(source: str, argument, tmp_path: Path) -> str:
    """Write `source` to a script, run it on 2 ranks with `argument`, and return its stdout (both ranks')."""
    script = tmp_path / "two_ranks.py"
    script.write_text(source)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), str(argument)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout
