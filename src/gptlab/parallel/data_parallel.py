"""Data parallel by hand: every rank runs the same model on its own micro-batches, then gradients are averaged.

Three variants behind one wrapper (`DataParallel`), from plainest to fastest:

    allreduce   after backward, all-reduce (average) every gradient, one at a time, and wait.
    overlap     each parameter's all-reduce starts asynchronously from its gradient hook, while backward goes on
                computing the earlier layers' gradients; `finish_gradient_synchronization` waits for them all.
    bucketed    as overlap, but gradients are copied into flat buckets of at most `bucket_mb` MiB (parameters in
                reverse order of registration, the order backward produces them) and each bucket is all-reduced
                as one message once all its gradients are in: fewer, larger messages (torch DDP's design).

The step, for every variant:

    for each micro-step:  with model.no_sync() (all but the last): loss.backward()
    model.finish_gradient_synchronization()        # gradients now hold the mean over ranks
    optimizer.step()

Averaging divides by the world size before summing (as torch DDP does), so every rank applies the same
update to the same weights: rank 0's parameters and buffers are broadcast when the wrapper is built.
A parameter used twice (tied weights) appears once in `parameters()` and its hook fires once, after both
uses have accumulated. Parameters that get no gradient keep `grad=None`. Every rank must leave the same
parameters without a gradient (the same model on every rank does), since collectives pair up in order.

Not here: optimizer-state sharding (gptlab.parallel.zero), choosing a variant (gptlab.parallel.wrap).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from gptlab.runtime import GptlabError

VARIANTS = ("allreduce", "overlap", "bucketed")
MIB = 2**20


def broadcast_from_rank0(module: nn.Module) -> None:
    """Copy rank 0's parameters and buffers to every rank: all ranks then start from the same weights."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)


class Bucket:
    """Parameters whose gradients travel in one flat all-reduce, and where each sits in the flat buffer."""

    def __init__(self, parameters: list[nn.Parameter]) -> None:
        self.parameters = parameters
        self.offsets, total = [], 0
        for parameter in parameters:
            self.offsets.append(total)
            total += parameter.numel()
        self.flat = torch.zeros(total, dtype=parameters[0].dtype, device=parameters[0].device)
        self.index = {id(p): i for i, p in enumerate(parameters)}
        self.reset()

    def reset(self) -> None:
        self.ready: set[int] = set()  # positions whose gradient is in `flat`
        self.work = None  # the in-flight all-reduce

    def slice(self, position: int) -> torch.Tensor:
        parameter = self.parameters[position]
        start = self.offsets[position]
        return self.flat[start:start + parameter.numel()].view_as(parameter)

    def add(self, parameter: nn.Parameter) -> bool:
        """Copy this parameter's gradient in; True once every gradient of the bucket is in."""
        position = self.index[id(parameter)]
        self.slice(position).copy_(parameter.grad)
        self.ready.add(position)
        return len(self.ready) == len(self.parameters)


def make_buckets(parameters: list[nn.Parameter], bucket_mb: float) -> list[Bucket]:
    """Reverse order of registration (backward's order), a new bucket when the next gradient would pass the cap
    or has another dtype or device. One parameter larger than the cap gets a bucket of its own."""
    cap = bucket_mb * MIB
    buckets, current, size = [], [], 0
    for parameter in reversed(parameters):
        nbytes = parameter.numel() * parameter.element_size()
        other_kind = current and (parameter.dtype, parameter.device) != (current[0].dtype, current[0].device)
        if current and (size + nbytes > cap or other_kind):
            buckets.append(Bucket(current))
            current, size = [], 0
        current.append(parameter)
        size += nbytes
    if current:
        buckets.append(Bucket(current))
    return buckets


class DataParallel(nn.Module):
    """A module whose gradients are averaged over the ranks of the default process group (see the module docstring)."""

    def __init__(self, module: nn.Module, *, variant: str = "bucketed", bucket_mb: float = 25.0) -> None:
        super().__init__()
        if variant not in VARIANTS:
            raise GptlabError(f"unknown data parallel variant {variant!r}; use one of {', '.join(VARIANTS)}")
        self.module, self.variant = module, variant
        self.world_size = dist.get_world_size()
        self.sync = True  # False inside no_sync(): gradients only accumulate
        self.trained = [p for p in module.parameters() if p.requires_grad]  # parameters() lists a tied weight once
        self.pending: list[tuple[object, nn.Parameter]] = []  # overlap: (work, parameter) in flight
        self.buckets = make_buckets(self.trained, bucket_mb) if variant == "bucketed" else []
        self.bucket_of = {id(p): bucket for bucket in self.buckets for p in bucket.parameters}
        self.wait_seconds = 0.0  # time spent waiting for communication (benchmarks read it)
        broadcast_from_rank0(module)
        hook = {"overlap": self._launch_parameter, "bucketed": self._fill_bucket}.get(variant)
        self.handles = [p.register_post_accumulate_grad_hook(hook) for p in self.trained] if hook else []

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally (micro-steps before the last), as torch DDP's no_sync."""
        before, self.sync = self.sync, False
        try:
            yield
        finally:
            self.sync = before

    # ---------------------------------------------------------------- hooks, during backward

    def _launch_parameter(self, parameter: nn.Parameter) -> None:
        """overlap: this gradient is final for the step; send it while backward goes on."""
        if self.sync:
            parameter.grad.div_(self.world_size)
            self.pending.append((dist.all_reduce(parameter.grad, async_op=True), parameter))

    def _fill_bucket(self, parameter: nn.Parameter) -> None:
        """bucketed: copy the gradient into its bucket; the bucket's all-reduce starts when it is full."""
        if not self.sync:
            return
        bucket = self.bucket_of[id(parameter)]
        if bucket.add(parameter):
            self._launch_bucket(bucket)

    def _launch_bucket(self, bucket: Bucket) -> None:
        bucket.flat.div_(self.world_size)
        bucket.work = dist.all_reduce(bucket.flat, async_op=True)

    # ---------------------------------------------------------------- after backward

    def finish_gradient_synchronization(self) -> None:
        """Call after the last backward of a step, before clipping and optimizer.step: gradients become the mean."""
        start = time.perf_counter()
        if self.variant == "allreduce":
            for parameter in self.trained:
                if parameter.grad is not None:
                    parameter.grad.div_(self.world_size)
                    dist.all_reduce(parameter.grad)
        elif self.variant == "overlap":
            for work, _ in self.pending:
                work.wait()
            self.pending = []
        else:
            self._finish_buckets()
        self.wait_seconds += time.perf_counter() - start

    def _finish_buckets(self) -> None:
        """Send the buckets some of whose parameters got no gradient (zeros in their place), wait, copy back."""
        for bucket in self.buckets:
            if bucket.work is None and bucket.ready:
                for position in set(range(len(bucket.parameters))) - bucket.ready:
                    bucket.slice(position).zero_()
                self._launch_bucket(bucket)
        for bucket in self.buckets:
            if bucket.work is not None:
                bucket.work.wait()
                for position in bucket.ready:
                    bucket.parameters[position].grad.copy_(bucket.slice(position))
            bucket.reset()

    def remove_hooks(self) -> None:
        """Detach from the module's parameters (the plain module then trains alone again)."""
        for handle in self.handles:
            handle.remove()
        self.handles = []
