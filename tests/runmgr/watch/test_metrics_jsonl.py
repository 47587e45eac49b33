"""Our logbook's metrics/events JSONL as observations."""

from __future__ import annotations

import json
import math

import pytest

from runmgr.watch.errors import ReplayInputError
from runmgr.watch.metrics_jsonl import read_jsonl
from runmgr.watch.observations import CheckpointObservation, StepObservation


def row(step, **extra):
    base = {"subrun": "12.00", "step": step, "loss": 3.0, "grad_norm": 0.5, "lr": 1e-4, "loss_scale": 1.0,
            "tokens": 4096, "tokens_per_s": None, "step_time": 0.5, "time": 100.0 + step, "consumed_samples": step * 8,
            "skipped": False}
    base.update(extra)
    return json.dumps(base) + "\n"


def test_metrics_rows_become_step_observations():
    events = read_jsonl([row(1), row(2, loss=float("nan"), skipped=True)], "m.jsonl")
    assert all(isinstance(e, StepObservation) for e in events)
    first, second = events
    assert (first.step, first.subrun, first.consumed_samples, first.tokens_per_s) == (1, "12.00", 8, 8192.0)
    assert math.isnan(second.loss) and second.skipped


def test_checkpoint_events_are_merged_in_time_order_and_other_events_skipped():
    checkpoint = json.dumps({"seq": 9, "type": "checkpoint", "subrun": "12.00", "time": 101.5, "step": 1,
                             "path": "/runs/12/ckpt/1", "seconds": 0.3}) + "\n"
    incident = json.dumps({"seq": 10, "type": "incident", "subrun": "12.00", "time": 101.7, "kind": "hang"}) + "\n"
    events = read_jsonl([row(1), row(2), checkpoint, incident], "m.jsonl")
    assert [type(e).__name__ for e in events] == ["StepObservation", "CheckpointObservation", "StepObservation"]
    assert events[1] == CheckpointObservation(step=1, time=101.5, subrun="12.00")


def test_a_line_that_is_not_json_is_refused_with_its_line_number():
    with pytest.raises(ReplayInputError, match=r"m.jsonl:2: not a JSON object"):
        read_jsonl([row(1), "iteration 5 | oops\n", row(3)], "m.jsonl")


def test_a_last_line_cut_short_by_a_crash_is_left_out():
    events = read_jsonl([row(1), row(2), row(3)[:25]], "m.jsonl")
    assert [e.step for e in events] == [1, 2]


def test_a_wrong_type_names_the_key():
    with pytest.raises(ReplayInputError, match=r"m.jsonl:1: 'loss' must be a number"):
        read_jsonl([row(1, loss="high")], "m.jsonl")
