"""Runs that fit the machine: the auto micro-batch against hand-set budgets, and the out-of-memory
backoff against a run that started at the smaller micro-batch (same seed, same data)."""

import dataclasses
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from gptlab.load.checkpoints import list_checkpoints
from gptlab.model import preset
from gptlab.runtime import GptlabError
from gptlab.train import TrainConfig, Trainer
from gptlab.train.fit import SAFETY, cgroup_room, choose_micro_batch, free_memory, micro_batch_memory, smaller_micro_batch

from .conftest import tiny_config

CPU = torch.device("cpu")


def short_config(prepared, out, **changes) -> TrainConfig:
    """4 steps of 16 sequences, checkpoints at 2 and 4."""
    return tiny_config(prepared, out, **{"batch_tokens": 16 * 32, "max_steps": 4, "checkpoint_every": 2, "eval_every": 0,
                                         **changes})


def final_weights(out) -> dict[str, torch.Tensor]:
    return load_file(list_checkpoints(out)[-1] / "model.safetensors")


def saved_micro_batches(out) -> dict[str, int]:
    """The micro-batch each saved config records: train_config.json and every checkpoint's trainer state."""
    found = {"train_config.json": json.loads((out / "train_config.json").read_text())["micro_batch"]}
    for path in list_checkpoints(out):
        found[path.name] = json.loads((path / "trainer_state.json").read_text())["config"]["micro_batch"]
    return found


def out_of_memory_above(monkeypatch, limit: int, from_step: int = 0) -> None:
    """Micro-batches larger than `limit` run out of memory on their second micro-step of a step (from `from_step`
    on): after a forward and backward, so partial gradients and a used random state are there to clean up."""
    original = Trainer._micro_loss

    def micro_loss(self, x, y, kwargs, weight):
        loss = original(self, x, y, kwargs, weight)
        if x.shape[0] > limit and self.state.step >= from_step:
            self.large_calls = getattr(self, "large_calls", 0) + 1
            if self.large_calls % 2 == 0:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return loss

    monkeypatch.setattr(Trainer, "_micro_loss", micro_loss)


# ---------------------------------------------------------------- choosing and shrinking


def test_choose_micro_batch_takes_the_largest_divisor_whose_estimate_fits():
    model = preset("gpt2-tiny", vocab_size=512, block_size=32)
    memory = {b: micro_batch_memory(model, b, 32, precision="fp32", device=CPU) for b in range(1, 13)}
    assert all(memory[b] < memory[b + 1] for b in range(1, 12))  # more sequences, more memory
    exactly_four = choose_micro_batch(model, 12, 32, free=int(memory[4] / SAFETY) + 1, precision="fp32", device=CPU)
    assert (exactly_four.micro_batch, exactly_four.accumulation, exactly_four.estimate) == (4, 3, memory[4])
    # 5 would fit, but 12 sequences do not split into micro-batches of 5
    five_fit = choose_micro_batch(model, 12, 32, free=int(memory[5] / SAFETY) + 1, precision="fp32", device=CPU)
    assert five_fit.micro_batch == 4
    everything = choose_micro_batch(model, 12, 32, free=10 * 2**30, precision="fp32", device=CPU)
    assert (everything.micro_batch, everything.accumulation) == (12, 1)
    assert everything.describe() == (f"micro-batch auto: 12 (estimated {memory[12] / 2**30:.1f} GiB of 10.0 GiB free; "
                                     "1 accumulation steps)")


def test_choose_micro_batch_refuses_a_model_whose_one_sequence_does_not_fit():
    model = preset("gpt2-tiny", vocab_size=512, block_size=32)
    with pytest.raises(GptlabError, match="the model does not fit: one sequence of 32 tokens needs an estimated"):
        choose_micro_batch(model, 8, 32, free=1000, precision="fp32", device=CPU)


def test_micro_batch_memory_counts_attention_scores_only_where_sdpa_falls_back_to_math():
    plain, dropout = preset("gpt2-tiny"), preset("gpt2-tiny", dropout=0.1)
    scores = 2 * 4 * 64 * 64 * (4 + 1 + 4)  # per layer: a T^2 B scores, mask and dropout output, fp32 (Korthikanti)
    masks = 2 * 4 * 64 * 32  # per layer: the two dropout masks, 1 byte per element
    cpu_gap = micro_batch_memory(dropout, 4, 64, precision="fp32", device=CPU) - micro_batch_memory(plain, 4, 64, precision="fp32", device=CPU)
    assert cpu_gap == 2 * (scores + masks)
    cuda = torch.device("cuda")  # only named: nothing runs on it
    assert micro_batch_memory(dropout, 4, 64, precision="fp32", device=cuda) - micro_batch_memory(plain, 4, 64, precision="fp32", device=cuda) == 2 * masks
    math = preset("gpt2-tiny", attention="math")  # the spelled-out reference keeps its scores everywhere
    assert micro_batch_memory(math, 4, 64, precision="fp32", device=cuda) - micro_batch_memory(plain, 4, 64, precision="fp32", device=cuda) == 2 * (2 * 4 * 64 * 64 * 4)


