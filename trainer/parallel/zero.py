"""ZeRO-1, Megatron's distributed optimizer: weights and gradients stay
replicated over data parallel (the engine all-reduces the gradients), but
each data-parallel rank keeps the AdamW state of its own rows of every
weight, updates those rows, and the updated weights are all-gathered.

Each weight's rows are a DTensor ``Shard(0)`` over the data-parallel mesh
(the ``master``): a view of the replicated fp32 parameter, so the shard costs
no memory of its own. torch's AdamW steps these DTensors (its update is
elementwise, so a row is updated exactly as the replicated optimizer would),
and its state (``exp_avg``, ``exp_avg_sq``) is born sharded the same way.
Because the state is DTensors named by the model's parameter names, DCP saves
each rank's rows and reshards them on load by their global shapes: a
checkpoint written at DP 4 loads at DP 2, or into plain data parallel.

Why not ``torch.distributed.optim.ZeroRedundancyOptimizer``: it gives whole
parameters to ranks (uneven when a few matrices dominate) and its state dict
is a consolidated, rank-0, id-keyed dict that DCP cannot reshard.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from trainer.config import OptimConfig
from trainer.optim import adamw_settings, param_groups

_MOMENTS = ("exp_avg", "exp_avg_sq")


def shard_rows(tensor: torch.Tensor, mesh: DeviceMesh) -> DTensor:
    """This rank's rows of a replicated ``tensor`` as a ``Shard(0)`` DTensor
    over the 1-D ``mesh``: a view (writing it writes ``tensor``). Rows split
    as ``torch.chunk`` does, DTensor's own rule, so uneven rows agree with
    every other DTensor (the last ranks get fewer, maybe none)."""
    if tensor.ndim == 0:
        return DTensor.from_local(tensor, mesh, [Replicate()], run_check=False)
    chunks = tensor.chunk(mesh.size(), dim=0)
    rank = mesh.get_local_rank()
    local = chunks[rank] if rank < len(chunks) else tensor[tensor.shape[0]:]
    return DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=tensor.shape, stride=tensor.stride())


class Zero1AdamW(torch.optim.AdamW):
    """AdamW over this rank's rows of every weight (see the module's doc).
    Its ``param_groups`` and ``state`` are AdamW's own, over the shards, so
    :func:`trainer.optim.set_lr`, ``apply_hyperparameters`` and
    ``effective_settings`` work unchanged (the last one reads sharded moments:
    a collective). Implements :class:`trainer.checkpoint.OwnsOptimizerState`."""

    def __init__(self, model: nn.Module, cfg: OptimConfig, mesh: DeviceMesh) -> None:
        names = {param: name for name, param in model.named_parameters()}
        self.mesh = mesh
        self.replicas: list[tuple[str, nn.Parameter, DTensor]] = []
        """(name, replicated parameter, its master rows) in model order."""
        groups = []
        for group in param_groups(model, cfg.weight_decay, cfg.decay_1d_weights):
            masters = []
            for param in group["params"]:
                if param.dtype != torch.float32:
                    raise TypeError(f"ZeRO-1 needs fp32 parameters (the master weights); {names[param]} is {param.dtype}")
                master = nn.Parameter(shard_rows(param.detach(), mesh))
                self.replicas.append((names[param], param, master))
                masters.append(master)
            groups.append({**group, "params": masters})
        super().__init__(groups, **adamw_settings(cfg))

    @torch.no_grad()
    def step(self, closure=None) -> Optional[float]:  # type: ignore[override]
        """Update this rank's rows from the (averaged, clipped) replicated
        gradients, then all-gather every weight's rows into the replicas."""
        if closure is not None:
            raise ValueError("ZeRO-1's step takes no closure")
        for _name, param, master in self.replicas:
            master.grad = None if param.grad is None else shard_rows(param.grad, self.mesh)
        super().step()
        for _name, param, master in self.replicas:
            master.grad = None
            # This rank's rows are already in place (the master is a view); the others arrive.
            param.copy_(master.full_tensor())
        return None

    def checkpoint_state(self) -> dict:
        """The state as ``get_state_dict`` lays out a replicated AdamW's (by
        parameter name), holding this rank's sharded moments: DCP writes
        them, or loads into them in place. A fresh optimizer gets zero state
        first, something to load into."""
        state, groups = {}, []
        for name, _param, master in self.replicas:
            if not self.state[master]:
                self.state[master].update(_fresh_state(master))
            state[name] = self.state[master]
        by_master = {id(master): name for name, _param, master in self.replicas}
        for group in self.param_groups:
            groups.append({**{k: v for k, v in group.items() if k != "params"},
                           "params": [by_master[id(p)] for p in group["params"]]})
        return {"state": state, "param_groups": groups}

    def load_checkpoint_state(self, loaded: dict) -> None:
        """After DCP loaded into :meth:`checkpoint_state`'s tensors: the saved
        param-group settings (the loop then applies the config's on top)."""
        for group, saved in zip(self.param_groups, loaded["param_groups"]):
            group.update({k: v for k, v in saved.items() if k != "params"})


def _fresh_state(master: DTensor) -> dict:
    """What AdamW's first step creates (for-loop implementation)."""
    return {"step": torch.tensor(0.0, dtype=torch.get_default_dtype()),
            **{key: torch.zeros_like(master, memory_format=torch.preserve_format) for key in _MOMENTS}}


def build_zero1_optimizer(model: nn.Module, cfg: OptimConfig, dp_mesh: DeviceMesh) -> Zero1AdamW:
    """ZeRO-1 AdamW for ``model``'s replicated weights over ``dp_mesh``."""
    return Zero1AdamW(model, cfg, dp_mesh)
