"""Whatever numbers a job prints, the reader believes only those that can be: each absurd value
(the table in absurd_lines.py: 36 over every field) is refused with its field and reason, the rest
of its line kept; NaN and infinite losses and grad norms stay, as the non-finite detector needs."""

from __future__ import annotations

import math

import pytest

from runmgr.watch import torchrun
from runmgr.watch.megatron_log import MegatronLogReader
from runmgr.watch.text import printable
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
    assert (refused.field, refused.raw, refused.subrun) == (case.name, printable(case.raw, 100), "1.00")
    assert refused.reason and str(case.step) in refused.line
    assert step.loss is None or math.isfinite(step.loss)  # the other fields are read as usual


@pytest.mark.parametrize("case", LINE_CASES, ids=[f"{c.step}-{c.field}" for c in LINE_CASES])
def test_an_absurd_iteration_save_load_or_straggler_line_is_refused_whole(case):
    (refused,) = read([case.line(TOTAL)])
    assert isinstance(refused, RefusedValue) and refused.field == case.field


def test_the_table_covers_every_field_of_the_iteration_line_and_the_other_lines():
    assert len(FIELD_CASES) + len(LINE_CASES) >= 36
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


@pytest.mark.parametrize("raw, value", [
    ("8.219823E+00", 8.219823), ("  4.0  ", 4.0), ("6049.0/6100.2", 6049.0), (".5", 0.5), ("1.", 1.0),
    ("NAN", None), ("12ab", None), ("0x1F", None), ("1_000", None), ("1e", None), ("1.2.3", None), ("", None),
    ("information", None), ("4.0 4.0", None), ("\x00", None),
])
def test_a_value_is_a_number_only_when_it_is_one_in_full(raw, value):
    events = read([iteration_line(3, TOTAL, learning_rate=raw)])
    if value is None and raw.upper() != "NAN":
        step, refused = events
        assert step.lr is None and refused.field == "learning rate" and refused.reason == "not a number"
    elif value is None:  # NaN is a number, but no learning rate
        step, refused = events
        assert step.lr is None and refused.reason == "not finite"
    else:
        (step,) = events
        assert step.lr == pytest.approx(value)


@pytest.mark.parametrize("iteration, reason", [
    ("nan", "not finite"), ("-5", "below 1"), ("0", "below 1"), ("2.5", "not a whole number"),
    ("1e3", f"past its own total {TOTAL}"), ("31", f"past its own total {TOTAL}"), ("abc", "not a number"),
    ("9" * 5000, "past 2^63 - 1"),
])
def test_an_iteration_that_cannot_be_refuses_the_whole_line(iteration, reason):
    (refused,) = read([f" iteration {iteration}/{TOTAL:8d} | consumed samples: 8 | lm loss: 4.0 |"])
    assert (refused.field, refused.reason) == ("iteration", reason)


@pytest.mark.parametrize("total, reason", [("abc", "its total is not a number"), ("-1", "its total is below 0"),
                                           ("", "its total is not a number")])
def test_an_iteration_line_whose_total_cannot_be_is_refused(total, reason):
    (refused,) = read([f" iteration 3/{total} | lm loss: 4.0 |"])
    assert (refused.field, refused.reason) == ("iteration", reason)


def test_a_total_of_0_bounds_nothing_but_2_to_the_63():
    (step,) = read([" iteration 7/ 0 | lm loss: 4.0 |"])
    assert step.step == 7


@pytest.mark.parametrize("line, field_name", [
    ("  successfully saved checkpoint from iteration nan to /ck [ t 1/1, p 1/1 ]", "saved iteration"),
    ("saving checkpoint at iteration -1 to /ck in torch_dist format", "saving iteration"),
    ("  successfully loaded checkpoint from /ck [ t 1/1, p 1/1 ] at iteration 1e400", "loaded iteration"),
    ("| MnRtt/Rnk: nanms/3 | MxRtt/Rnk: 2.00ms/1 |", "straggler report"),
    ("| MnRtt/Rnk: 1.00ms/3 | MxRtt/Rnk: 86400001ms/1 |", "straggler report"),
    ("| MnRtt/Rnk: 1.00ms/" + "9" * 5000 + " | MxRtt/Rnk: 2.00ms/1 |", "straggler report"),
])
def test_a_save_load_or_straggler_line_with_a_number_that_cannot_be_is_refused(line, field_name):
    (refused,) = read([line])
    assert refused.field == field_name


def test_variants_of_the_elapsed_time_and_throughput_keys_are_refused_under_one_name_each():
    # (so that a job printing ever-new keys cannot make the logbook's refusal events unbounded)
    refused = read([" iteration 3/ 30 | elapsed time per iteration (ms) avg: -1 | tokens/sec/gpu: x |",
                    " iteration 4/ 30 | elapsed time per iteration (s) max: nan | tokens per sec per gpu: -2 |"])
    names = [r.field for r in refused if isinstance(r, RefusedValue)]
    assert names == ["elapsed time per iteration (ms)", "tokens per second", "elapsed time per iteration (s)",
                     "tokens per second"]


def test_an_elapsed_time_whose_key_says_no_unit_is_refused_not_guessed():
    step, refused = read([" iteration 3/ 30 | elapsed time per iteration (m\u202es): 50.0 | lm loss: 4.0 |"])
    assert step.step_time is None and step.loss == 4.0
    assert refused.field == "elapsed time per iteration" and refused.reason.startswith("no unit in its key")


@pytest.mark.parametrize("line", [
    "NVRM: Xid (PCI:0000:01:00): " + "9" * 5000 + ", pid=1, name=python",
    "[rank" + "9" * 5000 + "]: [E ProcessGroupNCCL.cpp] NCCL watchdog thread terminated: ncclRemoteError",
    "BadCheckpointError: checkpoint /ck (step " + "9" * 5000 + ") is unusable: truncated",
    " iteration 3/ 30 | lm loss: " + "9" * 5000 + " | loss scale: " + "1" * 5000 + ".5 |",
    " iteration \u0663/ 30 | lm loss: \uff14.0 |",
    "\x00" * 100 + " iteration 3/ 30 |" + "|" * 1000,
])
def test_lines_with_thousands_of_digits_or_odd_characters_never_raise(line):
    read([line])


def test_a_torchrun_report_with_thousands_of_digits_is_no_root_cause():
    digits = "9" * 5000
    report = ("Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-28_10:11:12\n"
              f"  rank      : {digits} (local_rank: {digits})\n  exitcode  : {digits} (pid: {digits})\n"
              "========================")
    assert torchrun.root_cause(report) is None
    assert torchrun.tracker_lines(f"ts=1 node=n device=d jobID=j rank={digits} iteration=1 status=x") == []


def test_a_refusal_keeps_what_the_job_printed_as_text_never_as_terminal_commands():
    (_, refused) = read([iteration_line(3, TOTAL, lm_loss="\x1b[31mred\x07")])
    assert "\x1b" not in refused.raw + refused.line and "\\x1b[31mred\\x07" in refused.raw