@pytest.mark.parametrize(("micro_batch", "smaller"), [(16, 8), (12, 6), (9, 3), (7, 1), (2, 1), (1, 0)])
def test_smaller_micro_batch_is_the_largest_proper_divisor(micro_batch, smaller):
    assert smaller_micro_batch(micro_batch) == smaller


def test_free_memory_on_cpu_is_at_most_the_machine_memory():
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < free_memory(CPU) <= total


def test_cgroup_room_is_the_limit_less_the_usage(tmp_path):
    assert cgroup_room(tmp_path) is None  # no cgroup files: no limit
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "memory.current").write_text("73741824\n")
    assert cgroup_room(tmp_path) is None  # unlimited
    (tmp_path / "memory.max").write_text("1073741824\n")
    assert cgroup_room(tmp_path) == 1_000_000_000


def test_micro_batch_zero_is_refused_where_nothing_resolves_it():
    with pytest.raises(GptlabError, match="micro_batch 0 .* pass --micro-batch N"):
        TrainConfig(micro_batch=0).accumulation_steps(1)


# ---------------------------------------------------------------- auto in the Trainer


def test_auto_micro_batch_fits_the_free_memory_and_is_saved_resolved(prepared, tmp_path, monkeypatch):
    config = short_config(prepared, tmp_path / "auto", micro_batch=0, batch_tokens=8 * 32)
    two = micro_batch_memory(config.model, 2, 32, precision="fp32", device=CPU)
    monkeypatch.setattr("gptlab.train.micro_batch.free_memory", lambda device: int(two / SAFETY) + 1)  # 2 fit, 4 do not
    lines = []
    trainer = Trainer(config, log=lines.append)
    assert (trainer.config.micro_batch, trainer.accum) == (2, 4)
    trainer.fit()
    assert any(line.startswith("micro-batch auto: 2 (estimated ") and "; 4 accumulation steps)" in line for line in lines)
    assert set(saved_micro_batches(tmp_path / "auto").values()) == {2}
    Trainer(short_config(prepared, tmp_path / "two", micro_batch=2, batch_tokens=8 * 32), log=lambda *_: None).fit()
    for name, tensor in final_weights(tmp_path / "two").items():
        assert torch.equal(final_weights(tmp_path / "auto")[name], tensor), name


# ---------------------------------------------------------------- out-of-memory backoff


def test_out_of_memory_retries_the_step_at_a_smaller_micro_batch_as_if_the_run_started_there(prepared, tmp_path, monkeypatch):
    """8 -> 4 -> 2 on the first step (dropout on: the retry restores the random state) == a run at 2 from the start."""
    model = preset("gpt2-tiny", vocab_size=512, block_size=32, dropout=0.1)
    config = short_config(prepared, tmp_path / "backoff", model=model, micro_batch=8)
    small = Trainer(short_config(prepared, tmp_path / "small", model=model, micro_batch=2), log=lambda *_: None).fit()
    out_of_memory_above(monkeypatch, limit=2)
    lines = []
    backed_off = Trainer(config, log=lines.append).fit()
    assert [line for line in lines if line.startswith("out of memory")] == [
        "out of memory at micro-batch 8 (step 0): retrying the step at micro-batch 4 x 4 accumulation steps, the same batch",
        "out of memory at micro-batch 4 (step 0): retrying the step at micro-batch 2 x 8 accumulation steps, the same batch",
    ]
    assert backed_off.losses == small.losses
    small_weights, weights = final_weights(tmp_path / "small"), final_weights(tmp_path / "backoff")
    for name, tensor in small_weights.items():
        assert torch.allclose(weights[name], tensor, rtol=0, atol=1e-7), name
    assert set(saved_micro_batches(tmp_path / "backoff").values()) == {2}


