import math
import sqlite3

import pytest

from logbook import LogbookError
from logbook.records import decode_float, encode_float, normalise_metric_row


def through_sqlite(value):
    """Store in a REAL column (as the metrics table does) and read back."""
    connection = sqlite3.connect(":memory:")
    connection.execute("CREATE TABLE t (x REAL)")
    connection.execute("INSERT INTO t VALUES (?)", (encode_float(value),))
    return decode_float(connection.execute("SELECT x FROM t").fetchone()[0])


@pytest.mark.parametrize("value", [0.1 + 0.2, 1 / 3, 1e-300, 5e-324, -2.5, math.inf, -math.inf, 0.0])
def test_floats_round_trip_exactly(value):
    assert through_sqlite(value) == value


def test_nan_and_negative_zero_survive_sqlite():
    assert math.isnan(through_sqlite(math.nan))
    assert math.copysign(1.0, through_sqlite(-0.0)) == -1.0


def test_metric_row_derives_tokens_per_second_and_drops_unknown_keys():
    row = normalise_metric_row("1.00", {"subrun": "1.00", "step": 3, "tokens": 1000, "step_time": 0.5,
                                        "compute_times": [0.1, 0.2]})
    assert row["tokens_per_s"] == 2000.0
    assert "compute_times" not in row and row["skipped"] is False


def test_metric_row_without_step_or_for_another_subrun_is_refused():
    with pytest.raises(LogbookError, match="'step'"):
        normalise_metric_row("1.00", {"loss": 1.0})
    with pytest.raises(LogbookError, match="under its own sub-run"):
        normalise_metric_row("1.00", {"subrun": "1.01", "step": 1})
    with pytest.raises(LogbookError, match="non-number"):
        normalise_metric_row("1.00", {"step": 1, "loss": "high"})
