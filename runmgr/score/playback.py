"""A recorded log followed as ``runmgr watch follow`` would have followed it while it was written:
the same follower (runmgr/shadow/follower.py: reader, translator, judge, policy, logbook), its
clock moved from line to line, and to each moment a silence would become a hang, so a hang is
found when a live follower polling every 0.2 s would have found it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from logbook import Logbook
from runmgr.config.schema import RunConfig
from runmgr.controller.judgement import Judgement
from runmgr.score.timeline import PlayedLog
from runmgr.shadow.follower import Follower

POLL_S = 0.2
"""A live follower's poll interval (runmgr/shadow/command.py): a silence is judged this long after
it became a hang."""


@dataclass(frozen=True)
class Call:
    """One incident the follower recorded and what it decided, with when and where."""

    judgement: Judgement
    step: Optional[int]
    """The last iteration seen when it was decided."""
    at: float
    """The log's time when it was decided."""


def play(config: RunConfig, source: PlayedLog, book: Logbook, silence_at_end_s: float = 0.0) -> list[Call]:
    """Every incident a follower of ``source`` records into ``book`` (whose clock should be the
    source's), in order. After the last line the job stays silent ``silence_at_end_s`` more (a
    hang the log ends in)."""
    follower = Follower(config, source, book, source.clock, keeps_position=False)
    end = (source.lines[-1][0] if source.lines else source.now) + silence_at_end_s
    calls: list[Call] = []
    while True:
        moment = _next_moment(source, follower.next_silence_at(), end)
        if moment is None:
            break
        source.now = moment
        for judgement in follower.poll():
            last = follower.subrun.last_step if follower.subrun is not None else None
            calls.append(Call(judgement, last, moment))
    follower.close("the recorded log ended")
    return calls


def _next_moment(source: PlayedLog, silence_at: Optional[float], end: float) -> Optional[float]:
    """The next line's time, or the poll after a silence would become a hang if that comes first
    (and before the log's end); None when neither comes."""
    line_at = source.next_line_at()
    hang_at = silence_at + POLL_S if silence_at is not None else None
    if hang_at is not None and (hang_at <= source.now or (line_at is None and hang_at > end)):
        hang_at = None  # already judged (and not reported: a beat came), or after the job was killed
    moments = [t for t in (line_at, hang_at) if t is not None]
    return max(source.now, min(moments)) if moments else None
