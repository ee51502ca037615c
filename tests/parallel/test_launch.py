"""Launched as users launch it: two torchrun "nodes" meeting at a c10d rendezvous, running the Trainer with
--parallel.* flags and a hand data-parallel loop, each against a single process.

One launch serves both tests (starting the nodes costs more than the runs in them); `torchrun --standalone` is
launched by tests/train/test_trainer.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from gptlab.train import Trainer
from tests.parallel.common import single_process_weights
from tests.train.conftest import tiny_config
from tests.train.test_trainer import final_weights

ROOT = Path(__file__).resolve().parents[2]

TRAINER_SCRIPT = """
import dataclasses, shutil, sys
from pathlib import Path
import torch
from gptlab.runtime.config import apply_overrides
from gptlab.train import Trainer
from tests.train.conftest import tiny_config
base = tiny_config(Path(sys.argv[1]), Path(sys.argv[2]), micro_batch=2, batch_tokens=8 * 32, max_steps=3)
for name, flags in [("bucketed", ["--parallel.data-parallel", "bucketed", "--parallel.bucket-mb", "0.05"]),
                    ("zero1", ["--parallel.shard-optimizer", "zero1"]),
                    ("zero-torch", ["--parallel.shard-optimizer", "torch"]),
                    ("fsdp", ["--parallel.fsdp", "true"])]:
    config = apply_overrides(dataclasses.replace(base, out=str(Path(sys.argv[2]) / name)), flags)
    Trainer(config, log=lambda *_: None).fit()
# resume: 4 steps under torch DDP, then from its step-2 checkpoint under ZeRO-1 and under FSDP2
straight = dataclasses.replace(base, out=str(Path(sys.argv[2]) / "straight"), max_steps=4, checkpoint_every=2)
Trainer(straight, log=lambda *_: None).fit()
for name, flags in [("resumed-zero1", ["--parallel.shard-optimizer", "zero1"]), ("resumed-fsdp", ["--parallel.fsdp", "true"])]:
    if torch.distributed.get_rank() == 0:
        shutil.copytree(Path(sys.argv[2]) / "straight", Path(sys.argv[2]) / name)
        shutil.rmtree(Path(sys.argv[2]) / name / "checkpoints" / "step_000004")
    torch.distributed.barrier()
    result = Trainer(apply_overrides(dataclasses.replace(straight, out=str(Path(sys.argv[2]) / name)), flags), log=lambda *_: None).fit()
    assert result.losses and len(result.losses) == 2, result
"""

# The bucketed hand data parallel on the tiny model, each node saving its own weights (in the same process group).
NODE_SCRIPT = """
from gptlab.parallel.data_parallel import DataParallel
from gptlab.runtime.device import init_runtime, shutdown_runtime
from tests.parallel.common import LR, batches, make_model, rank_rows, train
runtime = init_runtime("cpu")
model = make_model()
wrapped = DataParallel(model, variant="bucketed", bucket_mb=300 / 2**20)
optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
train(wrapped, optimizer, rank_rows(batches(runtime.world_size, 2), runtime.rank), no_sync=wrapped.no_sync,
      finish=wrapped.finish_gradient_synchronization)
torch.save(model.state_dict(), f"{sys.argv[2]}/node{runtime.rank}.pt")
shutdown_runtime(runtime)
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def two_nodes(prepared, tmp_path_factory) -> Path:
    """torchrun --nnodes 2 --nproc-per-node 1, twice, as on two machines (docs/multinode.md), running TRAINER_SCRIPT
    then NODE_SCRIPT: the folder they wrote."""
    folder = tmp_path_factory.mktemp("two_nodes")
    script = folder / "nodes.py"
    script.write_text(TRAINER_SCRIPT + NODE_SCRIPT)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    endpoint, run_id = f"127.0.0.1:{_free_port()}", f"gptlab-test-{uuid.uuid4().hex[:8]}"
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                               "--node-rank", str(rank), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                               "--rdzv-id", run_id, str(script), str(prepared), str(folder / "ddp")],
                              env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(2)]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert all(node.returncode == 0 for node in nodes), "\n".join(output[-2000:] for output in outputs)
    return folder / "ddp"


@pytest.mark.xdist_group("launch_two_nodes")  # one worker runs the shared launch once
def test_trainer_with_hand_data_parallel_zero_and_fsdp_equals_one_process(prepared, tmp_path, two_nodes):
    """2 gloo ranks x 2 micro-steps x 2 sequences == 1 process x 4 micro-steps x 2 sequences, for
    --parallel.data-parallel bucketed, --parallel.shard-optimizer zero1 or torch and --parallel.fsdp true; the sharded
    runs' checkpoints hold the whole optimizer state, as the single process saves it; and a torch DDP run resumed
    from its step-2 checkpoint under ZeRO-1 or FSDP2 ends where it ends uninterrupted."""
    single = tiny_config(prepared, tmp_path / "single", micro_batch=2, batch_tokens=8 * 32, max_steps=3)
    Trainer(single, log=lambda *_: None).fit()
    reference = final_weights(tmp_path / "single")
    for name in ("bucketed", "zero1", "zero-torch", "fsdp"):
        weights = final_weights(two_nodes / name)
        assert weights.keys() == reference.keys(), name
        for key in reference:
            torch.testing.assert_close(weights[key], reference[key], rtol=1e-4, atol=1e-5, msg=f"{name} {key}")
    for name in ("zero1", "zero-torch", "fsdp"):
        saved = torch.load(_last(two_nodes / name) / "optimizer.pt", weights_only=True)
        plain = torch.load(_last(tmp_path / "single") / "optimizer.pt", weights_only=True)
        assert saved["state"].keys() == plain["state"].keys(), name
        assert [g["params"] for g in saved["param_groups"]] == [g["params"] for g in plain["param_groups"]], name
        for index, state in plain["state"].items():
            torch.testing.assert_close(saved["state"][index]["exp_avg"], state["exp_avg"], rtol=1e-3, atol=1e-6)
    for name in ("resumed-zero1", "resumed-fsdp"):  # the checkpoint format is the same whatever shards the state
        straight, resumed = final_weights(two_nodes / "straight"), final_weights(two_nodes / name)
        assert _last(two_nodes / name).name == "step_000004"
        for key in straight:
            torch.testing.assert_close(resumed[key], straight[key], rtol=1e-4, atol=1e-5, msg=f"{name} {key}")


def _last(out: Path) -> Path:
    return sorted((out / "checkpoints").glob("step_*"))[-1]


@pytest.mark.xdist_group("launch_two_nodes")  # one worker runs the shared launch once
def test_two_torchrun_nodes_meet_at_a_c10d_rendezvous_and_train_as_one_process(two_nodes):
    """The bucketed variant's weights on both nodes equal one process trained on both nodes' rows."""
    reference = single_process_weights(2, 2)
    for rank in range(2):
        weights = torch.load(two_nodes / f"node{rank}.pt", weights_only=True)
        for name, tensor in reference.items():
            torch.testing.assert_close(weights[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
