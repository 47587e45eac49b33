import pytest

from logbook import LogbookError, format_subrun_id, parse_subrun_id
from logbook.ids import next_index


def test_ids_have_two_digits_and_grow_past_99():
    assert format_subrun_id(12, 0) == "12.00"
    assert format_subrun_id(12, 7) == "12.07"
    assert format_subrun_id(12, 100) == "12.100"
    assert parse_subrun_id("12.03") == (12, 3)
    assert parse_subrun_id("1.100") == (1, 100)


@pytest.mark.parametrize("bad", ["12", "12.3", "12.003", "a.01", "12.01.1", "", None])
def test_malformed_ids_are_refused_with_the_expected_form(bad):
    with pytest.raises(LogbookError, match="RUN.NN|write it as"):
        parse_subrun_id(bad)


def test_next_index_follows_the_highest():
    assert next_index([]) == 0
    assert next_index([0, 1, 2]) == 3
