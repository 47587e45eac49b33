"""A busy run's logbook, written with the real Logbook API the way the driver writes it:
3,000 steps in five sub-runs, twenty incidents of nine kinds, several at the same
steps (a loss spike and a grad spike together, as the issue's picture had them),
two rollbacks, a worker death, a device fault that shrinks data parallel (fewer
tokens per step from then on), and minutes of downtime between sub-runs.

``runmgr logbook plot``'s tests draw it, and so does a person checking the PNG:
``.venv/bin/python -m tests.logbook.busy_run /tmp/busy && runmgr logbook plot /tmp/busy``.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

from logbook import Logbook

T0 = 1_750_000_000.0
FULL_BATCH = 1 << 20
"""Tokens per step at data parallel 8 (256 sequences of 4,096)."""
SHRUNK_BATCH = 3 << 18
"""Tokens per step once the device fault took a replica out (DP 6)."""
STEP_S = {FULL_BATCH: 1.2, SHRUNK_BATCH: 0.95}


@dataclass
class Clock:
    """The logbook's clock, moved by hand."""

    now: float = T0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class SubRunScript:
    """One sub-run: where it starts and stops, its batch, the downtime before it, its incidents
    (kind, step or None, summary) and the decision that ends it."""

    id: str
    start: int
    last: int
    batch: int
    downtime_s: float
    incidents: tuple[tuple[str, int | None, str], ...]
    decision: str | None


SCRIPT = (
    SubRunScript("12.00", 0, 640, FULL_BATCH, 0.0, (
        ("straggler", 212, "rank 5 is 31% slower than the median for 50 steps"),
        ("loss_spike", 600, "loss 6.9 at step 600 is 2.1x the running median"),
        ("grad_spike", 600, "grad norm 41 at step 600 is 38x the running median"),
        ("loss_spike", 604, "loss 7.3 at step 604 is 2.3x the running median"),
        ("grad_spike", 604, "grad norm 55 at step 604 is 51x the running median")), "rollback_skip"),
    SubRunScript("12.01", 500, 1210, FULL_BATCH, 240.0, (
        ("straggler", 900, "rank 2 is 27% slower than the median"),
        ("straggler", 905, "rank 2 is 29% slower than the median"),
        ("straggler", 910, "rank 2 is 33% slower than the median"),
        ("slowdown", 1000, "tokens/s fell 18% below the run's median for 40 steps"),
        ("worker_death", None, "rank 3 died: process killed (exit code -9)")), "restart"),
    SubRunScript("12.02", 1200, 1850, FULL_BATCH, 180.0, (
        ("hang", 1500, "no step for 600 s; every rank in NCCL all-reduce"),
        ("device_fault", 1850, "node-c GPU 2: 2 uncorrectable ECC errors")), "exclude_node"),
    SubRunScript("12.03", 1800, 2410, SHRUNK_BATCH, 420.0, (
        ("loss_spike", 2400, "loss 8.1 at step 2400 is 2.8x the running median"),
        ("grad_spike", 2401, "grad norm 90 at step 2401 is 70x the running median"),
        ("nonfinite", 2402, "loss is NaN at step 2402 on every rank")), "rollback_skip_lower_lr"),
    SubRunScript("12.04", 2300, 3000, SHRUNK_BATCH, 300.0, (
        ("storage_outage", 2700, "checkpoint save to /ckpt failed: No space left on device"),
        ("slowdown", 2710, "tokens/s fell 22% below the run's median"),
        ("straggler", 2950, "rank 0 is 25% slower than the median")), None),
)


def loss_at(step: int, subrun: SubRunScript) -> float:
    """A pretraining loss falling from 10 to about 2.6, with the spikes of the script; after a
    spike the loss stays 0.4 higher (why the policy rolled back)."""
    loss = 2.5 + 7.5 * math.exp(-step / 350.0) + 0.04 * math.sin(step * 1.7)
    spikes = [at for kind, at, _ in subrun.incidents if kind == "loss_spike" and at is not None]
    return loss + sum(4.5 * math.exp(-abs(step - at) / 3.0) + (0.4 if step > at else 0.0) for at in spikes)


def lr_at(step: int, scale: float) -> float:
    """Linear warm-up over 200 steps, then cosine decay to a tenth over 3,000."""
    if step <= 200:
        return 3e-4 * step / 200 * scale
    return scale * (3e-5 + 2.7e-4 * 0.5 * (1 + math.cos(math.pi * (step - 200) / 2800)))


def write_busy_run(run_dir: Path, loss_scaling: bool = False) -> Path:
    """The logbook of :data:`SCRIPT` in ``run_dir``: bf16 (loss scale 1 at every step), or with
    ``loss_scaling`` fp16's dynamic scale (2**16, halved at each spike, doubled every 500 steps)."""
    clock = Clock()
    config = {"run": {"name": "busy", "number": 12}, "training": {"train_iters": 3000}}
    plan: dict = {"skip_ranges": [], "lr_scale": 1.0}
    with Logbook.open(run_dir, clock=clock) as book:
        for script in SCRIPT:
            clock.now += script.downtime_s
            plan = {**plan, "subrun": script.id}
            book.start_subrun(script.id, "launch" if script.start == 0 else "resume", {}, None, script.start,
                              plan, config)
            _train(book, script, clock, plan["lr_scale"], loss_scaling)
            _incidents(book, script)
            if script.decision and script.decision.startswith("rollback_skip"):
                # The samples of the 10 steps around the first spike are skipped from then on.
                spike = next(at for kind, at, _ in script.incidents if kind == "loss_spike")
                per_step = script.batch // 4096
                plan = {**plan, "skip_ranges": [*plan["skip_ranges"], [(spike - 5) * per_step, (spike + 5) * per_step]]}
            if script.decision and script.decision.endswith("lower_lr"):
                plan = {**plan, "lr_scale": plan["lr_scale"] / 2}
            ending = "finished" if script.decision is None else "restarting"
            book.end_subrun(script.id, ending, script.last, script.decision or "trained to step 3000")
    return run_dir


def _train(book: Logbook, script: SubRunScript, clock: Clock, lr_scale: float, loss_scaling: bool) -> None:
    rows, spikes = [], {at for kind, at, _ in script.incidents if kind in ("loss_spike", "grad_spike")}
    scale = 2.0 ** 16
    for step in range(script.start + 1, script.last + 1):
        clock.now += STEP_S[script.batch]
        if loss_scaling:
            scale = scale / 2 if step in spikes else (scale * 2 if step % 500 == 0 else scale)
        grad = 0.4 + 0.2 * math.exp(-step / 300.0) + (40.0 if step in spikes else 0.0)
        rows.append({"step": step, "loss": loss_at(step, script), "grad_norm": grad, "lr": lr_at(step, lr_scale),
                     "loss_scale": scale if loss_scaling else 1.0, "tokens": script.batch,
                     "step_time": STEP_S[script.batch], "time": clock.now, "skipped": False,
                     "consumed_samples": step * script.batch // 4096})
    book.record_metrics(script.id, rows)


def _incidents(book: Logbook, script: SubRunScript) -> None:
    for kind, step, summary in script.incidents:
        incident = book.record_incident(script.id, kind, f"{kind}: {summary}", {"description": summary}, step=step)
        if script.decision is not None and (kind, step, summary) == script.incidents[-1]:
            book.record_decision(script.id, incident, script.decision, summary, {})


if __name__ == "__main__":
    print(write_busy_run(Path(sys.argv[1]), loss_scaling="--fp16" in sys.argv[2:]))
