"""This rank's share of the model and optimizer under a :class:`Layout`, and
the collectives of one step: forward/backward (through the pipeline schedule
when there are stages), the data-parallel gradient average, the global norm
and clipping, and each weight's gradient norm.

Plain data parallel keeps its original path exactly (one flat all-reduce on
the default group, the norm of the replicated gradients), so its runs stay
bit for bit what they were. The other layouts go through DeviceMesh groups.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import ContextManager, Optional, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from trainer.config import TrainerConfig
from trainer.device import Device
from trainer.distributed import average_gradients, broadcast_parameters
from trainer.host_state import load_local_parts
from trainer.local_norms import local_norms
from trainer.model import build_model
from trainer.optim import build_optimizer, clip_gradients
from trainer.parallel.gradients import average_over, global_norm, holders, local_part, scale_, settle_placements
from trainer.parallel.layout import Coords, Layout, Sharding
from trainer.parallel.mesh import build_mesh


class Schedule(Protocol):
    """Runs one step's micro-batches through the pipeline stages."""

    def forward_backward(self, batches: list[torch.Tensor], loss_scale: float) -> Optional[float]:
        """Accumulate gradients of the scaled mean loss; the mean loss on the
        last stage, None on the others."""


@dataclass
class Engine:
    """What one rank trains with: its part of the model, its optimizer, and
    the groups it talks over."""

    layout: Layout
    rank: int
    device: Device
    model: nn.Module
    """This rank's share: a pipeline stage's layers, tensor-parallel or FSDP2 DTensors."""
    optimizer: torch.optim.Optimizer
    mesh: Optional[DeviceMesh] = None
    """None for plain data parallel (the default group serves)."""
    schedule: Optional[Schedule] = None
    """The pipeline schedule when there are stages."""

    @property
    def coords(self) -> Coords:
        return self.layout.coords(self.rank)

    @property
    def parameters(self) -> list[nn.Parameter]:
        return list(self.model.parameters())

    @property
    def holds_loss(self) -> bool:
        return self.layout.holds_loss(self.rank)

    @property
    def reports_loss(self) -> bool:
        """Whether this rank's loss counts in the reported one: the last stage's
        first tensor-parallel rank of each replica (the others compute the same loss)."""
        return self.holds_loss and self.coords.tp == 0

    def loss_context(self) -> ContextManager:
        """What the cross entropy and its backward run under (the vocabulary-parallel
        loss when the logits are sharded over tensor parallel)."""
        if self.layout.tp > 1:
            from trainer.parallel.tensor import loss_context
            return loss_context(self.layout.tp)
        return contextlib.nullcontext()

    def before_backward(self, last: bool) -> None:
        """Called before each micro-batch's backward (``last``: the step's
        last one): FSDP2 reduce-scatters the accumulated gradients once, in
        the last backward."""
        if self.layout.sharding == Sharding.fsdp2:
            from trainer.parallel.fsdp import set_gradient_sync
            set_gradient_sync(self.model, last)

    def reduce_gradients(self) -> None:
        """Average the gradients over data parallel."""
        if self.layout.tp > 1:
            settle_placements(self.parameters)
        if self.layout.plain:
            average_gradients(self.parameters, self.layout.world_size)
        elif self.layout.sharding == Sharding.fsdp2:
            return  # fully_shard reduce-scatters (and averages) them in backward
        elif self.layout.dp > 1:
            assert self.mesh is not None
            average_over(self.parameters, self.mesh["dp"].get_group(), self.layout.dp)

    def clip_gradients(self, max_norm: float) -> float:
        """Clip by the whole model's gradient norm when ``max_norm`` > 0;
        returns that norm (inf/nan after an overflow: nothing is changed)."""
        if self.layout.plain:
            return clip_gradients(self.parameters, max_norm)
        params = self.parameters
        norm = global_norm(params, self.layout.dp * self.layout.tp, self.device.torch_device)
        if max_norm > 0 and math.isfinite(norm) and norm > max_norm:
            scale_(params, max_norm / (norm + 1e-6))
        return norm

    def load_local_state(self, model_state: dict, optimizer_state: dict) -> None:
        """Put back this rank's model and optimizer state as a snapshot kept them: the local
        parts of the model's tensors and an optimizer ``state_dict`` of local parts
        (trainer/host_state.py), taken under the same layout."""
        load_local_parts(self.model.state_dict(), model_state)
        self.optimizer.load_state_dict(_placed_like_parameters(self.optimizer, optimizer_state))

    def local_norms(self) -> dict[str, float]:
        """Every weight's gradient norm over the whole model, on every rank (a
        collective on non-plain layouts: every rank must call it)."""
        if self.layout.plain:
            return local_norms(self.model.named_parameters())
        ranks_per_stage = self.layout.dp * self.layout.tp
        mine = {}
        for name, param in self.model.named_parameters():
            if param.grad is not None:
                part = local_part(param.grad).detach().double()
                mine[name] = float(part.pow(2).sum()) / holders(param, ranks_per_stage)
        gathered: list[Optional[dict]] = [None] * self.layout.world_size
        dist.all_gather_object(gathered, mine)
        squares: dict[str, float] = {}
        for part in gathered:
            for name, value in (part or {}).items():
                squares[name] = squares.get(name, 0.0) + value
        return {name: math.sqrt(value) for name, value in sorted(squares.items(), key=_model_order)}


