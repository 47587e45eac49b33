"""The driver's door to chaos: :func:`build_chaos`.

::

    chaos = build_chaos(config, run_dir)
    overrides = chaos.prepare()          # before launch: write garbage data, install tools
    config = load_run_config(conf, user_overrides + overrides)
    observers.append(chaos.injector(on_inject=lambda injection: ...))
    RayWorkerGroup(..., wrap_reporter=chaos.step_gate())   # each sub-run: the pauses still to come
    DevicePollGroup(..., path=chaos.device_path())   # when chaos.tools_dir is set

``prepare`` is idempotent: a relaunched driver gets the same overrides (the
garbage copy is reused, so the config hash and the checkpoints still match)
and undoes a storage fault that a killed driver left in place.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Optional

from runmgr.chaos import storage
from runmgr.chaos.actions import FaultEffects
from runmgr.chaos.devicetool import DeviceTools
from runmgr.chaos.garbage import SampleWindow, write_garbage_copy
from runmgr.chaos.injector import ChaosInjector, DataWindow, LrBlowup, OnInject, Schedule
from runmgr.chaos.pause import PAUSE_SAFETY_S, StepGate, StepPause
from runmgr.chaos.state import ChaosState
from runmgr.config.chaos import (
    DATA_KINDS, DEVICE_ECC, GARBAGE_DATA, LR_BLOWUP, RANK_KINDS, RUNTIME_KINDS, ChaosConfig, FaultSpec,
)
from runmgr.config.schema import RunConfig

CHAOS_DIR = "chaos"
"""Under the run directory: the garbage data copy, the tools directory, the pauses' release files."""


def release_file(run_dir: Path, label: str) -> Path:
    """The file whose existence releases the pause ``label`` (``0:pause_at_step@20``)."""
    name = label.replace(":", "-").replace("@", "-after-step-")
    return Path(run_dir).resolve() / CHAOS_DIR / f"release-{name}"


def fault_windows(label: str, fault: FaultSpec, global_batch_size: int) -> list[DataWindow]:
    """The garbage windows of one data fault (several for recurring_instability)."""
    count = 1 if fault.kind == GARBAGE_DATA else fault.repeats
    return [DataWindow(f"{label}/window{n}" if count > 1 else label, fault.kind,
                       SampleWindow.of_steps(fault.at_step + n * fault.every_steps, fault.steps, global_batch_size))
            for n in range(count)]


def lr_blowup_overrides(fault: FaultSpec, lr: float) -> list[str]:
    """The config a user would have written: the peak LR ``factor`` x too high,
    reached by a linear warmup at ``at_step`` and then held."""
    return [f"optim.lr={lr * fault.factor:.6g}", f"optim.lr_warmup_iters={fault.at_step}",
            "optim.lr_warmup_fraction=null", "optim.lr_decay_style=constant"]


class Chaos:
    """The chaos of one run: what to change before launch, and the injector."""

    def __init__(self, config: RunConfig, run_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.schedule_config: ChaosConfig = config.chaos
        self.run_dir = Path(run_dir)
        self.clock = clock
        has_device_fault = any(f.kind == DEVICE_ECC for f in self.schedule_config.faults)
        self.tools_dir: Optional[Path] = (self.run_dir / CHAOS_DIR / "tools").resolve() if has_device_fault else None
        """Put first on the PATH of the device poll (see :meth:`device_path`); None without device faults."""
        self._state: Optional[ChaosState] = None

    @property
    def state(self) -> ChaosState:
        """The lineage's chaos state, one instance shared by prepare() and the injector."""
        if self._state is None:
            self._state = ChaosState(self.run_dir)
        return self._state

    @property
    def enabled(self) -> bool:
        return self.schedule_config.enabled

    def device_path(self, base: Optional[str] = None) -> Optional[str]:
        """The PATH for the device poll's tool calls: the tools directory first; None without one."""
        if self.tools_dir is None:
            return None
        return os.pathsep.join([str(self.tools_dir), base if base is not None else os.environ.get("PATH", "")])

    def prepare(self) -> list[str]:
        """Write the faulty inputs (once per lineage) and return the config overrides
        that point the run at them (``data.data_path=...``, the LR mistake)."""
        if not self.enabled:
            return []
        self._undo_stale_mounts(self.state)
        if self._pauses():
            (self.run_dir / CHAOS_DIR).mkdir(parents=True, exist_ok=True)  # where a release file goes
        if self.tools_dir is not None:
            DeviceTools(self.tools_dir).install()
        overrides = []
        if self._windows():
            overrides.append(f"data.data_path={self._garbage_copy()}")
        for _, fault in self.schedule_config.of_kinds((LR_BLOWUP,)):
            overrides += lr_blowup_overrides(fault, self.state.remember_intended_lr(self.config.optim.lr))
        return overrides

    def _garbage_copy(self) -> Path:
        data_dir = (self.run_dir / CHAOS_DIR / "data").resolve()
        current = self.config.data.data_path
        if current is not None and Path(current).resolve().parent == data_dir:
            return Path(current).resolve()  # the config already points at this lineage's copy
        t, m = self.config.training, self.config.model
        return write_garbage_copy(self.config.data, m.seq_length, t.seed, m.vocab_size,
                                  [w.window for w in self._windows()], self.schedule_config.seed, data_dir)

    def injector(self, on_inject: OnInject) -> ChaosInjector:
        """The observer to add to the controller; ``on_inject`` gets every injection."""
        tools = DeviceTools(self.tools_dir) if self.tools_dir is not None else None
        effects = FaultEffects(str(self.config.checkpoint_dir().resolve()), tools)
        return ChaosInjector(self.schedule(), effects, self.state, on_inject, self.clock)

    def schedule(self) -> Schedule:
        faults = self.schedule_config
        runtime = tuple((f.label(i), f) for i, f in faults.of_kinds(RUNTIME_KINDS))
        intended = self.state.intended_lr or self.config.optim.lr
        blowups = [LrBlowup(f.label(i), intended, intended * f.factor, f.at_step)
                   for i, f in faults.of_kinds((LR_BLOWUP,))]
        return Schedule(runtime, tuple(self._windows()), blowups[0] if blowups else None,
                        self.config.training.global_batch_size, self._pauses())

    def step_gate(self) -> Optional[StepGate]:
        """What the next sub-run's ranks must carry out themselves: the pauses that have not
        fired yet in this lineage (ask again for every sub-run); None when there are none."""
        pauses = tuple(pause for pause in self._pauses() if not self.state.has_fired(pause.label))
        return StepGate(pauses) if pauses else None

    def _pauses(self) -> tuple[StepPause, ...]:
        return tuple(StepPause.of_kind(f.kind, f.label(i), f.at_step, str(release_file(self.run_dir, f.label(i))),
                                       f.duration_s or PAUSE_SAFETY_S, f.at_subrun)
                     for i, f in self.schedule_config.of_kinds(RANK_KINDS))

    def _windows(self) -> list[DataWindow]:
        per_step = self.config.training.global_batch_size
        return [w for i, f in self.schedule_config.of_kinds(DATA_KINDS) for w in fault_windows(f.label(i), f, per_step)]

    def _undo_stale_mounts(self, state: ChaosState) -> None:
        # A driver killed during a checkpoint_fail leaves its read-only mount behind.
        for path in list(state.mounts):
            storage.undo_read_only(path)
            state.remove_mount(path)


def build_chaos(config: RunConfig, run_dir: Optional[Path] = None) -> Chaos:
    """The chaos of ``config`` (an empty schedule when ``chaos=none``)."""
    return Chaos(config, Path(run_dir) if run_dir is not None else config.run_dir())
