"""evaluate_loss runs a batch a few rows at a time: the same sums as the whole batch at once."""

import torch

from gptlab.eval import loss as loss_module
from gptlab.model import GPT, preset


class Batches:
    def __init__(self, batches):
        self.batches = list(batches)

    def next_batch(self):
        if not self.batches:
            raise StopIteration
        return self.batches.pop(0)


def test_evaluate_loss_in_rows_equals_the_whole_batch_and_bounds_the_logits_held(monkeypatch):
    torch.manual_seed(0)
    model = GPT(preset("gpt2-tiny", vocab_size=97, block_size=16))
    x, y = torch.randint(0, 97, (2, 6, 16)), torch.randint(0, 97, (2, 6, 16))
    y[0, 0, :5] = -100  # ignored targets count nowhere
    token_bytes = torch.randint(0, 4, (97,))
    whole = loss_module.evaluate_loss(model, Batches(zip(x, y)), 2, token_bytes)
    seen = []
    original = model.forward
    monkeypatch.setattr(model, "forward", lambda idx, **kwargs: seen.append(idx.shape[0]) or original(idx, **kwargs))
    monkeypatch.setattr(loss_module, "LOGIT_BYTES", 4 * 16 * 97 * 4)  # four rows' logits at a time
    rows = loss_module.evaluate_loss(model, Batches(zip(x, y)), 2, token_bytes)
    assert seen == [4, 2, 4, 2]
    assert rows["tokens"] == whole["tokens"] == 2 * 6 * 16 - 5
    assert abs(rows["loss"] - whole["loss"]) < 1e-6 and abs(rows["bpb"] - whole["bpb"]) < 1e-6
