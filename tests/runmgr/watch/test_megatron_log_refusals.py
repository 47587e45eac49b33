"""Whatever numbers a job prints, the reader believes only those that can be: each absurd value
(the table in absurd_lines.py: 28 over every field) is refused with its field and reason, the rest
of its line kept; NaN and infinite losses and grad norms stay, as the non-finite detector needs."""

from __future__ import annotations

import math

import pytest

from runmgr.watch.megatron_log import MegatronLogReader
from runmgr.watch.observations import RefusedValue, StepObservation
from tests.runmgr.watch.absurd_lines import FIELD_CASES, LINE_CASES, iteration_line

TOTAL = 30
ATTRIBUTE = {"consumed samples": "consumed_samples", "lm loss": "loss", "grad norm": "grad_norm",
             "loss scale": "loss_scale", "learning rate": "lr", "elapsed time per iteration (ms)": "step_time",
             "global batch size": "global_batch", "number of skipped iterations": "skipped_iterations",
             "number of nan iterations": "nan_iterations"}


def read(lines):
    reader = MegatronLogReader(subrun="1.00")
    return list(reader.events(lines))


@pytest.mark.parametrize("case", FIELD_CASES, ids=[f"{c.step}-{c.name}={c.raw[:12]}" for c in FIELD_CASES])
def test_an_absurd_field_is_refused_and_its_step_kept(case):
    step, refused = read([iteration_line(case.step - 1, TOTAL), case.line(TOTAL)])[1:]
    assert isinstance(step, StepObservation) and step.step == case.step
    assert getattr(step, ATTRIBUTE[case.name]) in (None, 0)  # counts fall back to 0, the rest to unknown
    assert isinstance(refused, RefusedValue)
    assert (refused.field, refused.raw, refused.subrun) == (case.name, case.raw[:100], "1.00")
    assert refused.reason and str(case.step) in refused.line
    assert step.loss is None or math.isfinite(step.loss)  # the other fields are read as usual


@pytest.mark.parametrize("case", LINE_CASES, ids=[f"{c.step}-{c.field}" for c in LINE_CASES])
def test_an_absurd_iteration_save_load_or_straggler_line_is_refused_whole(case):
    (refused,) = read([case.line(TOTAL)])
    assert isinstance(refused, RefusedValue) and refused.field == case.field


def test_the_table_covers_every_field_of_the_iteration_line_and_the_other_lines():
    assert len(FIELD_CASES) + len(LINE_CASES) >= 20
    assert {c.name for c in FIELD_CASES} == set(ATTRIBUTE)
    assert {c.field for c in LINE_CASES} >= {"iteration", "saving iteration", "saved iteration", "loaded iteration",
                                              "straggler report"}


@pytest.mark.parametrize("field_name, raw", [("lm loss", "nan"), ("lm loss", "inf"), ("lm loss", "1e400"),
                                             ("grad norm", "nan"), ("grad norm", "inf")])
def test_a_nan_or_infinite_loss_or_grad_norm_is_a_signal_not_a_refusal(field_name, raw):
    (step,) = read([iteration_line(7, TOTAL, **{field_name.replace(" ", "_"): raw})])
    value = getattr(step, ATTRIBUTE[field_name])
    assert value is not None and not math.isfinite(value)


def test_a_count_is_read_exactly_past_what_a_float_holds():
    (step,) = read([iteration_line(3, TOTAL, consumed_samples=str(2**53 + 1))])
    assert step.consumed_samples == 2**53 + 1
    (_, refused) = read([iteration_line(3, TOTAL, consumed_samples=str(2**63))])
    assert refused.reason == "past 2^63 - 1"
