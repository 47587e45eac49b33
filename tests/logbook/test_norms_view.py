"""`runmgr logbook norms RUN --step N`: the local_norms table, read as one sub-run
saw its history, and which weights moved first and most around step N."""

from __future__ import annotations

import io
import json
import re

import pytest

from logbook import Logbook, LogbookError, cli
from logbook.norms_queries import fetch_local_norms

CONFIG = {"training": {"local_norms_interval": 1}}


def norms(step: int, spiked: bool) -> dict[str, float]:
    wobble = 1.0 + 0.02 * (step % 3)
    jump = spiked and step >= 30
    return {"embedding.weight": wobble * (25.0 if spiked and step >= 31 else 1.0),
            "layers.0.attention.wq.weight": 2.0 * wobble, "output.weight": 0.5 * wobble * (9.0 if jump else 1.0)}


@pytest.fixture
def run_with_norms(tmp_path, clock):
    """7.00 trains on garbage from step 30 (seen as a loss spike); 7.01 rolls back to 20 and
    redoes 21-40 without it."""
    with Logbook.open(tmp_path, clock=clock) as book:
        book.start_subrun("7.00", "launch", {}, None, 0, {}, CONFIG)
        for step in range(1, 41):
            book.record_local_norms("7.00", step, norms(step, spiked=True))
        book.record_incident("7.00", "loss_spike", "loss_spike at step 30", {}, step=30)
        book.end_subrun("7.00", "restarting", 40, "rollback_skip")
        book.start_subrun("7.01", "rollback", {}, None, 20, {}, CONFIG)
        for step in range(21, 41):
            book.record_local_norms("7.01", step, norms(step, spiked=False))
    return tmp_path


def test_the_incidents_subrun_is_read_and_the_first_and_most_moved_weights_are_printed(run_with_norms):
    out = io.StringIO()
    assert cli.norms(run_with_norms, 30, out) == 0
    text = out.getvalue()
    assert "as sub-run 7.00 saw them (the loss_spike at step 30 was seen there)" in text
    assert re.search(r"^moved first, at step 30: output\.weight (8|9)\.\dx$", text, re.M)
    assert re.search(r"^moved most: embedding\.weight 2[45]\.\dx at step 3\d$", text, re.M)
    table = text.split("\n\n")[1].splitlines()
    assert table[1].split()[0] == "embedding.weight" and table[-1].split()[0] == "layers.0.attention.wq.weight"


def test_another_subrun_reads_its_own_branch_and_json_has_every_weight(run_with_norms):
    out = io.StringIO()
    cli.norms(run_with_norms, 30, out, as_json=True, subrun="7.01")
    answer = json.loads(out.getvalue())
    assert answer["subrun"] == "7.01" and answer["first_step"] is None and answer["first"] == []
    assert answer["baseline_steps"] == [20, 29]  # 20 is 7.00's (before 7.01's start), 21-29 7.01's own
    assert {w["name"] for w in answer["weights"]} == set(norms(1, False))
    high = io.StringIO()
    cli.norms(run_with_norms, 30, high, threshold=10.0)
    assert "moved first, at step 31: embedding.weight" in high.getvalue()


def test_a_step_without_an_incident_is_read_by_the_newest_subrun_that_trained_it(run_with_norms):
    """Issue 32: `--step 10` was headed with the newest sub-run, which resumed at step 20 and
    never trained step 10."""
    early, late = io.StringIO(), io.StringIO()
    cli.norms(run_with_norms, 10, early)
    cli.norms(run_with_norms, 35, late)
    assert early.getvalue().startswith("local norms around step 10, as sub-run 7.00 saw them "
                                       "(the newest sub-run that trained step 10, from step 0;")
    assert late.getvalue().startswith("local norms around step 35, as sub-run 7.01 saw them "
                                      "(the newest sub-run that trained step 35, from step 20;")


def test_the_table_keeps_every_step_of_every_subrun(run_with_norms):
    with Logbook.open(run_with_norms, create=False) as book:
        rows = book.query(fetch_local_norms)
    assert len(rows) == 40 + 20 and rows[0]["norms"] == norms(1, True)


@pytest.mark.parametrize("step, threshold, said", [
    (0, 3.0, "--step must be a step of the run"),
    (30, 0.5, "--threshold is a ratio to the baseline and must be above 1"),
    (1, 3.0, "recorded no local norms both before and at or after step 1"),
    (90, 3.0, "recorded no local norms both before and at or after step 90"),
])
def test_bad_steps_and_thresholds_are_one_line(run_with_norms, step, threshold, said):
    with pytest.raises(LogbookError, match=said) as raised:
        cli.norms(run_with_norms, step, io.StringIO(), threshold=threshold)
    assert "\n" not in str(raised.value)


def test_a_run_without_local_norms_says_how_to_get_them(tmp_path, clock):
    with Logbook.open(tmp_path, clock=clock) as book:
        book.start_subrun("7.00", "launch", {}, None, 0, {}, {})
    with pytest.raises(LogbookError, match="training.local_norms_interval"):
        cli.norms(tmp_path, 5, io.StringIO())
