"""The lines Megatron-LM prints, from the built-in trainer's reports.

A :class:`MegatronLog` is the reporter of the Megatron dialect (``python -m
trainer --num-layers ...``): per log interval the iteration line of
``megatron/training/training.py`` (``training_log``), the straggler report of
``megatron/core/utils.py`` (``StragglerDetector.report``) with
``--log-straggler``, and the checkpoint lines of
``megatron/training/checkpointing.py``. A log reader written for Megatron-LM
reads them unchanged.

Megatron prints the iteration line on the last rank; the built-in trainer
reports steps on rank 0 only (its loss is the all-reduced one, the same on
every rank), so this reporter runs on rank 0 and prints every line there.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from datetime import datetime
from typing import Optional, TextIO

from trainer.report import CheckpointReport, Heartbeat, LocalNormsReport, StartReport, StepReport

RANKS_TAG = "[ t 1/1, p 1/1 ]"
"""Tensor and pipeline ranks of the saving/loading rank, as Megatron prints
them; the built-in runs neither tensor nor pipeline parallelism."""


def stamp(with_micros: bool = True) -> str:
    """Megatron's ``datetime.now()`` stamp, in brackets."""
    return f"[{datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f' if with_micros else '%Y-%m-%d %H:%M:%S')}]"


@dataclass(frozen=True)
class LogSettings:
    """What the lines need to know about the run."""

    train_iters: int
    log_interval: int
    global_batch_size: int
    save_interval: int
    save_dir: Optional[str]
    load_dir: Optional[str]
    log_straggler: bool
    forward_flops_per_sample: float
    """2 x parameters x sequence length: the forward FLOPs of one sample, for
    the straggler report's throughput estimate (Megatron's "Etpt" is a
    forward-only estimate too)."""


def iteration_line(interval: list[StepReport], settings: LogSettings) -> str:
    """Megatron's per-interval line (training_log) for the steps of ``interval``."""
    last = interval[-1]
    advanced = [r.loss for r in interval if not r.skipped]
    loss = sum(advanced) / len(advanced) if advanced else 0.0
    elapsed_ms = 1000.0 * sum(r.step_time for r in interval) / len(interval)
    line = f" {stamp()} iteration {last.step:8d}/{settings.train_iters:8d} |"
    line += f" consumed samples: {last.consumed_samples:12d} |"
    if last.skipped_samples > 0:
        line += f" skipped samples: {last.skipped_samples:12d} |"
    line += f" elapsed time per iteration (ms): {elapsed_ms:.1f} |"
    line += f" learning rate: {last.lr:.6E} |"
    line += f" global batch size: {settings.global_batch_size:5d} |"
    if loss >= 0.0:  # as Megatron: a nan average prints no loss
        line += f" lm loss: {loss:.6E} |"
    line += f" loss scale: {last.loss_scale:.1f} |"
    line += f" grad norm: {last.grad_norm:.3f} |"
    line += f" number of skipped iterations: {sum(r.skipped for r in interval):3d} |"
    line += f" number of nan iterations: {sum(not math.isfinite(r.loss) for r in interval):3d} |"
    return line


def straggler_line(interval: list[StepReport], settings: LogSettings) -> str:
    """Megatron's straggler report: per rank, the mean forward+backward time per
    iteration (Rtt, ms) and the forward throughput it implies (Etpt, TFLOP/s),
    min and max with their ranks. The device fields Megatron reads from NVML
    (power, temperature, utilisation, clock) and the get_batch time are not
    measured by the built-in, so they are left out rather than made up."""
    ranks = len(interval[-1].compute_times)
    per_rank_ms = [1000.0 * sum(r.compute_times[rank] for r in interval) / len(interval) for rank in range(ranks)]
    samples_per_rank = settings.global_batch_size / ranks
    tflops = [settings.forward_flops_per_sample * samples_per_rank / (ms / 1000.0) / 1e12 if ms > 0 else 0.0
              for ms in per_rank_ms]
    fastest, slowest = _argmin(per_rank_ms), _argmax(per_rank_ms)
    low, high = _argmin(tflops), _argmax(tflops)
    return (f"{stamp(with_micros=False)} | MnRtt/Rnk: {per_rank_ms[fastest]:.2f}ms/{fastest} | "
            f"MxRtt/Rnk: {per_rank_ms[slowest]:.2f}ms/{slowest} | "
            f"MnEtpt/Rnk: {tflops[low]:.2f}TF/{low} | MxEtpt/Rnk: {tflops[high]:.2f}TF/{high}")


def _argmin(values: list[float]) -> int:
    return min(range(len(values)), key=values.__getitem__)


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


class MegatronLog:
    """Reporter printing Megatron's lines (rank 0). The trainer must report
    every step (training.log_interval 1): this reporter groups them into
    ``settings.log_interval`` intervals, as Megatron averages over them."""

    def __init__(self, settings: LogSettings, out: Optional[TextIO] = None) -> None:
        self.settings, self.out = settings, out or sys.stdout
        self._interval: list[StepReport] = []
        self._start_step = 0
        self._announced: set[int] = set()

    def _print(self, line: str) -> None:
        self.out.write(line + "\n")
        self.out.flush()

    def started(self, report: StartReport) -> None:
        self._start_step = report.start_step
        if report.resumed_from is not None:
            self._print(f"  successfully loaded checkpoint from {self.settings.load_dir} {RANKS_TAG} "
                        f"at iteration {report.start_step}")

    def step(self, report: StepReport) -> None:
        self._interval.append(report)
        if report.step % self.settings.log_interval and report.step != self.settings.train_iters:
            return
        self._print(iteration_line(self._interval, self.settings))
        if self.settings.log_straggler:
            self._print(straggler_line(self._interval, self.settings))
        self._interval = []

    def checkpoint(self, report: CheckpointReport) -> None:
        self._print(f"  successfully saved checkpoint from iteration {report.step:7d} to {self.settings.save_dir} "
                    f"{RANKS_TAG}")

    def local_norms(self, report: LocalNormsReport) -> None:
        """Megatron prints no per-weight norms: its log has no line for them (docs/local_norms.md)."""

    def heartbeat(self, beat: Heartbeat) -> None:
        # The trainer beats "checkpoint" before it starts a save (and before it commits one): announce
        # each save once, at the first beat of a step the loop saves at.
        if beat.phase != "checkpoint" or beat.step <= self._start_step or beat.step in self._announced:
            return
        if beat.step % self.settings.save_interval and beat.step != self.settings.train_iters:
            return
        self._announced.add(beat.step)
        self._print(f"saving checkpoint at iteration {beat.step:7d} to {self.settings.save_dir} "
                    f"in torch_dist format")