def test_out_of_memory_in_the_middle_of_a_run_continues_the_same_data(prepared, tmp_path, monkeypatch):
    """Steps 0-1 at 8, step 2 retried at 4, then on: the same data and update as a run at 4 throughout
    (within float rounding: 8 rows summed in one pass or two differ in the last bits)."""
    config = short_config(prepared, tmp_path / "backoff", micro_batch=8)
    Trainer(short_config(prepared, tmp_path / "four", micro_batch=4), log=lambda *_: None).fit()
    out_of_memory_above(monkeypatch, limit=4, from_step=2)
    Trainer(config, log=lambda *_: None).fit()
    assert saved_micro_batches(tmp_path / "backoff") == {"train_config.json": 4, "step_000002": 8, "step_000004": 4}
    four, weights = final_weights(tmp_path / "four"), final_weights(tmp_path / "backoff")
    for name, tensor in four.items():
        torch.testing.assert_close(weights[name], tensor, rtol=1e-4, atol=1e-5)


def test_a_run_resumes_at_the_micro_batch_its_checkpoint_was_trained_with(prepared, tmp_path, monkeypatch):
    """Backed off to 2 on step 0; resumed from step 2 with the config's 8 (and no memory trouble), it keeps 2: == a run at 2."""
    config = short_config(prepared, tmp_path / "backoff", micro_batch=8)
    Trainer(short_config(prepared, tmp_path / "small", micro_batch=2), log=lambda *_: None).fit()
    with monkeypatch.context() as patch:
        out_of_memory_above(patch, limit=2)
        Trainer(config, log=lambda *_: None).fit()
    shutil.copytree(tmp_path / "backoff", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step_000004")
    lines = []
    resumed = Trainer(dataclasses.replace(config, out=str(tmp_path / "resumed")), log=lines.append).fit()
    assert resumed.steps == 4 and len(resumed.losses) == 2
    assert "micro-batch 2 as in the checkpoint (not 8): a resumed run keeps its batches" in lines
    for name, tensor in final_weights(tmp_path / "small").items():
        assert torch.equal(final_weights(tmp_path / "resumed")[name], tensor), name
    assert set(saved_micro_batches(tmp_path / "resumed").values()) == {2}


def test_out_of_memory_at_micro_batch_1_says_what_to_reduce(prepared, tmp_path, monkeypatch):
    original = Trainer._micro_loss

    def always_out_of_memory(self, x, y, kwargs, weight):
        original(self, x, y, kwargs, weight)
        raise torch.OutOfMemoryError("CUDA out of memory (injected)")

    monkeypatch.setattr(Trainer, "_micro_loss", always_out_of_memory)
    lines = []
    with pytest.raises(GptlabError, match="out of memory with micro_batch 1 x seq_len 32: one sequence does not fit; "
                                          "use a shorter --seq-len, a smaller model"):
        Trainer(short_config(prepared, tmp_path / "run", micro_batch=4, batch_tokens=4 * 32), log=lines.append).fit()
    assert sum(line.startswith("out of memory at micro-batch") for line in lines) == 2  # 4 -> 2 -> 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_real_cuda_out_of_memory_backs_off_and_trains(prepared, tmp_path):
    """A micro-batch four times the GPU's free memory (by the estimate): the step runs out, backs off, and trains.

    A ballast tensor leaves 2 GiB free first, so the micro-batch that overflows is a few hundred sequences whatever
    the card's size (on an H200's 139 GiB, a tiny model's would be hundreds of thousands, which cuDNN's attention
    refuses with an error that is not an out-of-memory, and the estimate's margin could let twice-too-many fit)."""
    cuda = torch.device("cuda")
    ballast = torch.empty(max(0, free_memory(cuda) - (2 << 30)), dtype=torch.uint8, device=cuda)
    model = preset("gpt2-tiny", vocab_size=512, block_size=256)
    per_sequence = micro_batch_memory(model, 1, 256, precision="bf16", device=cuda)
    too_many = 1 << (4 * free_memory(cuda) // per_sequence).bit_length()  # a power of 2 above four times what fits
    config = short_config(prepared, tmp_path / "run", model=model, seq_len=256, micro_batch=too_many,
                         batch_tokens=too_many * 256, max_steps=1, loader_mode="random", device="cuda",
                         precision="bf16", eval_every=0, checkpoint_every=0)
    lines = []
    result = Trainer(config, log=lines.append).fit()
    assert result.steps == 1 and all(map(torch.isfinite, map(torch.tensor, result.losses)))
    assert any(line.startswith(f"out of memory at micro-batch {too_many} (step 0)") for line in lines)
    assert json.loads((tmp_path / "run" / "train_config.json").read_text())["micro_batch"] < too_many
    del ballast
