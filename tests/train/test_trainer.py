"""The Trainer against its references: one big batch, an uninterrupted run, a single process."""

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from gptlab.load.checkpoints import list_checkpoints
from gptlab.model import GPT
from gptlab.runtime import GptlabError
from gptlab.train import Trainer

from .conftest import mask_some_targets, masked_batches, tiny_config


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(list_checkpoints(out)[-1] / "model.safetensors")


def quiet(config, **kwargs):
    return Trainer(config, log=lambda *_: None, **kwargs)


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


def test_accumulated_gradients_equal_the_full_batch(prepared, tmp_path):
    """8 sequences in one pass, or 4 micro-steps of 2: the same update (within float rounding)."""
    full = quiet(tiny_config(prepared, tmp_path / "full", micro_batch=8, batch_tokens=8 * 32, max_steps=2)).fit()
    accumulated = quiet(tiny_config(prepared, tmp_path / "accum", micro_batch=2, batch_tokens=8 * 32, max_steps=2)).fit()
    assert accumulated.losses == pytest.approx(full.losses, rel=1e-5)
    for name, tensor in final_weights(tmp_path / "full").items():
        torch.testing.assert_close(final_weights(tmp_path / "accum")[name], tensor, rtol=1e-4, atol=1e-5)


def test_the_fused_loss_trains_as_the_plain_one(prepared, tmp_path):
    """fused_loss (the default) against the plain head and F.cross_entropy: the same run within float rounding."""
    fused = quiet(tiny_config(prepared, tmp_path / "fused", max_steps=4)).fit()
    plain = quiet(tiny_config(prepared, tmp_path / "plain", max_steps=4, fused_loss=False)).fit()
    assert fused.losses == pytest.approx(plain.losses, rel=1e-5)
    for name, tensor in final_weights(tmp_path / "plain").items():
        torch.testing.assert_close(final_weights(tmp_path / "fused")[name], tensor, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("loader_mode", ["sequential", "random"])
def test_resume_from_a_checkpoint_continues_the_exact_same_run(prepared, tmp_path, loader_mode):
    """6 steps straight == the same run restarted from its step-3 checkpoint: loss for loss (dropout on)."""
    model = dataclasses.replace(tiny_config(prepared, tmp_path).model, dropout=0.1)
    config = tiny_config(prepared, tmp_path / "straight", model=model, loader_mode=loader_mode)
    straight = quiet(config).fit()
    assert [p.name for p in list_checkpoints(tmp_path / "straight")] == ["step_000003", "step_000006"]
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step_000006")
    resumed = quiet(dataclasses.replace(config, out=str(tmp_path / "resumed"))).fit()
    assert resumed.losses == straight.losses[3:]
    assert_same_weights(tmp_path / "straight", tmp_path / "resumed")


def test_ctrl_c_saves_a_checkpoint_and_resume_matches(prepared, tmp_path):
    straight = quiet(tiny_config(prepared, tmp_path / "straight")).fit()

    def interrupt(model, tokenizer):
        raise KeyboardInterrupt

    config = tiny_config(prepared, tmp_path / "interrupted", sample_every=2)
    first = quiet(config, sample_fn=interrupt).fit()
    assert first.status == "interrupted" and first.steps == 2
    assert list_checkpoints(tmp_path / "interrupted")[-1].name == "step_000002"
    second = quiet(dataclasses.replace(config, sample_every=0)).fit()
    assert first.losses + second.losses == straight.losses
    assert_same_weights(tmp_path / "straight", tmp_path / "interrupted")


def test_checkpoints_keep_the_last_and_the_best(prepared, tmp_path):
    config = tiny_config(prepared, tmp_path / "run", max_steps=12, checkpoint_every=2, eval_every=2, keep_last=2)
    quiet(config).fit()
    names = [p.name for p in list_checkpoints(tmp_path / "run")]
    best = json.loads((tmp_path / "run" / "checkpoints" / "best.json").read_text())
    assert names[-2:] == ["step_000010", "step_000012"] and best["checkpoint"] in names
    assert len(names) <= 3
    step = list_checkpoints(tmp_path / "run")[-1]
    assert {p.name for p in step.iterdir()} == {"config.json", "model.safetensors", "optimizer.pt", "rng.pt", "trainer_state.json", "tokenizer"}
    state = json.loads((step / "trainer_state.json").read_text())
    assert state["step"] == 12 and state["tokens"] == 12 * config.batch_tokens and state["format_version"] == 1
    assert not any("_orig_mod" in key or key.startswith("module.") for key in load_file(step / "model.safetensors"))
    torch.load(step / "optimizer.pt", weights_only=True)  # loading never unpickles code


def test_metrics_log_console_and_plot(prepared, tmp_path):
    lines = []
    result = Trainer(tiny_config(prepared, tmp_path / "run"), log=lines.append).fit()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == list(range(1, 7))
    assert [r["loss"] for r in train] == result.losses
    assert {"lr", "grad_norm", "tokens_per_s", "elapsed"} <= train[0].keys()
    assert any("val_bpb" in r for r in records) and result.val_bpb > 0
    assert (tmp_path / "run" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any("step      6/6" in line and "tok/s" in line for line in lines)


def test_a_nan_loss_stops_and_keeps_the_last_checkpoint(prepared, tmp_path, monkeypatch):
    config = tiny_config(prepared, tmp_path / "run", max_steps=6, checkpoint_every=2)
    real_forward = GPT.forward
    calls = {"n": 0}

    def forward(self, idx, targets=None, **kwargs):
        logits, loss = real_forward(self, idx, targets, **kwargs)
        if targets is not None and self.training:
            calls["n"] += 1
            if calls["n"] == 4:
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward)
    with pytest.raises(GptlabError, match="loss is nan at step 3.*step_000002"):
        quiet(config).fit()
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["step_000002"]
    load_file(list_checkpoints(tmp_path / "run")[-1] / "model.safetensors")


def test_a_half_written_checkpoint_is_ignored(prepared, tmp_path):
    config = tiny_config(prepared, tmp_path / "run", max_steps=4)
    quiet(config).fit()
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step_000004")
    partial = tmp_path / "run" / "checkpoints" / ".step_000004.tmp"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    assert list_checkpoints(tmp_path / "run")[-1].name == "step_000003"
    result = quiet(config).fit()
    assert result.steps == 4 and len(result.losses) == 1


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"batch_tokens": 100}, "does not divide"),
        ({"model_vocab": 256}, "set --model.vocab-size 512"),
        ({"data": "/nonexistent"}, "no prepared data"),
        ({"data": ""}, "no training data"),
    ],
)
def test_mistakes_are_caught_before_any_compute(prepared, tmp_path, changes, message):
    config = tiny_config(prepared, tmp_path / "run")
    if "model_vocab" in changes:
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=changes.pop("model_vocab")))
    with pytest.raises(GptlabError, match=message):
        Trainer(dataclasses.replace(config, **changes))
    assert not (tmp_path / "run").exists()


