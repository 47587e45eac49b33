"""The warm link of a forked rank (trainer/warm.py's ``WarmLink``), over its pipe to its agent.

A rank forked by its node's agent (runmgr/agents/rank_processes.py) sends its reports up a
pipe. Under warm recovery the pipe is two-way: when the trainer blocks in ``rejoin`` (a peer
broke the group) or ``join`` (a spare has built its model), the link sends ``("waiting", key)``
up the pipe, as an ordinary report item, and blocks reading the pipe for the one answer the
agent sends down (:meth:`RankProcesses.answer`): a :class:`trainer.rejoin.Rejoin`, or None to
restart cold. Nothing else ever goes down the pipe, so the rank reads only its answers. The
driver sends the answers to the agent already pickled (:class:`PackedAnswer`), so that the agent
never loads their classes (a ``Rejoin`` brings torch with it).

Ray-free. (The per-rank design's link, ``ActorWarmLink`` in a rank actor, was retired: warm
spares run under the agents only.)
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from trainer.rejoin import Rejoin

WAITING = "waiting"
"""The report kind a rank sends when it waits in its warm link (the per-rank drain's word)."""


@dataclass(frozen=True)
class WarmRun:
    """What a node's agent needs to run its ranks warm."""

    buddy_offset: int
    """Where each rank's snapshot buddy sits, ranks on (trainer/warm.py)."""
    live: bool
    """Plain data parallel: a replica's live state serves, no snapshot is taken (trainer/live.py)."""


@dataclass(frozen=True)
class PackedAnswer:
    """An answer for a rank's warm link, pickled where it was made (the driver). The agent sends
    its bytes down the pipe as they are, and the rank's ``recv`` unpickles them, as it would the
    answer itself. So the agent process never imports the answer's classes: a
    :class:`trainer.rejoin.Rejoin` imports torch (trainer.distributed), which the agent has no other use for (its fork
    server holds it for the ranks), and that import, made by the first recovery's unpickling,
    held the recovery 7-8 s on this 2-core machine under load (tests/e2e/test_resharding_resume.py,
    the node lost under its agent)."""

    data: bytes

    @classmethod
    def of(cls, answer: Any) -> "PackedAnswer":
        return cls(pickle.dumps(answer))

    def send(self, conn: Connection) -> None:
        """Down ``conn``: what ``conn.send(answer)`` would have sent."""
        conn.send_bytes(self.data)


class SpareReleased(Exception):
    """A spare its agent let go without a rank to replace (its answer was None)."""


class AgentGone(Exception):
    """The pipe closed while the rank waited for its answer: its agent is gone."""


class PipeWarmLink:
    """A forked rank's warm link: ``waiting`` up the pipe, the answer down it."""

    def __init__(self, conn: Connection, key: int, buddy_offset: int = 1) -> None:
        """``key``: what the agent knows the process by (its rank, or a spare's negative key)."""
        self.conn = conn
        self.key = key
        self.buddy_offset = buddy_offset

    def rejoin(self, error: BaseException, newest_snapshot: Optional[int]) -> Optional["Rejoin"]:
        return self._wait()

    def join(self) -> "Rejoin":
        answer = self._wait()
        if answer is None:
            raise SpareReleased("the node's agent released this spare")
        return answer

    def _wait(self) -> Optional["Rejoin"]:
        self.conn.send((WAITING, self.key))
        try:
            answer = self.conn.recv()
        except EOFError:
            raise AgentGone("the node's agent closed the pipe while this rank waited in its warm link") from None
        if answer is not None:
            self.key = answer.dist_env.rank  # a spare becomes the rank it replaces
        return answer
