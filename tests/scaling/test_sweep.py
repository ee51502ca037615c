"""gptlab.scaling.sweep: budgets spent as 6 N D in whole steps, rows equal to direct training, resume, failures, SLURM."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gptlab.cli.main import main
from gptlab.model import GPT
from gptlab.runtime import GptlabError
from gptlab.scaling.sweep import SweepConfig, budget_label, plan, read_rows, run_sweep
from gptlab.train import Trainer
from tests.conftest import with_ctrl_c
from tests.train.conftest import tiny_config

SIZES = ("1x16", "1x32", "2x32")


def small_sweep(**changes) -> SweepConfig:
    settings = {"budgets": (4e8, 8e8), "sizes": SIZES, "head_dim": 16, "min_steps": 5}
    return SweepConfig(**{**settings, **changes})


def base_config(prepared, out="", **changes):
    return tiny_config(prepared, out, **{"eval_every": 0, "checkpoint_every": 0, "log_every": 2, **changes})


def test_budget_label_is_short_and_exact():
    assert [budget_label(c) for c in (1e12, 3e12, 2.5e13, 6e11, 100.0)] == ["1e12", "3e12", "2.5e13", "6e11", "100e0"]


def test_plan_spends_each_budget_in_whole_steps_with_counts_of_the_built_model(prepared, tmp_path):
    base = base_config(prepared)
    for count in ("total", "non_embedding", "matmul"):
        points = plan(base, small_sweep(count=count), tmp_path)
        assert [p.name for p in points] == [f"c{b}-{s}" for b in ("4e8", "8e8") for s in SIZES]
        for point in points:
            n = point.params[count]
            step_flops = 6 * n * base.batch_tokens
            assert abs(6 * n * point.tokens - point.budget) <= step_flops / 2  # the nearest whole number of steps
            assert point.tokens == point.config.max_steps * base.batch_tokens
    model = GPT(points[-1].config.model)
    assert points[-1].params["total"] == model.num_params()
    assert points[-1].params["non_embedding"] == model.num_params(embeddings=False)
    assert (points[-1].config.model.n_layer, points[-1].config.model.n_embd, points[-1].config.model.n_head) == (2, 32, 2)


def test_plan_gives_each_size_the_depth_dials_lr_times_its_scale(prepared, tmp_path):
    base = base_config(prepared)
    points = plan(base, small_sweep(budgets=(8e8,), lr_scales=(0.5, 1.0)), tmp_path)
    by_name = {p.name: p for p in points}
    width = base.model.n_embd  # gpt2-tiny: 32
    assert by_name["c8e8-1x16-lr0.5"].config.optimizer.lr == pytest.approx(0.5 * base.optimizer.lr * (width / 16) ** 0.5)
    assert by_name["c8e8-2x32"].config.optimizer.lr == pytest.approx(base.optimizer.lr)  # scale 1 keeps its name


def test_plan_keeps_only_the_tokens_per_param_window(prepared, tmp_path):
    base = base_config(prepared)
    every = plan(base, small_sweep(), tmp_path)
    ratios = {p.name: p.tokens / p.params["total"] for p in every}
    low, high = sorted(ratios.values())[1], sorted(ratios.values())[-2]
    kept = plan(base, small_sweep(tokens_per_param=(low, high)), tmp_path)
    assert {p.name for p in kept} == {name for name, r in ratios.items() if low <= r <= high}
    assert len(kept) == len(every) - 2


@pytest.mark.parametrize(("changes", "message"), [
    ({"budgets": (1e7,)}, r"3 of 3 grid points train fewer than --min-steps 5 steps of 128 tokens: c1e7-1x16 \(1 step, needs a "
                          r"budget of 4\.7e7\), c1e7-1x32 \(0 steps"),
    ({"sizes": ("3x20",)}, "multiple of the head size"),
    ({"sizes": ("huge",)}, "unknown size 'huge'"),
    ({"budgets": (-1.0,)}, "must be positive"),
    ({"count": "embeddings"}, "unknown --count"),
    ({"sizes": ("1x16", "1x16")}, "names a run twice"),
    ({"tokens_per_param": (1e6, 1e7)}, "no grid point"),
])
def test_plan_refuses_bad_grids_in_one_line(prepared, tmp_path, changes, message):
    with pytest.raises(GptlabError, match=message):
        plan(base_config(prepared), small_sweep(**changes), tmp_path)


def test_plan_allowing_short_points_keeps_the_whole_grid_with_their_true_steps(prepared, tmp_path):
    from gptlab.scaling.sweep import refuse_short, short_points

    base, sweep = base_config(prepared), small_sweep(min_steps=20)
    points = plan(base, sweep, tmp_path, allow_short=True)
    assert [p.name for p in points] == [p.name for p in plan(base, small_sweep(), tmp_path)]  # nothing dropped
    for point in points:  # the steps that spend the budget, as a grid of runnable points computes them
        assert point.steps == round(point.budget / (6 * point.params["total"]) / base.batch_tokens) == point.config.max_steps
    short = short_points(points, sweep)
    assert [p.name for p in short] == [p.name for p in points if p.steps < 20] and 0 < len(short) < len(points)
    with pytest.raises(GptlabError, match=f"^{len(short)} of 6 grid points train fewer than --min-steps 20") as error:
        refuse_short(points, sweep)
    assert all(p.name in str(error.value) for p in short)
    with pytest.raises(GptlabError, match=f"^{len(short)} of 6 grid points"):
        plan(base, sweep, tmp_path)


def test_read_rows_names_the_results_files_own_line(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text('{"run": "a"}\n\n{"run": "b"}\n{"run": "c"}\n\n{"run": "d", oops}\n')
    with pytest.raises(GptlabError, match=r"results.jsonl line 6 is not JSON \(Expecting property name"):
        read_rows(path)
    path.write_bytes(b'{"run": "a"}\n{"run": "caf\xe9"}\n')  # latin-1
    with pytest.raises(GptlabError, match=r"results.jsonl line 2 is not UTF-8 text \(byte 0xe9\); it is not a sweep's results"):
        read_rows(path)
    path.write_text('{"run": "a"}\n[1, 2]\n')
    with pytest.raises(GptlabError, match=r"results.jsonl line 2 is not a row \(a JSON object\)"):
        read_rows(path)


@pytest.fixture(scope="module")
def finished_sweep(prepared, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "sweep"
    rows = run_sweep(base_config(prepared), small_sweep(), out, log=lambda _: None)
    return out, rows


@pytest.mark.xdist_group("sweep_finished")  # one worker builds the module fixture once
def test_sweep_rows_equal_the_same_run_trained_directly(prepared, finished_sweep, tmp_path):
    out, rows = finished_sweep
    assert [row["status"] for row in rows] == ["finished"] * 6
    point = plan(base_config(prepared), small_sweep(), out)[4]
    direct = Trainer(base_config(prepared, out=str(tmp_path / "direct"), model=point.config.model, optimizer=point.config.optimizer,
                                 schedule=point.config.schedule, max_steps=point.config.max_steps), log=print).fit()
    row = rows[4]
    assert row["run"] == point.name and row["val_loss"] == direct.val_loss and row["val_bpb"] == direct.val_bpb
    assert row["tokens"] == point.tokens and row["flops"] == 6 * point.params["total"] * point.tokens
    assert row["params"] == point.params and row["steps"] == direct.steps
    assert row["flops_with_attention"] > row["flops"]


@pytest.mark.xdist_group("sweep_finished")  # one worker builds the module fixture once
def test_sweep_results_file_holds_every_row_in_grid_order(finished_sweep):
    out, rows = finished_sweep
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert lines == rows == read_rows(out) == read_rows(out / "results.jsonl")


@pytest.mark.xdist_group("sweep_finished")  # one worker builds the module fixture once
def test_sweep_rerun_skips_finished_runs_without_training(prepared, finished_sweep):
    out, rows = finished_sweep
    before = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/metrics.jsonl")}
    said = []
    again = run_sweep(base_config(prepared, log_every=1), small_sweep(), out, log=said.append)  # log_every is free to change
    assert again == rows
    assert sum("finished before" in line for line in said) == 6
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/*/metrics.jsonl")} == before


@pytest.mark.xdist_group("sweep_finished")  # one worker builds the module fixture once
def test_sweep_grows_into_an_existing_sweep_and_refuses_other_settings(prepared, finished_sweep):
    out, _ = finished_sweep
    with pytest.raises(GptlabError, match="other settings.*seq_len"):
        run_sweep(base_config(prepared, seq_len=16), small_sweep(), out, log=lambda _: None)
    said = []
    rows = run_sweep(base_config(prepared), small_sweep(budgets=(4e8,), sizes=("1x16",), lr_scales=(1.0, 2.0)), out, log=said.append)
    assert [row["run"] for row in rows] == ["c4e8-1x16", "c4e8-1x16-lr2"] and "finished before" in said[1]
    assert len(read_rows(out)) == 7


def test_sweep_refuses_a_folder_it_did_not_make_and_leaves_nothing_for_bad_data(prepared, tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(GptlabError, match="not empty and is not a gptlab run folder"):
        run_sweep(base_config(prepared), small_sweep(), foreign, log=lambda _: None)
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    with pytest.raises(GptlabError):
        run_sweep(base_config(prepared, data=str(tmp_path / "missing")), small_sweep(), tmp_path / "new", log=lambda _: None)
    assert not (tmp_path / "new").exists()


def test_sweep_records_a_failed_run_as_failed_and_retries_it(prepared, tmp_path, monkeypatch):
    original = Trainer.fit

    def fit(self):
        if "c4e8-1x32" in self.config.out:
            raise RuntimeError("node lost")
        return original(self)

    monkeypatch.setattr(Trainer, "fit", fit)
    sweep = small_sweep(budgets=(4e8,))
    rows = run_sweep(base_config(prepared), sweep, tmp_path / "s", log=lambda _: None)
    assert [row["status"] for row in rows] == ["finished", "failed", "finished"]
    assert rows[1]["error"] == "RuntimeError: node lost" and rows[1]["val_loss"] is None
    monkeypatch.setattr(Trainer, "fit", original)
    said = []
    rows = run_sweep(base_config(prepared), sweep, tmp_path / "s", log=said.append)
    assert [row["status"] for row in rows] == ["finished"] * 3, rows[1]["error"]
    assert any("retrying: it failed before" in line for line in said)


def test_sweep_index_runs_one_grid_point(prepared, tmp_path):
    rows = run_sweep(base_config(prepared), small_sweep(), tmp_path / "s", index=4, log=lambda _: None)
    assert [row["run"] for row in rows] == ["c8e8-1x32"] and [r["run"] for r in read_rows(tmp_path / "s")] == ["c8e8-1x32"]
    with pytest.raises(GptlabError, match="--index 6 is outside the grid of 6 runs"):
        run_sweep(base_config(prepared), small_sweep(), tmp_path / "s", index=6, log=lambda _: None)


# Subprocesses on one thread each: two test workers' torch thread pools on 2 cores make tiny steps 100x slower.
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}


def _cli_sweep(prepared, out: Path, budgets=("4e8", "8e8"), steps_flag=(), sizes=SIZES) -> list[str]:
    return [sys.executable, "-m", "gptlab.cli.main", "sweep", "--budgets", *budgets, "--sizes", *sizes, "--head-dim", "16",
            "--min-steps", "5", "--out", str(out), "--data", str(prepared / "data"), "--model.block-size", "32",
            "--seq-len", "32", "--micro-batch", "4", "--batch-tokens", "128", "--precision", "fp32", "--device", "cpu",
            "--eval-every", "0", "--eval-batches", "2", "--log-every", "2", *steps_flag]


def test_sweep_killed_mid_run_resumes_to_the_uninterrupted_rows(prepared, tmp_path):
    """kill -9 in the middle of a run (after a checkpoint), rerun: every row equals an uninterrupted sweep's."""
    sizes = ("1x16", "1x32")
    command = _cli_sweep(prepared, tmp_path / "killed", budgets=("1e9",), steps_flag=("--checkpoint-every", "5"), sizes=sizes)
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ONE_THREAD)
    run = tmp_path / "killed" / "runs" / "c1e9-1x32"
    deadline = time.monotonic() + 120
    while not list(run.glob("checkpoints/step_*")) and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert list(run.glob("checkpoints/step_*")) and not (tmp_path / "killed" / "rows" / "c1e9-1x32.json").exists()  # killed mid-run
    # the rerun and the reference run in this process: only the killed sweep needs a process of its own (saves two starts)
    assert main(command[3:]) == 0
    assert main(_cli_sweep(prepared, tmp_path / "straight", budgets=("1e9",), sizes=sizes)[3:]) == 0
    strip = [{k: v for k, v in row.items() if k != "seconds"} for row in read_rows(tmp_path / "killed")]
    assert strip == [{k: v for k, v in row.items() if k != "seconds"} for row in read_rows(tmp_path / "straight")]
    assert len(strip) == 2 and all(row["status"] == "finished" for row in strip)


