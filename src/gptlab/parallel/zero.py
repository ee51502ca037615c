"""Optimizer-state sharding, ZeRO stage 1 (Rajbhandari et al., 2020), by hand around any torch optimizer class.

AdamW keeps two moments per weight: for fp32 weights, twice the model's memory again on every rank. Here each
rank owns a subset of the parameters and keeps optimizer state for those only:

    gradients averaged over ranks (by data parallel, as before)
    each rank:   inner_optimizer.step()            over the parameters it owns (1/world of the state)
    each owner:  broadcast its parameters          so every rank holds the whole updated model again

Ownership is balanced by size: within each parameter group, largest first, each parameter goes to the rank
that owns the fewest elements so far (deterministic, so every rank computes the same split).

`ShardedOptimizer` is a `torch.optim.Optimizer` over every parameter, with the same `param_groups` as the
unsharded optimizer: a schedule that sets `group["lr"]` (the Trainer does, each step) sets it here, and it is
copied into the inner optimizer's matching group before each step.

Checkpoints: `state_dict()` gathers the full state (a collective: every rank must call it) in the format the
unsharded optimizer writes (parameters numbered across groups), so a sharded run's checkpoint resumes sharded,
unsharded or at another world size. `load_state_dict(full)` keeps this rank's share.

Not here: averaging gradients (gptlab.parallel.data_parallel), torch's own ZeroRedundancyOptimizer (wrap.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gptlab.runtime import GptlabError


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1: `optimizer_class(my parameters, **options)` on each rank, then every parameter broadcast from its owner."""

    def __init__(self, params, optimizer_class: type[torch.optim.Optimizer], **options) -> None:
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.owner: dict[int, int] = {}  # id(parameter) -> rank
        self.load = [0] * self.world_size  # elements owned per rank
        self.inner: torch.optim.Optimizer | None = None
        self.inner_groups: list[dict] = []
        super().__init__(params, options)  # calls add_param_group for each group
        self.inner = optimizer_class(self.inner_groups, **options)

    def add_param_group(self, param_group: dict) -> None:
        """Give the group's parameters owners; this rank's share becomes a group of the inner optimizer."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for parameter in sorted(group["params"], key=lambda p: -p.numel()):  # sorted() is stable: ties keep their order
            rank = min(range(self.world_size), key=lambda r: self.load[r])
            self.owner[id(parameter)] = rank
            self.load[rank] += parameter.numel()
        mine = {**group, "params": [p for p in group["params"] if self.owner[id(p)] == self.rank]}
        if self.inner is None:
            self.inner_groups.append(mine)
        else:
            self.inner.add_param_group(mine)

    def owned(self) -> list[torch.nn.Parameter]:
        """This rank's parameters."""
        return [p for group in self.param_groups for p in group["params"] if self.owner[id(p)] == self.rank]

    @torch.no_grad()
    def step(self, closure=None):
        """The inner step over this rank's parameters, then each parameter from its owner to every rank."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group, inner in zip(self.param_groups, self.inner.param_groups):
            inner.update({key: value for key, value in group.items() if key != "params"})  # lr set by the schedule
        self.inner.step()
        works = [dist.broadcast(p.data, src=self.owner[id(p)], async_op=True)
                 for group in self.param_groups for p in group["params"]]
        for work in works:
            work.wait()
        return loss

    def _numbering(self) -> dict[int, int]:
        """id(parameter) -> its index in the unsharded optimizer's state_dict (counted across groups)."""
        return {id(p): i for i, p in enumerate(p for group in self.param_groups for p in group["params"])}

    def state_dict(self) -> dict:
        """The full state, as the unsharded optimizer would save it: a collective (every rank must call it)."""
        numbering = self._numbering()
        inner_params = [p for group in self.inner.param_groups for p in group["params"]]
        local = self.inner.state_dict()
        mine = {numbering[id(inner_params[i])]: _to_cpu(state) for i, state in local["state"].items()}
        shares: list = [None] * self.world_size
        dist.all_gather_object(shares, mine)
        state = {index: value for share in shares for index, value in share.items()}
        groups = []
        for group, inner in zip(self.param_groups, local["param_groups"]):
            hyper = {key: value for key, value in inner.items() if key != "params"}
            groups.append({**hyper, "params": [numbering[id(p)] for p in group["params"]]})
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a full state (this class's or the unsharded optimizer's): keep this rank's parameters' share."""
        groups = state_dict["param_groups"]
        saved, ours = [len(g["params"]) for g in groups], [len(g["params"]) for g in self.param_groups]
        if saved != ours:
            raise GptlabError(f"the optimizer state has groups of {saved} parameters, this optimizer {ours}: another model's state")
        numbering = self._numbering()
        inner_state, inner_groups, index = {}, [], 0
        for saved, group in zip(groups, self.param_groups):
            hyper = {key: value for key, value in saved.items() if key != "params"}
            group.update(hyper)
            mine = []
            for parameter in group["params"]:
                if self.owner[id(parameter)] == self.rank:
                    if numbering[id(parameter)] in state_dict["state"]:
                        inner_state[index] = state_dict["state"][numbering[id(parameter)]]
                    mine.append(index)
                    index += 1
            inner_groups.append({**hyper, "params": mine})
        self.inner.load_state_dict({"state": inner_state, "param_groups": inner_groups})


def _to_cpu(value):
    """Tensors of a state moved to CPU (to gather them as objects), the rest as is."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    return value
