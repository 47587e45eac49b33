"""The S3 upload lag from the logbook's checkpoints and uploads: how long the
oldest checkpoint still waiting for its copy has waited."""

from __future__ import annotations

from runmgr.metrics.uploads import upload_lag

CHECKPOINTS = [(1, 10, 100.0), (5, 20, 200.0), (9, 30, 300.0)]
"""(journal seq, step, time recorded)."""


def test_nothing_recorded_or_everything_mirrored_is_no_lag():
    assert upload_lag([], [], 1000.0) == 0
    assert upload_lag(CHECKPOINTS, [(12, 30)], 1000.0) == 0


def test_the_oldest_checkpoint_after_the_newest_mirrored_one_sets_the_lag():
    assert upload_lag(CHECKPOINTS, [], 1000.0) == 900  # 10 waits since 100
    assert upload_lag(CHECKPOINTS, [(6, 20)], 1000.0) == 700  # 30 waits since 300
    # 10 never mirrored (retention may have deleted it once 20 was safe): it holds nothing back.
    assert upload_lag(CHECKPOINTS, [(7, 20)], 1000.0) == 700


def test_an_upload_counts_only_for_the_checkpoint_recorded_before_it():
    # A rollback trained step 20 again: the new checkpoint of step 20 (seq 11) is not the one mirrored at seq 6.
    again = [*CHECKPOINTS, (11, 20, 400.0)]
    assert upload_lag(again, [(6, 20), (10, 30)], 1000.0) == 600
    assert upload_lag(again, [(6, 20), (10, 30), (13, 20)], 1000.0) == 0