def test_slurm_script_runs_one_grid_point_per_array_task(prepared, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([*_cli_sweep(prepared, Path("s"))[3:], "--slurm"]) == 0  # in this process: only the array task needs its own
    assert "submit with `sbatch s/sweep.sbatch`" in capsys.readouterr().out and not list((tmp_path / "s").glob("r*/*"))  # nothing trained
    script = (tmp_path / "s" / "sweep.sbatch").read_text()
    assert "#SBATCH --array=0-5" in script and (tmp_path / "s" / "logs").is_dir()
    subprocess.run(["bash", "-n", "s/sweep.sbatch"], check=True)
    subprocess.run(["bash", "s/sweep.sbatch"], check=True, capture_output=True, env={**ONE_THREAD, "SLURM_ARRAY_TASK_ID": "2"})
    assert [row["run"] for row in read_rows(tmp_path / "s")] == ["c4e8-2x32"]


# A sweep that Ctrl-C stops at a chosen moment: SIGINT sent to itself just before a step of run_sweep (the handler
# raises KeyboardInterrupt at once), or inside the second run's training at its step 3.
CTRL_C_SWEEP = """
import os, signal, sys
from gptlab.cli.main import main
from gptlab.scaling import sweep
from gptlab.train.trainer import Trainer

moment = sys.argv[1]

def ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)

if moment == "training":
    real_step = Trainer._train_step
    def step(self):
        if self.config.out.endswith("1x32") and self.state.step == 3:
            ctrl_c()
        return real_step(self)
    Trainer._train_step = step
else:
    real = getattr(sweep, moment)
    def hooked(*args, **kwargs):
        ctrl_c()
        return real(*args, **kwargs)
    setattr(sweep, moment, hooked)
sys.exit(main(sys.argv[2:]))
"""
CTRL_C_GRID = {"budgets": ("2e8",), "sizes": ("1x16", "1x32")}  # 13 then 6 steps


@pytest.fixture(scope="module")
def straight_rows(prepared, tmp_path_factory):
    """The rows of the Ctrl-C tests' grid, swept without interruption."""
    out = tmp_path_factory.mktemp("straight") / "sweep"
    assert main(_cli_sweep(prepared, out, **CTRL_C_GRID)[3:]) == 0
    return [{k: v for k, v in row.items() if k != "seconds"} for row in read_rows(out)]


def interrupted_then_resumed(prepared, out: Path, run, straight_rows) -> str:
    """`run` (a subprocess.run of the sweep) is interrupted: exit 130, one line, no traceback; the same command then
    finishes the sweep with the rows of an uninterrupted one. Returns the interrupted run's stdout."""
    result = run(_cli_sweep(prepared, out, **CTRL_C_GRID))
    assert result.returncode == 130, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == "gptlab: interrupted" and "Traceback" not in result.stderr, result.stderr
    assert main(_cli_sweep(prepared, out, **CTRL_C_GRID)[3:]) == 0
    assert [{k: v for k, v in row.items() if k != "seconds"} for row in read_rows(out)] == straight_rows
    return result.stdout


@pytest.mark.xdist_group("sweep_straight_rows")  # one worker builds the module fixture once
@pytest.mark.parametrize("moment", ["check_point", "claim_sweep", "training", "write_row", "write_results"])
def test_sweep_ctrl_c_at_any_moment_exits_130_in_one_line_and_the_same_command_resumes(prepared, tmp_path, straight_rows, moment):
    def run(command):
        return subprocess.run([sys.executable, "-c", CTRL_C_SWEEP, moment, *command[3:]], capture_output=True, text=True,
                              env=ONE_THREAD, timeout=300, preexec_fn=with_ctrl_c)

    stdout = interrupted_then_resumed(prepared, tmp_path / "s", run, straight_rows)
    if moment == "check_point":
        assert "[1/2]" not in stdout  # stopped before any folder was claimed
    if moment == "training":
        # sent as step 4 begins: the step finishes first (its checkpoint then resumes exactly)
        assert "interrupted at step 4: saving a checkpoint" in stdout and "[2/2] c2e8-1x32" in stdout


@pytest.mark.xdist_group("sweep_straight_rows")  # one worker builds the module fixture once
def test_sweep_ctrl_c_from_outside_as_the_first_run_starts_exits_130_and_resumes(prepared, tmp_path, straight_rows):
    """A real Ctrl-C sent by another process as the first run starts: it lands while the Trainer is built or in its
    first steps, a moment none of the hooks above hits.

    Ctrl-C while a run trains goes through the Trainer's handler: the "training" moment above proves it, with the
    checkpoint it saves; before, between and after runs: the other moments.
    """
    def run(command, wait_for="[1/2]"):
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env={**ONE_THREAD, "PYTHONUNBUFFERED": "1"}, preexec_fn=with_ctrl_c)
        seen = ""
        while wait_for not in seen:  # reading its output: the signal comes at a moment of the run, not a time
            line = child.stdout.readline()
            assert line, f"the sweep ended before {wait_for!r}: {seen}{child.stderr.read()}"
            seen += line
        child.send_signal(signal.SIGINT)
        stdout, stderr = child.communicate(timeout=300)
        return subprocess.CompletedProcess(command, child.returncode, seen + stdout, stderr)

    interrupted_then_resumed(prepared, tmp_path / "s", run, straight_rows)
