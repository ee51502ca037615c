"""The output layer and the cross-entropy in one pass over chunks of rows, with the gradients made on the way.

Unfused, training builds the (tokens x vocab) logits, then soft-caps them, log-softmaxes them and reads
one entry per row, each step a pass over that whole tensor and each kept for the backward pass: on a
CPU that is about a fifth of a small model's step, on a GPU the largest activation. Here each chunk of
rows goes through the head's matmul, the cap, log-sum-exp and the loss while it is still in cache, and
since the loss is a scalar its gradients are known then too (as Liger-Kernel's fused linear cross-entropy):

    z = cap * tanh(x W^T / cap)          (or x W^T without a cap)
    loss_i = logsumexp(z_i) - z_i[y_i]
    dz_i = softmax(z_i) - onehot(y_i)    dlogits = dz * (1 - tanh^2)
    dx = dlogits W                        dW = dlogits^T x

with tanh(u) = 2 sigmoid(2u) - 1 and 1 - tanh(u)^2 = 4 sigmoid(2u) (1 - sigmoid(2u)).

The backward pass only scales the saved dx and dW by the incoming gradient. Equal to
GPT.forward's unfused loss in value and gradient (tests). Only for training: without gradients the
plain path is cheaper. Not under torch.compile either: compiled with the model it ran 20x slower here,
and compile fuses the plain loss its own way (the Trainer uses it only without --compile).
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 2**20  # logits per chunk: 4 MB in fp32, cache-sized (2**18 to 2**20 ran alike here, 2**22 slower)


def chunk_rows(vocab: int, width: int) -> int:
    """Rows a chunk: its logits cache-sized, but at least 4 x width rows, since every chunk adds its dW into the
    whole (vocab x width) gradient (with 64 rows a chunk, GPT-2's vocabulary made the step 1.5x slower)."""
    return max(CHUNK_ELEMENTS // max(vocab, 1), 4 * width)


class LinearCrossEntropy(torch.autograd.Function):
    """loss(x (N, d), weight (V', d) with V' >= vocab, targets (N,)): the mean or sum over rows not ignored."""

    @staticmethod
    def forward(ctx, x, weight, targets, vocab: int, softcap: float, ignore_index: int, reduction: str):
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype  # the matmuls' dtype
        w = weight[:vocab].to(dtype)
        grad_x = torch.empty_like(x)
        grad_w = torch.zeros_like(weight)
        valid = targets != ignore_index
        safe = torch.where(valid, targets, 0)
        total = torch.zeros((), dtype=torch.float32, device=x.device)
        step = chunk_rows(vocab, x.size(1))
        with torch.autocast(device, enabled=False):
            for start in range(0, x.size(0), step):
                rows = slice(start, start + step)
                loss, dx = _chunk(x[rows].to(dtype), w, safe[rows], valid[rows], softcap, grad_w[:vocab])
                total += loss
                grad_x[rows] = dx
        scale = 1.0 / valid.sum().float() if reduction == "mean" else torch.ones((), device=x.device)
        ctx.save_for_backward(grad_x, grad_w, scale)
        return total * scale

    @staticmethod
    def backward(ctx, grad_out):
        grad_x, grad_w, scale = ctx.saved_tensors
        factor = grad_out * scale
        return grad_x * factor.to(grad_x.dtype), grad_w * factor.to(grad_w.dtype), None, None, None, None, None


def _chunk(x, w, targets, valid, softcap, grad_w) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's summed loss and dx; its dW added to grad_w."""
    z = (x @ w.T).float()
    if softcap:  # cap * tanh(z / cap) as cap * (2 sigmoid(2z / cap) - 1), in place: torch's CPU tanh is 3x its sigmoid
        s = z.mul_(2 / softcap).sigmoid_()
        slope = s * (1 - s)  # tanh' = 1 - tanh^2 = 4 s (1 - s)
        z = s.mul_(2 * softcap).sub_(softcap)
    lse = torch.logsumexp(z, dim=-1)
    picked = z.gather(1, targets[:, None]).squeeze(1)
    loss = ((lse - picked) * valid).sum()
    dz = z.sub_(lse[:, None]).exp_()  # softmax, in z's memory
    dz[torch.arange(dz.size(0), device=dz.device), targets] -= 1
    dz.mul_(valid[:, None])
    if softcap:
        dz.mul_(slope.mul_(4))
    dz = dz.to(x.dtype)
    grad_w.add_((dz.T @ x).to(grad_w.dtype))
    return loss, dz @ w


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab: int, softcap: float = 0.0,
                         ignore_index: int = -100, reduction: str = "mean") -> torch.Tensor:
    """F.cross_entropy(cap(x @ weight[:vocab].T), targets) for x (..., d) and targets (...), fused and chunked."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be mean or sum, got {reduction!r}")
    return LinearCrossEntropy.apply(x.reshape(-1, x.size(-1)), weight, targets.reshape(-1), vocab, float(softcap or 0.0),
                                    ignore_index, reduction)
