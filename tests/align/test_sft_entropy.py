"""SFT's entropy metrics: val_entropy at each evaluation and, when the step sees its logits, entropy per step, each
equal to token_entropy of the same model on the same batches' assistant tokens."""

import dataclasses
import json

import pytest
import torch

from gptlab.align.finetune import sft
from gptlab.align.finetune.sft import SFTConfig, SFTTrainer, evaluate_entropy
from gptlab.align.logprobs import IGNORE, token_entropy
from gptlab.model import GPT, ModelConfig, preset
from gptlab.train import Trainer
from gptlab.train.optim import OptimizerConfig
from gptlab.train.schedule import ScheduleConfig

from ..train.conftest import tiny_config


@pytest.fixture(scope="module")
def base(prepared, tmp_path_factory):
    """A tiny pretrained model run (2 steps), with its tokenizer in its checkpoints."""
    out = tmp_path_factory.mktemp("base") / "run"
    config = tiny_config(prepared, out, model=preset("gpt2-tiny", vocab_size=512, block_size=64), seq_len=64,
                         batch_tokens=4 * 64, max_steps=2)
    Trainer(config, log=lambda *_: None).fit()
    return out


def sft_config(base, out, **changes) -> SFTConfig:
    config = SFTConfig(
        data="task:arithmetic[n=200]", init_from=str(base), out=str(out), model=preset("gpt2-tiny", vocab_size=512, block_size=64),
        optimizer=OptimizerConfig(lr=3e-3, weight_decay=0.0), schedule=ScheduleConfig(kind="constant", warmup_steps=0),
        batch_tokens=4 * 64, micro_batch=2, seq_len=64, max_steps=2, precision="fp32", device="cpu",
        eval_every=1, eval_batches=2, checkpoint_every=2, log_every=1, tasks="none",
    )
    return dataclasses.replace(config, **changes)


def reference_entropy(model, batches) -> float:
    """Mean of token_entropy over the counted targets of (x, y, kwargs) batches, the whole batch in one forward."""
    values = []
    with torch.no_grad():
        for x, y, kwargs in batches:
            logits, _ = model(x, **kwargs)
            values.append(token_entropy(logits)[y != IGNORE])
    return torch.cat(values).double().mean().item()


class ListLoader:
    def __init__(self, batches):
        self.batches, self.at = batches, 0

    def next_batch(self):
        if self.at == len(self.batches):
            raise StopIteration
        self.at += 1
        return self.batches[self.at - 1]


def test_evaluate_entropy_equals_token_entropy_at_the_counted_targets_a_row_at_a_time(monkeypatch):
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16))
    generator = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(3):
        x, y = torch.randint(0, 64, (3, 8), generator=generator), torch.randint(0, 64, (3, 8), generator=generator)
        y[:, :3] = IGNORE  # the prompt's tokens do not count
        batches.append((x, y, {}))
    expected = reference_entropy(model, batches[:2])
    assert evaluate_entropy(model, ListLoader(batches), 2, None) == pytest.approx(expected, rel=1e-6)
    monkeypatch.setattr(sft, "LOGIT_BYTES", 1)  # one row per forward: the same figure
    assert evaluate_entropy(model, ListLoader(batches), 2, None) == pytest.approx(expected, rel=1e-6)
    assert evaluate_entropy(model, ListLoader(batches), 10, None) == pytest.approx(reference_entropy(model, batches), rel=1e-6)


def records(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_sft_logs_val_entropy_equal_to_token_entropy_on_the_val_batches(base, tmp_path):
    trainer = SFTTrainer(sft_config(base, tmp_path / "sft"), log=lambda *_: None)
    trainer.fit()
    logged = [record for record in records(tmp_path / "sft") if "val_entropy" in record]
    val_loss_steps = [record["step"] for record in records(tmp_path / "sft") if "val_loss" in record]
    assert [record["step"] for record in logged] == val_loss_steps == [1, 2]  # beside each evaluation's val loss
    trainer.val_loader.reset()  # the batches the last evaluation read, and the model it read them with
    batches = [trainer.val_loader.next_batch() for _ in range(trainer.config.eval_batches)]
    expected = reference_entropy(trainer.model, [(x, y, extra[0] if extra else {}) for x, y, *extra in batches])
    assert logged[-1]["val_entropy"] == pytest.approx(expected, rel=1e-5)
    assert all("entropy" not in record for record in records(tmp_path / "sft"))  # fused loss: no logits, no train figure


class Recording(SFTTrainer):
    """Keeps each micro-batch the step trained on."""

    def _micro_loss(self, x, y, kwargs, weight):
        self.seen = [*getattr(self, "seen", []), (x, y, kwargs)]
        return super()._micro_loss(x, y, kwargs, weight)


def test_sft_logs_train_entropy_per_step_when_the_step_holds_logits(base, tmp_path):
    # lr 0: the weights after the step are those the step's forward used, so the figure can be recomputed
    config = sft_config(base, tmp_path / "sft", fused_loss=False, max_steps=1, eval_every=0,
                        optimizer=OptimizerConfig(lr=0.0, weight_decay=0.0))
    trainer = Recording(config, log=lambda *_: None)
    trainer.fit()
    (step,) = [record for record in records(tmp_path / "sft") if "loss" in record]
    assert trainer.accum == 2 and len(trainer.seen) == 2  # two micro-batches, one figure over both
    trainer.model.eval()
    assert step["entropy"] == pytest.approx(reference_entropy(trainer.model, trainer.seen), rel=1e-5)