def test_resume_with_other_settings_is_refused(prepared, tmp_path):
    quiet(tiny_config(prepared, tmp_path / "run", max_steps=2)).fit()
    with pytest.raises(GptlabError, match="other settings.*batch_tokens"):
        quiet(tiny_config(prepared, tmp_path / "run", batch_tokens=8 * 32)).fit()


DDP_SCRIPT = """
import sys
from gptlab.train import Trainer
from tests.train.conftest import tiny_config
from pathlib import Path
config = tiny_config(Path(sys.argv[1]), Path(sys.argv[2]), micro_batch=2, batch_tokens=8 * 32, max_steps=3)
Trainer(config, log=lambda *_: None).fit()
"""


def run_on_two_ranks(script_text: str, prepared: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run a script under torchrun on 2 CPU (gloo) processes: argv[1] the prepared data, argv[2] the output folder."""
    script = tmp_path / "ddp_script.py"
    script.write_text(script_text)
    root = Path(__file__).resolve().parents[2]
    # src first: this checkout's gptlab, not the one an editable install points at
    env = {**os.environ, "PYTHONPATH": f"{root / 'src'}{os.pathsep}{root}", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), str(prepared), str(tmp_path / "ddp")]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.xdist_group("trainer_two_ranks")  # one worker runs the shared launch once
def test_ddp_on_two_gloo_processes_equals_one_process(prepared, tmp_path, two_rank_runs):
    """2 ranks x 2 micro-steps x 2 sequences == 1 process x 4 micro-steps x 2 sequences: the same weights."""
    single = tiny_config(prepared, tmp_path / "single", micro_batch=2, batch_tokens=8 * 32, max_steps=3)
    quiet(single).fit()
    ddp = two_rank_runs.folder / "ddp"
    state = json.loads((list_checkpoints(ddp)[-1] / "trainer_state.json").read_text())
    assert len(state["loader"]) == 2 and state["loader"][1]["rank"] == 1
    wa, wb = final_weights(tmp_path / "single"), final_weights(ddp)
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-4, atol=1e-5)


def test_compiled_training_still_evaluates_and_samples(prepared, tmp_path):
    """torch.compile wraps the step only: evaluation, sampling and checkpoints use the plain module; its warm-up
    before the time limit's clock leaves the run's losses those of the plain run."""
    samples, lines = [], []
    config = tiny_config(prepared, tmp_path / "compiled", compile=True, max_steps=2, eval_every=1, sample_every=1, checkpoint_every=1)
    result = Trainer(config, log=lines.append, sample_fn=lambda model, tokenizer: samples.append(type(model).__name__) or "text").fit()
    assert result.status == "finished" and result.val_bpb > 0 and samples and set(samples) == {"GPT"}
    # compiled before the clock starts, on a batch of zeros whose gradients are dropped: the losses below are unchanged
    assert any("compiled the training step" in line and "before the clock starts" in line for line in lines)
    assert not any("_orig_mod" in key for key in final_weights(tmp_path / "compiled"))
    plain = quiet(tiny_config(prepared, tmp_path / "plain", max_steps=2, eval_every=1, checkpoint_every=1)).fit()
    assert result.losses == pytest.approx(plain.losses, rel=1e-4)


def test_periodic_hellaswag_is_logged_and_equals_a_direct_evaluation(prepared, tmp_path):
    from gptlab.eval.tasks import HellaSwag
    from gptlab.model.io import load_model
    from gptlab.pipeline import hellaswag_fn
    from gptlab.tokenizer import Tokenizer

    from ..eval.test_tasks import write_hellaswag

    path = tmp_path / "hellaswag_val.jsonl"
    write_hellaswag(path)
    config = tiny_config(prepared, tmp_path / "run", hellaswag_every=3, hellaswag_path=str(path))
    quiet(config, task_fn=hellaswag_fn(config)).fit()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    scored = [r for r in records if "hellaswag_acc" in r]
    assert [r["step"] for r in scored] == [3, 6]
    tokenizer = Tokenizer.load(prepared / "tokenizer")
    direct = HellaSwag(path).evaluate(load_model(list_checkpoints(tmp_path / "run")[-1]), tokenizer.encode_ordinary)
    assert scored[-1]["hellaswag_acc"] == direct["acc"] and scored[-1]["hellaswag_acc_norm"] == direct["acc_norm"]


# Losses of these two runs, recorded with the Trainer as it was before `fit` was split into methods over a
# TrainState (same seed, data and settings): the refactor must not change a single number.
SNAPSHOT = {
    "plain": ([6.228510856628418, 6.176946640014648, 6.139057636260986, 6.099023342132568, 6.04101037979126,
               6.107204914093018, 6.050714492797852, 6.048680782318115], 5.948927879333496),
    "accumulation_dropout_random": ([6.26028299331665, 6.241038799285889, 6.177577972412109, 6.165937423706055,
                                     6.1176300048828125, 6.097728729248047, 6.007745742797852, 6.009401798248291], 6.0120530128479),
}


@pytest.mark.parametrize("name", SNAPSHOT)
def test_losses_at_a_fixed_seed_equal_the_snapshot_of_the_unsplit_trainer(prepared, tmp_path, name):
    config = tiny_config(prepared, tmp_path / name, max_steps=8)
    if name != "plain":
        model = dataclasses.replace(config.model, dropout=0.1)
        config = dataclasses.replace(config, micro_batch=2, loader_mode="random", model=model)
    result = quiet(config).fit()
    losses, val_loss = SNAPSHOT[name]
    # rel 1e-6 allows another CPU's float kernels, nothing more: a changed RNG order or step moves losses by 1e-3
    assert result.losses == pytest.approx(losses, rel=1e-6, abs=0)
    assert result.val_loss == pytest.approx(val_loss, rel=1e-6, abs=0)


TIME_LIMIT_SCRIPT = """
import os, sys, time
from pathlib import Path
import gptlab.train.trainer as trainer_module
from gptlab.train import Trainer
from tests.train.conftest import tiny_config

class SlowClock:  # rank 1's clock jumps past the time limit after a few readings; rank 0's never does
    calls = 0
    def __getattr__(self, name):
        return getattr(time, name)
    def perf_counter(self):
        SlowClock.calls += 1
        return time.perf_counter() + (1e6 if SlowClock.calls > 12 else 0)

if os.environ["RANK"] == "1":
    trainer_module.time = SlowClock()
config = tiny_config(Path(sys.argv[1]), Path(sys.argv[2]), micro_batch=2, batch_tokens=8 * 32, max_steps=50, time_limit=1000,
                     eval_every=0, checkpoint_every=0)
result = Trainer(config, log=lambda *_: None).fit()
print(f"rank {os.environ['RANK']}: {result.status} at step {result.steps}", flush=True)
"""

# The three 2-rank runs above and below share one torchrun launch (three started Pythons, each importing torch, cost
# more than the tiny runs themselves): a plain DDP run, the time-limit run (rank 1's clock put back after it), then the
# masked-targets run, each in its own folder of argv[2].
TWO_RANK_RUNS_SCRIPT = f"""
import sys, time
from pathlib import Path
import gptlab.train.trainer as trainer_module
from tests.train.conftest import mask_some_targets

out = Path(sys.argv[2])

def run_script(text, name):
    sys.argv[2] = str(out / name)
    exec(compile(text, name, "exec"), {{"__name__": "__main__"}})

run_script({DDP_SCRIPT!r}, "ddp")
run_script({TIME_LIMIT_SCRIPT!r}, "time_limit")
trainer_module.time = time
mask_some_targets()
run_script({DDP_SCRIPT!r}, "masked")
"""


@pytest.fixture(scope="module")
def two_rank_runs(prepared, tmp_path_factory):
    """The three runs on 2 gloo ranks: `folder` holds ddp/, time_limit/ and masked/; `stdout` is what the ranks printed."""
    folder = tmp_path_factory.mktemp("two_ranks")
    result = run_on_two_ranks(TWO_RANK_RUNS_SCRIPT, prepared, folder)
    return SimpleNamespace(folder=folder / "ddp", stdout=result.stdout)


@pytest.mark.xdist_group("trainer_two_ranks")  # one worker runs the shared launch once
def test_ddp_ranks_agree_on_the_time_limit_so_none_waits_forever(two_rank_runs):
    lines = sorted(line for line in two_rank_runs.stdout.splitlines() if line.startswith("rank "))
    assert len(lines) == 2 and lines[0].split(": ")[1] == lines[1].split(": ")[1]
    step = int(lines[0].rsplit(" ", 1)[1])
    assert "time limit" in lines[0] and 0 < step < 50
    assert list_checkpoints(two_rank_runs.folder / "time_limit")[-1].name == f"step_{step:06d}"


def test_masked_loss_is_the_mean_over_every_counted_target_of_the_step(prepared, tmp_path, monkeypatch):
    """Micro-batches of 1 row (some without a counted target) == one pass of 8 rows == the mean computed by hand."""
    mask_some_targets(monkeypatch)
    from gptlab.data.loader import LoaderConfig, ShardLoader

    loader = ShardLoader(prepared / "data", "train", config=LoaderConfig(batch_size=8, seq_len=32, seed=1337))
    x, y = masked_batches(*loader.next_batch())
    assert (y != -100).sum(dim=1).eq(0).any(), "the test needs a row without targets"
    config = tiny_config(prepared, tmp_path / "one", micro_batch=8, batch_tokens=8 * 32, max_steps=2)
    torch.manual_seed(config.seed)
    reference = torch.nn.functional.cross_entropy(GPT(config.model)(x)[0].flatten(0, 1), y.flatten(), ignore_index=-100)
    one = quiet(config).fit()
    split = quiet(tiny_config(prepared, tmp_path / "split", micro_batch=1, batch_tokens=8 * 32, max_steps=2)).fit()
    assert one.losses[0] == pytest.approx(reference.item(), rel=1e-5)
    assert split.losses == pytest.approx(one.losses, rel=1e-5) and all(map(torch.isfinite, map(torch.tensor, split.losses)))
    for name, tensor in final_weights(tmp_path / "one").items():
        torch.testing.assert_close(final_weights(tmp_path / "split")[name], tensor, rtol=1e-4, atol=1e-5)


@pytest.mark.xdist_group("trainer_two_ranks")  # one worker runs the shared launch once
def test_masked_loss_on_two_gloo_ranks_equals_one_process(prepared, tmp_path, monkeypatch, two_rank_runs):
    """Ranks hold different numbers of counted targets: the step's mean is still over all of them (== one process)."""
    mask_some_targets(monkeypatch)
    single = quiet(tiny_config(prepared, tmp_path / "single", micro_batch=2, batch_tokens=8 * 32, max_steps=3)).fit()
    assert all(map(math.isfinite, single.losses))
    wa, wb = final_weights(tmp_path / "single"), final_weights(two_rank_runs.folder / "masked")
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-4, atol=1e-5)


