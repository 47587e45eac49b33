"""The end of a sub-run whose ranks all exited 0: finished, or an early exit.

A job that reaches its last step and exits 0 is finished. One that exits 0
before it is an incident of its own (``early_exit``): it stopped by itself
(Megatron's ``--exit-interval``, ``--exit-duration-in-mins`` or its signal
handler, which save first), or it never trained at all (a script that prints
something else and returns). Which of the two it was, the evidence says: the
step it reached, whether it printed any iteration line, and whether it saved a
checkpoint newer than the one it started from. The policy decides.
"""

from __future__ import annotations

from runmgr.watch.incidents import EARLY_EXIT, Incident
from runmgr.watch.observations import JobEnded


class EndDetector:
    """One ``early_exit`` incident for a sub-run that ended with exit 0 short of the last step."""

    def update(self, ended: JobEnded, now: float) -> list[Incident]:
        """Feed the end of a sub-run; an incident unless it reached ``ended.final_step``."""
        if ended.last_step >= ended.final_step:
            return []
        saved = ended.newest_checkpoint is not None and ended.newest_checkpoint > ended.start_step
        what = (f"after {ended.steps_reported} iteration line(s) and a save at step {ended.newest_checkpoint}"
                if saved else
                f"after {ended.steps_reported} iteration line(s), saving nothing newer than step {ended.start_step}"
                if ended.steps_reported else "without printing a single iteration line")
        description = (f"every rank exited with code 0 at step {ended.last_step}, before the run's last step "
                       f"{ended.final_step}, {what}")
        return [Incident(
            kind=EARLY_EXIT, time=now, subrun=ended.subrun, description=description, onset_step=ended.last_step,
            evidence={"last_step": ended.last_step, "final_step": ended.final_step, "start_step": ended.start_step,
                      "newest_checkpoint": ended.newest_checkpoint, "saved_since_start": saved,
                      "steps_reported": ended.steps_reported, "last_output": list(ended.output)},
        )]
