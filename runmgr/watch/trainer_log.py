"""runmgr's own trainer's log as observations: what ``python -m trainer`` (torchrun, a user's
own launcher) prints on rank 0 (trainer/cli.py's PrintingReporter):

    start at step 40 from checkpoints/demo/step_00000040 | decay: betas (0.9, 0.95), ...
    step     41/200 | loss 4.7880 | lr 4.500e-04 | grad norm 3.847 | loss scale 1 | 63 ms | samples 656
    step     42/200 | loss nan | lr 4.500e-04 | grad norm nan | loss scale 32768 | 61 ms | samples 672 | SKIPPED (overflow)
    checkpoint step 50 -> checkpoints/demo/step_00000050 (0.05 s)

The same reader interface as runmgr/watch/megatron_log.py's (``parse(line, received_at)``,
``take_refused()``), so the shadow follower reads either: a step line is a
:class:`StepObservation`, a checkpoint line a :class:`CheckpointObservation`, a start from a
checkpoint a :class:`LoadedCheckpoint` (the job restarted). Without ``received_at`` a line's time
is the log's clock: the step times added up.
"""

from __future__ import annotations

import math
import re
from typing import Optional, Union

from runmgr.watch.observations import CheckpointObservation, LoadedCheckpoint, RefusedValue, StepObservation

_NUMBER = r"([-+0-9.eEinfa]+)"
_STEP = re.compile(rf"^step\s+(\d+)/(\d+) \| loss {_NUMBER} \| lr {_NUMBER} \| grad norm {_NUMBER} \| "
                   rf"loss scale {_NUMBER} \| (\d+) ms \| samples (\d+|None)(?P<skipped> \| SKIPPED)?")
_CHECKPOINT = re.compile(r"^checkpoint step (\d+) -> (.+) \([0-9.]+ s\)$")
_START = re.compile(r"^start at step (\d+) from (?!initialisation\b)(\S+) \|")

TrainerEvent = Union[StepObservation, CheckpointObservation, LoadedCheckpoint]


class TrainerLogReader:
    """Turns the built-in trainer's lines into observations, keeping the log's clock."""

    def __init__(self, subrun: Optional[str] = None) -> None:
        self._subrun = subrun or "00"
        self._clock = 0.0
        self._consumed_at: dict[int, Optional[int]] = {}

    def take_refused(self) -> list[RefusedValue]:
        """The trainer prints only what it computed: nothing to refuse."""
        return []

    def parse_all(self, line: str, received_at: Optional[float] = None) -> list[TrainerEvent]:
        """What the line holds, as the Megatron reader's ``parse_all`` gives it (one rank prints
        the trainer's lines: a line holds one message)."""
        event = self.parse(line, received_at)
        return [event] if event is not None else []

    def parse(self, line: str, received_at: Optional[float] = None) -> Optional[TrainerEvent]:
        text = line.strip()
        step = _STEP.match(text)
        if step:
            return self._step(step, received_at)
        now = received_at if received_at is not None else self._clock
        saved = _CHECKPOINT.match(text)
        if saved:
            at = int(saved.group(1))
            return CheckpointObservation(step=at, time=now, consumed_samples=self._consumed_at.get(at),
                                         subrun=self._subrun)
        started = _START.match(text)
        if started:
            return LoadedCheckpoint(step=int(started.group(1)), path=started.group(2), time=now, subrun=self._subrun)
        return None

    def _step(self, match: re.Match, received_at: Optional[float]) -> StepObservation:
        step_time = int(match.group(7)) / 1000.0
        self._clock += step_time
        consumed = None if match.group(8) == "None" else int(match.group(8))
        self._consumed_at[int(match.group(1))] = consumed
        loss, grad = _real(match.group(3)), _real(match.group(5))
        return StepObservation(
            step=int(match.group(1)), time=received_at if received_at is not None else self._clock,
            subrun=self._subrun, loss=loss, grad_norm=grad, lr=_real(match.group(4)),
            loss_scale=_real(match.group(6)), consumed_samples=consumed, step_time=step_time,
            skipped_iterations=1 if match.group("skipped") else 0,
            nan_iterations=1 if loss is not None and not math.isfinite(loss) else 0)


def _real(text: str) -> Optional[float]:
    try:
        return float(text)
    except ValueError:
        return None
