"""Run scripts on two CPU ranks with torchrun (gloo), as the DDP checks of the eval and alignment tests do.

Several scripts can share one launch (run_scripts_on_two_ranks): each launch starts three Pythons that import torch,
which costs more than the tiny runs the scripts make.
"""

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


# The scripts run one after another in the same two ranks, which keep one process group throughout: re-creating
# gloo's default group in one launch hangs now and then, so a script's init (when one exists) and destroy do nothing
# until the last script has run. argv[2] is each script's own output folder, <out>/<name>/ddp.
LAUNCH = """
import contextlib, os, sys
from pathlib import Path
import torch.distributed as dist

out, init, destroy = Path(sys.argv[2]), dist.init_process_group, dist.destroy_process_group
dist.init_process_group = lambda *args, **kwargs: None if dist.is_initialized() else init(*args, **kwargs)
dist.destroy_process_group = lambda *args, **kwargs: None
for name, text in {scripts!r}.items():
    (out / name).mkdir(parents=True, exist_ok=True)
    sys.argv[2] = str(out / name / "ddp")
    with open(out / name / f"stdout.rank{{os.environ['RANK']}}", "w") as stdout, contextlib.redirect_stdout(stdout):
        exec(compile(text, name, "exec"), {{"__name__": "__main__"}})
dist.destroy_process_group = destroy
if dist.is_initialized():
    destroy()
"""


def run_scripts_on_two_ranks(scripts: dict[str, str], argument, out: Path) -> Path:
    """Run each script of `scripts` (name -> source) in turn in one 2-rank launch, with argv[1] `argument`; return
    `out`, where `<name>/ddp` is the script's argv[2] and `<name>/stdout.rank<N>` what rank N printed."""
    script = out / "two_ranks.py"
    script.write_text(LAUNCH.format(scripts=scripts))
    # src first: this checkout's gptlab, not the one an editable install points at
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), str(argument), str(out)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def ranks_stdout(out: Path, name: str) -> str:
    """What the two ranks printed while running the script `name`, rank 0 first."""
    return "".join((out / name / f"stdout.rank{rank}").read_text() for rank in (0, 1))
