"""The training memory estimate follows the step's options: the fused loss (the Trainer's default) and activation
checkpointing, checked against the peak live tensor bytes of that step measured on the CPU."""

import pytest
import torch

from gptlab.cli.main import main
from gptlab.model import preset
from gptlab.model.accounting import training_memory
from gptlab.train.fit import choose_micro_batch
from gptlab.train.measure import measure_training

CPU = torch.device("cpu")


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("fused", [False, True])
def test_training_memory_estimate_follows_the_loss_and_checkpointing_to_the_measured_peak(fused, checkpointing):
    """The estimate counts every gradient at once (the peak is at backward's start, before the blocks'),
    and recomputation holds one block at a time: the measured peak is 75-100% of it, never more."""
    config = preset("gpt2-mini", block_size=64, vocab_size=8192)
    m = measure_training(config, batch_size=16, seq_len=64, precision="fp32", device=CPU, steps=1, fused_loss=fused,
                         activation_checkpointing=checkpointing)
    assert 0.75 * m.estimated_memory <= m.peak_memory <= 1.03 * m.estimated_memory


def test_the_fused_loss_estimate_is_not_the_plain_loss_estimate():
    """The plain loss's whole logits counted for a fused step made the estimate about twice the measured peak here."""
    config = preset("gpt2-mini", block_size=64, vocab_size=8192)
    fused = measure_training(config, batch_size=16, seq_len=64, precision="fp32", device=CPU, steps=1)
    plain_estimate = training_memory(config, 16, 64, amp="fp32")["total"]
    assert fused.estimated_memory < 0.6 * plain_estimate and fused.peak_memory < 0.6 * plain_estimate


def test_auto_micro_batch_follows_the_fused_loss():
    """Free memory for 16 sequences with the fused loss: auto takes 16 with it, fewer with the plain loss."""
    config = preset("gpt2-mini", block_size=64, vocab_size=8192)
    free = int(1.2 * training_memory(config, 16, 64, amp="fp32", fused_loss=True)["total"])
    choose = {fused: choose_micro_batch(config, 64, 64, free=free, precision="fp32", device=CPU, fused_loss=fused).micro_batch
              for fused in (False, True)}
    assert choose[True] == 16 and choose[False] < 16  # the plain loss's logits would not fit at 16


def test_cli_model_info_memory_follows_the_loss_and_checkpointing_flags(capsys):
    config = preset("gpt2")  # totals of 5.67, 9.22 and 3.63 GiB: each flag shows
    for flags, options in (([], {"fused_loss": True}), (["--loss", "plain"], {}),
                           (["--activation-checkpointing"], {"fused_loss": True, "activation_checkpointing": True})):
        assert main(["model", "info", "--preset", "gpt2", *flags]) == 0
        out = capsys.readouterr().out
        assert f"\n  {'total':<13}{training_memory(config, 8, 1024, **options)['total'] / 2**30:8.2f}\n" in out