def _placed_like_parameters(optimizer: torch.optim.Optimizer, saved: dict) -> dict:
    """``saved`` (an optimizer state_dict of local parts) with each parameter's state tensors
    placed as the parameter is (a DTensor's moments are DTensors of the same placements); the
    step counters stay plain, as the optimizer keeps them."""
    params = [param for group in optimizer.param_groups for param in group["params"]]
    state = {}
    for index, entry in saved["state"].items():
        param = params[int(index)]
        state[index] = {key: value if key == "step" else _placed_like(value, param) for key, value in entry.items()}
    return {"state": state, "param_groups": saved["param_groups"]}


def _placed_like(value: object, param: torch.Tensor) -> object:
    if not isinstance(param, DTensor) or not isinstance(value, torch.Tensor):
        return value
    local = value.to(param.to_local().device)
    return DTensor.from_local(local, param.device_mesh, param.placements, run_check=False, shape=param.shape,
                              stride=param.stride())


def _model_order(item: tuple[str, float]) -> tuple:
    """Names in model order: embedding, blocks by number, then the head."""
    name = item[0]
    parts = name.split(".")
    if parts[0] == "blocks":
        return (1, int(parts[1]), name)
    return (0 if parts[0] in ("embedding", "positions") else 2, 0, name)


def build_engine(config: TrainerConfig, layout: Layout, rank: int, device: Device,
                 embedding_dtype: torch.dtype) -> Engine:
    """Build this rank's share of a freshly initialised model (seed torch's
    RNG first: every rank builds the whole model from the same seed, then
    keeps its part, so each layout starts from the same weights) and its
    optimizer."""
    mesh = build_mesh(layout, device.torch_device.type)
    model = build_model(config.model, embedding_dtype)
    coords = layout.coords(rank)
    if layout.pp > 1:
        from trainer.parallel.pipeline import keep_stage
        keep_stage(model, layout.pp, coords.pp)
    model = model.to(device.torch_device)
    if layout.plain:
        broadcast_parameters(list(model.parameters()), layout.world_size)
    if layout.tp > 1:
        from trainer.parallel.tensor import apply_tensor_parallel
        apply_tensor_parallel(model, mesh["tp"], config)
    if layout.sharding == Sharding.fsdp2:
        from trainer.parallel.fsdp import apply_fsdp2
        apply_fsdp2(model, mesh["dp"], config)
    if layout.sharding == Sharding.zero1:
        from trainer.parallel.zero import build_zero1_optimizer
        optimizer = build_zero1_optimizer(model, config.optim, mesh["dp"])
    else:
        optimizer = build_optimizer(model, config.optim)
    schedule = None
    if layout.pp > 1:
        from trainer.parallel.pipeline import build_schedule
        schedule = build_schedule(model, config, layout, rank, mesh, device)
    return Engine(layout, rank, device, model, optimizer, mesh, schedule)


def plain_engine(model: nn.Module, optimizer: torch.optim.Optimizer, device: Device, rank: int = 0,
                 world_size: int = 1) -> Engine:
    """The plain data-parallel engine around an already built model and optimizer."""
    return Engine(Layout(dp=world_size), rank, device, model, optimizer)
