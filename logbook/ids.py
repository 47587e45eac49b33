"""Sub-run ids in the OPT logbook's style: run 12's launches are ``12.00``,
``12.01``, ... The index has two digits and grows to three past 99."""

from __future__ import annotations

import re
from typing import Iterable

from logbook.errors import LogbookError

_SUBRUN_ID = re.compile(r"^(\d+)\.(\d{2,})$")


def format_subrun_id(run_number: int, index: int) -> str:
    """``format_subrun_id(12, 3) == "12.03"``."""
    if run_number < 0 or index < 0:
        raise LogbookError(
            f"run number and sub-run index must be >= 0, got {run_number} and {index}"
        )
    return f"{run_number}.{index:02d}"


def parse_subrun_id(subrun_id: str) -> tuple[int, int]:
    """``parse_subrun_id("12.03") == (12, 3)``; anything else is a LogbookError."""
    match = _SUBRUN_ID.match(subrun_id) if isinstance(subrun_id, str) else None
    if match is None:
        raise LogbookError(
            f"bad sub-run id {subrun_id!r}: expected RUN.NN such as '12.03' "
            "(get the next one from Logbook.next_subrun_id)"
        )
    run_number, index = int(match.group(1)), int(match.group(2))
    if format_subrun_id(run_number, index) != subrun_id:
        raise LogbookError(
            f"bad sub-run id {subrun_id!r}: write it as {format_subrun_id(run_number, index)!r}"
        )
    return run_number, index


def next_index(existing_indices: Iterable[int]) -> int:
    """The index after the highest one used (0 when none)."""
    return max(existing_indices, default=-1) + 1


def check_next(subrun_id: str, lineage_ids: list[str], where: str) -> None:
    """Raise unless ``subrun_id`` is the one that comes after ``lineage_ids`` (the
    logbook at ``where``): the same run number, the next index."""
    run_number, _ = parse_subrun_id(subrun_id)
    if lineage_ids and parse_subrun_id(lineage_ids[-1])[0] != run_number:
        raise LogbookError(
            f"the logbook at {where} holds run {parse_subrun_id(lineage_ids[-1])[0]}, "
            f"not run {run_number}: use another run directory for sub-run {subrun_id}"
        )
    expected = format_subrun_id(run_number, next_index(parse_subrun_id(i)[1] for i in lineage_ids))
    if subrun_id != expected:
        raise LogbookError(
            f"sub-run {subrun_id} cannot start here: the next one is {expected} "
            "(take it from next_subrun_id)"
        )
