"""A sub-run that a warm restart started reads as one: from the ranks' memory at its step,
not "from step N, no checkpoint"; a cold one still names its checkpoint."""

from __future__ import annotations

from logbook import SubRun
from logbook.markdown import _where
from logbook.render import start_line


def subrun(evidence: dict, checkpoint: str | None, step: int) -> SubRun:
    return SubRun(id="7.01", index=1, started_at=1_700_000_000.0, cause="worker_death", evidence=evidence,
                  start_checkpoint=checkpoint, start_step=step, plan={}, config={})


def test_warm_and_cold_starts_say_where_their_state_came_from():
    warm = subrun({"restart": "warm", "resumed_from": "memory", "replaced_ranks": [3]}, None, 437)
    cold = subrun({"restart": "cold"}, "checkpoints/step_00000430", 430)
    assert "warm from memory (step 437)" in start_line(warm, None)
    assert "from step_00000430 (step 430)" in start_line(cold, None)
    assert _where(warm, str) == "warm restart from the ranks' memory (step 437)"
    assert _where(cold, str).startswith("checkpoint ")