class FakeClock:
    """time.perf_counter for the trainer: each call advances `tick` seconds, so a time budget is deterministic."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def test_a_time_limited_run_follows_its_budget_and_ends_annealed(prepared, tmp_path, monkeypatch):
    """The learning rate falls with time spent, not with max_steps; the last steps are at min_lr; a resume
    counts the time already spent (the budget is the run's, not the process's)."""
    import gptlab.train.trainer as trainer_module

    monkeypatch.setattr(trainer_module.time, "perf_counter", FakeClock(0.01))
    config = tiny_config(prepared, tmp_path / "run", max_steps=100_000, time_limit=2.0, eval_every=0, checkpoint_every=0)
    result = Trainer(config, log=lambda *_: None).fit()
    assert result.status == "time limit" and 10 < result.steps < 1000
    lrs = [record["lr"] for record in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) if "lr" in record]
    peak, floor = config.optimizer.lr, config.optimizer.lr * config.schedule.min_lr_ratio
    assert max(lrs) == pytest.approx(peak, rel=0.05) and all(a >= b for a, b in zip(lrs[2:], lrs[3:]))
    assert lrs[-1] == pytest.approx(floor, rel=0.05)  # a step-based cosine would still be at the peak here
    lines = []
    again = Trainer(config, log=lines.append).fit()
    assert again.status == "already finished" and again.steps == result.steps
    assert "spent its time limit of 2 s" in lines[-1]
    longer = Trainer(dataclasses.replace(config, time_limit=4.0), log=lambda *_: None).fit()
    assert longer.status == "time limit" and longer.steps > result.steps


def test_a_run_saved_before_a_field_existed_resumes_when_the_field_is_at_its_default(prepared, tmp_path):
    """Upgrading gptlab adds config fields; an old run's record lacks them, which is no change at their defaults."""
    out = tmp_path / "run"
    config = tiny_config(prepared, out, max_steps=6, time_limit=0)
    assert Trainer(dataclasses.replace(config, max_steps=6), log=lambda *_: None, force=True).fit().steps == 6
    marker = out / "gptlab_run.json"

    def as_if_older():
        record = json.loads(marker.read_text())
        del record["config"]["optimizer"]["muon_momentum"], record["config"]["seed"]  # as written by an older gptlab
        record.pop("asked", None)  # which recorded no settings as asked for either
        marker.write_text(json.dumps(record))
        for path in out.glob("checkpoints/*/trainer_state.json"):  # checkpoints saved before model.attention existed
            state = json.loads(path.read_text())
            state["config"]["model"].pop("attention", None), state["config"]["model"].pop("norm_impl", None)
            path.write_text(json.dumps(state))

    as_if_older()
    assert Trainer(config, log=lambda *_: None).fit().status == "already finished"
    as_if_older()
    with pytest.raises(GptlabError, match=r"other settings \(seed 1337 -> 7\)"):  # from the default the old run ran with
        Trainer(dataclasses.replace(config, seed=7), log=lambda *_: None).fit()


def test_compile_on_a_cpu_without_a_cpp_compiler_is_refused_before_compute(prepared, tmp_path, monkeypatch):
    """torch's inductor builds C++ on a CPU: with no compiler found the run is one line, and nothing is made."""
    from gptlab.runtime import GptlabError

    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(GptlabError, match=r"needs a C\+\+ compiler .* or pass --compile false"):
        quiet(tiny_config(prepared, tmp_path / "run", compile=True))
    assert not (tmp_path / "run").exists()
    monkeypatch.setenv("CXX", "my-c++")
    monkeypatch.setattr("shutil.which", lambda name: f"/opt/bin/{name}" if name == "my-c++" else None)
    quiet(tiny_config(prepared, tmp_path / "run", compile=True))  # $CXX is the compiler torch would use
