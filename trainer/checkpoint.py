"""Sharded checkpoints with torch.distributed.checkpoint (DCP).

Every rank writes its part of ``<save dir>/step_00000120/``; rank 0 writes
``manifest.json`` last, once DCP's own finish step proves all parts are on
disk (the commit), then prunes old checkpoints when ``keep_last`` asks it to
(the trainer alone; under runmgr the driver decides what is kept, after its
logbook recorded a newer checkpoint, and hands the trainer ``keep_last=0``).
With ``async_save`` the write runs in a
background thread on a process group of its own (on the default group it
deadlocks against the training collectives: ENVIRONMENT.md); DCP copies the
state before ``async_save`` returns, so training may change the weights
while the files are written and the checkpoint still holds the saved step.

The functions that need no process group (listing, verifying, finding the
latest) live in :mod:`trainer.manifest` and are re-exported here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Protocol, runtime_checkable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from trainer.config import CheckpointConfig, ModelConfig, TrainerConfig
from trainer.errors import BadCheckpointError, CheckpointError
from trainer.manifest import (  # noqa: F401  (re-exported API)
    PARAMETERS_FIELD,
    LatestCheckpoint,
    checkpoint_dir,
    find_latest_verified,
    list_checkpoints,
    prune_checkpoints,
    read_manifest,
    retire_checkpoints_after,
    shape_mismatch,
    step_of,
    verify_checkpoint,
    write_manifest,
)
from trainer.model import build_model
from trainer.precision import LossScaler
from trainer.safe_load import SafeFileSystemReader, SafeLoadPlanner

# Fields that may change between sub-runs without changing what is trained. The whole
# ``parallel`` section is how the ranks split the work (tensor, pipeline, data parallel,
# sharding, timeouts): DCP reshards a checkpoint between layouts by global shapes, so a
# user may change it between sub-runs (the logbook records the change).
_VOLATILE_FIELDS = {"checkpoint": None, "device": None, "training": ("train_iters", "log_interval"),
                    "parallel": None}


def config_hash(config: TrainerConfig) -> str:
    """sha256 of the config minus checkpoint placement and volatile fields
    (length of the run, logging, the parallel layout and timeouts, device kind)."""
    data = dataclasses.asdict(config)
    for section, keys in _VOLATILE_FIELDS.items():
        if keys is None:
            data.pop(section, None)
        else:
            for key in keys:
                data[section].pop(key, None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def tensor_shapes(model_state: dict) -> dict[str, list[int]]:
    """``{name: shape}`` of a model state dict, as the manifest records it."""
    return {name: list(tensor.shape) for name, tensor in model_state.items()}


def config_shapes(cfg: ModelConfig) -> dict[str, list[int]]:
    """The tensor shapes of the model ``cfg`` builds, from a model on the meta
    device: no memory, so the driver can check a 175B config before a resume."""
    with torch.device("meta"):
        return tensor_shapes(get_model_state_dict(build_model(cfg)))


def check_shapes(path: Path, cfg: ModelConfig) -> None:
    """Raise :class:`CheckpointError` when the checkpoint at ``path`` holds a
    model of other shapes than ``cfg`` builds (a changed ``model.*`` size);
    a checkpoint that records no shapes passes (nothing to compare)."""
    _refuse_other_shapes(path, config_shapes(cfg))


def _refuse_other_shapes(path: Path, expected: dict[str, list[int]]) -> None:
    problem = shape_mismatch(read_manifest(path), expected)
    if problem:
        raise CheckpointError(f"cannot resume from {path}: {problem}; set the model as it was, "
                              "or start a new run in another run.dir")


@dataclass(frozen=True)
class LoadedCheckpoint:
    """Where a run resumes."""

    path: Path
    step: int
    consumed_samples: int
    manifest: dict


@dataclass(frozen=True)
class SavedCheckpoint:
    """A checkpoint whose manifest is on disk (rank 0 only)."""

    step: int
    path: Path
    seconds: float
    """From the save request to the manifest on disk."""


@runtime_checkable
class OwnsOptimizerState(Protocol):
    """An optimizer whose parameters are not the model's own (ZeRO-1 steps
    sharded rows of them), so ``get_state_dict`` cannot name its state: it
    lays its state out itself, as ``get_state_dict`` does for a replicated
    optimizer (by parameter name), so its checkpoints load across layouts."""

    def checkpoint_state(self) -> dict:
        """``{"state": {name: {...}}, "param_groups": [...]}``, holding the
        live tensors: DCP saves them, or loads into them in place."""

    def load_checkpoint_state(self, loaded: dict) -> None:
        """Finish a load once DCP filled :meth:`checkpoint_state`'s tensors."""


