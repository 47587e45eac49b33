"""Whether the Ray cluster's head is still there.

Without its head (the GCS) a Ray cluster cannot start an actor, place a
group or answer ``ray.nodes()``: those calls wait, and after
``gcs_rpc_server_reconnect_timeout_s`` (60 s) Ray's core worker ends the
driver process itself, with its own line and no end recorded. The ranks
already running go on training meanwhile (they talk to the driver directly).
:class:`HeadWatch` notices first, so that the sub-run ends as ``failed`` with
one line of runmgr's: a thread asks the GCS a cheap question every second,
and a local head whose GCS process exited counts as gone at once (nothing
restarts it). The Ray calls are injected: this module imports no Ray.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from runmgr.errors import ClusterLostError

PROBE_INTERVAL_S = 1.0

Probe = Callable[[float], bool]
"""``probe(timeout_s)``: True when the GCS answered within ``timeout_s``."""
HeadExit = Callable[[], Optional[str]]
"""Why the local head's GCS process is gone ("exited with signal 9"), or None while it runs."""


def no_local_head() -> Optional[str]:
    """A cluster joined by address: its head's processes are not ours to see."""
    return None


class HeadWatch:
    """Tells the driver when the cluster's head has been gone for ``lost_after_s``
    (``controller.cluster_lost_timeout_s``), or at once when its local process exited."""

    def __init__(self, address: str, probe: Probe, lost_after_s: float, head_exit: HeadExit = no_local_head,
                 clock: Callable[[], float] = time.monotonic, interval_s: float = PROBE_INTERVAL_S) -> None:
        self.address = address
        self.probe = probe
        self.lost_after_s = lost_after_s
        self.head_exit = head_exit
        self.clock = clock
        self.interval_s = interval_s
        self._answered_at = clock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        """Probe in a daemon thread until :meth:`stop` (a probe can wait its whole timeout)."""
        self._thread = threading.Thread(target=self._loop, name="ray-head-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop probing; returns once no probe is in flight (Ray may be shut down next)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.probe_once()
            self._stop.wait(self.interval_s)

    def probe_once(self) -> None:
        """Ask the GCS once; an answer renews the time it was last heard from."""
        if self.probe(min(2.0, self.lost_after_s / 2)):
            self._answered_at = self.clock()

    def lost(self) -> Optional[str]:
        """Why the head is gone, in one line; None while it is there."""
        exited = self.head_exit()
        if exited is not None:
            return f"the Ray cluster's head is gone: its GCS process {exited}"
        silent_s = self.clock() - self._answered_at
        if silent_s > self.lost_after_s:
            return (f"the Ray cluster's head is gone: its GCS at {self.address} has not answered for "
                    f"{silent_s:.0f} s (controller.cluster_lost_timeout_s={self.lost_after_s:g})")
        return None

    def check(self) -> None:
        """Raise :class:`ClusterLostError` once the head is gone, saying how to go on."""
        reason = self.lost()
        if reason is None:
            return
        when = "" if self.head_exit() is not None else "once it answers again, "
        raise ClusterLostError(f"{reason}; {when}run the same `runmgr launch` again to resume from the last "
                               f"checkpoint")
