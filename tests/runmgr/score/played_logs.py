"""Megatron-LM logs for the score's tests, written as a job writes them: a stamped iteration line
every 10 s (log interval 1), a save every 50 iterations, chosen spikes, silences and restarts."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

from tests.runmgr.shadow.megatron_lines import base_loss, iteration_line, saved_lines

START = 1.7e9
STEP_S = 10.0


@dataclass
class Log:
    """A log being written: its lines and the job's clock."""

    lines: list[str] = field(default_factory=list)
    now: float = START

    def train(self, iterations: range, lifted: range = range(0)) -> "Log":
        for iteration in iterations:
            self.now += STEP_S
            loss = base_loss(iteration) * (3.0 if iteration in lifted else 1.0)
            self.lines.append(iteration_line(iteration, loss, at=self.now, step_ms=STEP_S * 1000, total=1000))
            if iteration % 50 == 0:
                self.lines += saved_lines(iteration)
        return self

    def silent(self, seconds: float) -> "Log":
        self.now += seconds
        return self

    def restart_from(self, iteration: int) -> "Log":
        """The job's own launcher starts it again: Megatron's print_datetime, then the load."""
        stamp = _datetime(self.now)
        self.lines += [f"[after model, optimizer, and learning rate scheduler are built] datetime: {stamp} ",
                       f" loading checkpoint from /ckpt at iteration {iteration}",
                       f"  successfully loaded checkpoint from /ckpt [ t 1/1, p 1/1 ] at iteration {iteration}"]
        return self

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _datetime(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