def _training_state(model: nn.Module, optimizer: Optional[torch.optim.Optimizer], scaler: LossScaler,
                    step: int, consumed_samples: int) -> dict:
    """The dict DCP saves or loads in place; without ``optimizer`` only the
    model and the counters (an Adam reset drops the moments)."""
    trainer_state = {
        "step": torch.tensor(step, dtype=torch.int64),
        "consumed_samples": torch.tensor(consumed_samples, dtype=torch.int64),
        "scaler": scaler.state_dict(),
    }
    if optimizer is None:
        return {"model": get_model_state_dict(model), "trainer": trainer_state}
    if isinstance(optimizer, OwnsOptimizerState):
        model_state, optim_state = get_model_state_dict(model), optimizer.checkpoint_state()
    else:
        model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state, "trainer": trainer_state}


def _verify_on_every_rank(path: Path, group: Optional[dist.ProcessGroup]) -> None:
    """Each rank checks its own view of the files; all raise if any fails,
    so no rank is left waiting in a load collective."""
    ok, reason = verify_checkpoint(path)
    reasons: list[Optional[str]] = [None] * dist.get_world_size(group)
    dist.all_gather_object(reasons, None if ok else reason, group=group)
    failures = [(rank, text) for rank, text in enumerate(reasons) if text is not None]
    if failures:
        rank, text = failures[0]
        raise BadCheckpointError(path, step_of(path), f"{text} (seen by rank {rank})")


def _read_into(state: dict, path: Path, group: Optional[dist.ProcessGroup]) -> None:
    """DCP's load of ``path`` into ``state``, reading its pickles as data only
    (:mod:`trainer.safe_load`); what DCP finds wrong names the checkpoint."""
    try:
        dcp.load(state, storage_reader=SafeFileSystemReader(path), planner=SafeLoadPlanner(), process_group=group)
    except CheckpointException as error:  # every rank's failure, gathered by DCP
        raise BadCheckpointError(path, step_of(path),
                                 f"torch.distributed.checkpoint cannot load it: {_first_failure(error)}") from None


def _first_failure(error: CheckpointException) -> str:
    if not error.failures:
        return str(error).splitlines()[0]
    rank = min(error.failures)
    exception, _trace = error.failures[rank]
    return f"{type(exception).__name__}: {exception} (rank {rank})"


def _refuse_inconsistent(path: Path, manifest: dict, trainer_state: dict) -> None:
    """The counters the data hold must be the manifest's: a checkpoint whose files
    are another step's (or another run's) verifies, but is not what it says."""
    for name in ("step", "consumed_samples"):
        saved, listed = int(trainer_state[name]), manifest.get(name)
        if listed is not None and saved != listed:
            raise BadCheckpointError(path, manifest["step"],
                                     f"its data hold {name} {saved}, its manifest says {listed}")


def _group_params(optim_state: Optional[dict]) -> Optional[list[list[str]]]:
    """The weight names each of this rank's param groups lists."""
    if optim_state is None:
        return None
    return [list(group["params"]) for group in optim_state["param_groups"]]


def _keep_group_params(optim_state: Optional[dict], own: Optional[list[list[str]]]) -> None:
    """Put this rank's own names back into the loaded param groups. DCP saves
    ``param_groups`` as one item, written by one rank: under pipeline parallel
    it lists that rank's stage's weights, and another stage would load groups
    naming weights it does not hold (the groups' settings are the same on
    every stage: decay and no decay)."""
    if optim_state is None or own is None:
        return
    for group, names in zip(optim_state["param_groups"], own):
        group["params"] = names


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scaler: LossScaler,
                    load_optimizer: bool, group: Optional[dist.ProcessGroup],
                    shapes: Optional[dict[str, list[int]]] = None) -> LoadedCheckpoint:
    """Verify then load ``path`` into the model (and optimizer and scaler).
    Raises :class:`BadCheckpointError` when it does not verify or its data
    disagree with its manifest, :class:`CheckpointError` when it holds a model
    of other shapes than ``shapes`` (the whole model's, :func:`config_shapes`;
    default: ``model``'s own, right when every rank holds every name). DCP
    loads by name, so a rank holding one pipeline stage reads its layers only."""
    path = Path(path)
    _verify_on_every_rank(path, group)
    state = _training_state(model, optimizer if load_optimizer else None, scaler, 0, 0)
    # The same on every rank: all raise.
    _refuse_other_shapes(path, shapes if shapes is not None else tensor_shapes(state["model"]))
    manifest = read_manifest(path)
    # The counters first: DCP loads in place, and a checkpoint unlike its manifest must change nothing.
    counters = {"trainer": state.pop("trainer")}
    _read_into(counters, path, group)
    _refuse_inconsistent(path, manifest, counters["trainer"])
    own_groups = _group_params(state.get("optim"))
    _read_into(state, path, group)
    _keep_group_params(state.get("optim"), own_groups)
    if load_optimizer and isinstance(optimizer, OwnsOptimizerState):
        set_model_state_dict(model, state["model"])
        optimizer.load_checkpoint_state(state["optim"])
    elif load_optimizer:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    else:
        set_model_state_dict(model, state["model"])
    scaler.load_state_dict(counters["trainer"]["scaler"])
    return LoadedCheckpoint(path, manifest["step"], int(counters["trainer"]["consumed_samples"]), manifest)


