"""The run's history: an append-only, crash-safe logbook of sub-runs,
incidents, decisions, events, checkpoints and per-step metrics, with
renderers for people (``render``) and the CLI's helpers (``cli``)."""

from logbook.accounting import SubRunCost
from logbook.errors import LogbookError
from logbook.ids import format_subrun_id, parse_subrun_id
from logbook.records import KNOWN_END_STATES, SubRun
from logbook.schema import LOGBOOK_FILENAME, SCHEMA_VERSION
from logbook.store import Logbook

__all__ = [
    "KNOWN_END_STATES",
    "LOGBOOK_FILENAME",
    "SCHEMA_VERSION",
    "Logbook",
    "LogbookError",
    "SubRun",
    "SubRunCost",
    "format_subrun_id",
    "parse_subrun_id",
]
