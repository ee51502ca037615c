"""save_checkpoint / load_checkpoint for any module and optimizer: a custom loop resumes exactly."""

import random

import numpy as np
import pytest
import torch

from gptlab.runtime import GptlabError
from gptlab.train.checkpoint import load_checkpoint, save_checkpoint


class TiedNet(torch.nn.Module):
    """Not gptlab's GPT: an embedding tied to the output layer, dropout, a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(11, 8)
        self.hidden = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 11, bias=False)
        self.out.weight = self.embed.weight
        self.drop = torch.nn.Dropout(0.2)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return self.out(self.drop(torch.tanh(self.hidden(self.embed(x)))))


def steps(model, optimizer, n: int) -> list[float]:
    """n steps of a loop that draws from Python's, numpy's and torch's generators."""
    losses = []
    for _ in range(n):
        x = (torch.tensor([random.randrange(11) for _ in range(6)]) + torch.from_numpy(np.random.randint(0, 11, 6))) % 11
        loss = torch.nn.functional.cross_entropy(model(x), torch.randint(0, 11, (6,)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def seeded() -> tuple[TiedNet, torch.optim.Optimizer]:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    model = TiedNet()
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def test_any_module_and_optimizer_resume_exactly_like_an_uninterrupted_loop(tmp_path):
    model, optimizer = seeded()
    straight = steps(model, optimizer, 8)

    model, optimizer = seeded()
    first = steps(model, optimizer, 3)
    path = save_checkpoint(tmp_path / "step_3", model, optimizer, state={"step": 3})
    assert not (path / "config.json").exists()  # only gptlab's GPT has a model config
    steps(model, optimizer, 2)  # the process goes on (and moves every generator) before it dies

    fresh, fresh_optimizer = TiedNet(), None
    fresh_optimizer = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    state = load_checkpoint(path, fresh, fresh_optimizer)
    assert state == {"step": 3}
    assert fresh.out.weight is fresh.embed.weight and fresh.calls.item() == 3  # the tie and the buffer survive
    assert first + steps(fresh, fresh_optimizer, 5) == straight


def test_the_fp16_grad_scaler_state_is_saved_and_restored(tmp_path):
    model = torch.nn.Linear(2, 2)
    scaler = torch.amp.GradScaler("cpu", enabled=True, init_scale=1024.0, growth_interval=7)
    scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
    scaler.update(new_scale=512.0)
    save_checkpoint(tmp_path / "ckpt", model, scaler=scaler)
    restored = torch.amp.GradScaler("cpu", enabled=True)
    load_checkpoint(tmp_path / "ckpt", torch.nn.Linear(2, 2), scaler=restored)
    assert restored.get_scale() == 512.0 and restored.get_growth_interval() == 7


def test_a_module_of_another_shape_is_one_clear_error(tmp_path):
    save_checkpoint(tmp_path / "ckpt", torch.nn.Linear(2, 3))
    with pytest.raises(GptlabError, match=r"model.safetensors does not match the model"):
        load_checkpoint(tmp_path / "ckpt", torch.nn.Linear(2, 4))


def test_a_truncated_file_is_named(tmp_path):
    model = torch.nn.Linear(2, 3)
    path = save_checkpoint(tmp_path / "ckpt", model, torch.optim.SGD(model.parameters(), lr=0.1))
    data = (path / "optimizer.pt").read_bytes()
    (path / "optimizer.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(GptlabError, match=r"ckpt is damaged: .*optimizer.pt does not match the size and checksum"):
        load_checkpoint(path, model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_saving_over_a_checkpoint_replaces_it_whole(tmp_path):
    first, second = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    save_checkpoint(tmp_path / "ckpt", first, state={"n": 1})
    save_checkpoint(tmp_path / "ckpt", second, state={"n": 2})
    loaded = torch.nn.Linear(2, 2)
    assert load_checkpoint(tmp_path / "ckpt", loaded) == {"n": 2}
    assert torch.equal(loaded.weight, second.weight)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary or old folder left