@dataclass
class _PendingSave:
    step: int
    path: Path
    future: Optional[Future]
    fields: dict
    started: float


class Checkpointer:
    """Writes one run's checkpoints; at most one save is in flight."""

    def __init__(self, save_dir: Path, cfg: CheckpointConfig, rank: int, group: dist.ProcessGroup,
                 protect: tuple[Path, ...] = (), clock: Callable[[], float] = time.time,
                 shapes: Optional[dict[str, list[int]]] = None) -> None:
        """``group``: a gloo group used by checkpoints only; ``protect``: the
        checkpoint this run resumed from, never pruned; ``shapes``: the whole
        model's ``{name: shape}`` the manifest records (:func:`config_shapes`;
        default: rank 0's state, which is the whole model unless rank 0 holds
        one pipeline stage)."""
        self.save_dir, self.cfg, self.rank, self.group = Path(save_dir), cfg, rank, group
        self.protect, self.clock, self.shapes = protect, clock, shapes
        self._pending: Optional[_PendingSave] = None

    @property
    def in_flight(self) -> bool:
        return self._pending is not None

    @property
    def written(self) -> bool:
        """A save is in flight and all its files are written on this rank: the
        next :meth:`wait` commits it without waiting."""
        pending = self._pending
        return pending is not None and (pending.future is None or pending.future.done())

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, scaler: LossScaler,
             consumed_samples: int, fields: dict) -> list[SavedCheckpoint]:
        """Checkpoint the current state as ``step``; ``fields`` go into the
        manifest. First waits for the previous save. Returns (rank 0) the
        checkpoints completed meanwhile: the previous one, and this one when
        the save is synchronous."""
        finished = [c for c in (self.wait(),) if c is not None]
        started = self.clock()
        path = checkpoint_dir(self.save_dir, step)
        if self.rank == 0:
            # A directory of the same step from an earlier attempt would mix old and new files.
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True)
        dist.barrier(group=self.group)
        state = _training_state(model, optimizer, scaler, step, consumed_samples)
        shapes = self.shapes if self.shapes is not None else tensor_shapes(state["model"])
        fields = {**fields, PARAMETERS_FIELD: shapes}
        if self.cfg.async_save:
            future = dcp.async_save(state, checkpoint_id=str(path), process_group=self.group)
            self._pending = _PendingSave(step, path, future, fields, started)
            return finished
        dcp.save(state, checkpoint_id=str(path), process_group=self.group)
        self._pending = _PendingSave(step, path, None, fields, started)
        return finished + [c for c in (self._finalize(),) if c is not None]

    def poll(self) -> Optional[SavedCheckpoint]:
        """Finalize the save in flight if its files are all written (cheap; call each step)."""
        return self._finalize() if self.written else None

    def wait(self) -> Optional[SavedCheckpoint]:
        """Block until the save in flight is written, then finalize it."""
        if self._pending is None:
            return None
        return self._finalize()

    def _finalize(self) -> Optional[SavedCheckpoint]:
        pending, self._pending = self._pending, None
        assert pending is not None
        if pending.future is not None:
            pending.future.result()  # re-raises a failed write on this rank
        if self.rank != 0:
            return None
        write_manifest(pending.path, {**pending.fields, "step": pending.step, "time": self.clock()})
        if self.cfg.keep_last > 0:  # 0: keep every one (under runmgr: the driver decides)
            prune_checkpoints(self.save_dir, self.cfg.keep_last, protect=self.protect)
        return SavedCheckpoint(pending.step, pending.path, self.clock() - pending.started)
