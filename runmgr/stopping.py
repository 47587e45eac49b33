"""A person's request to stop a run (Ctrl-C, SIGTERM from a scheduler) turned
into a clean, recorded stop instead of a crash.

Inside :func:`stop_on_signals`, the first SIGINT or SIGTERM is noted on the
:class:`StopRequest` it yields and raised as KeyboardInterrupt in the
driver's main thread: the one exception Ray's blocking calls hand back
promptly and intact (any other raised from a signal handler inside
``ray.get`` comes back, after the call ends, as a SystemError). The
controller's ``finally`` stops the workers; ``launch`` sees the request,
records the open sub-run as ``stopped by signal SIGINT`` and exits 128 + the
signal number (130, 143). A second signal while that cleanup runs gets the
default behaviour: a person who insists is obeyed, and the next launch finds
the sub-run open and abandons it, as after a crash.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class StopRequest:
    """Which stop signal arrived, if any."""

    signum: Optional[int] = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def reason(self) -> str:
        """``stopped by signal SIGINT``: the end reason the logbook records."""
        return f"stopped by signal {signal.Signals(self.signum).name}" if self.signum else "not stopped"

    @property
    def exit_code(self) -> int:
        """128 + the signal number, as a shell reports a process a signal ended."""
        return 128 + (self.signum or 0)


@contextmanager
def stop_on_signals(signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[StopRequest]:
    """Turn the first of ``signals`` into a noted KeyboardInterrupt; restore the handlers after."""
    request = StopRequest()
    previous = {signum: signal.getsignal(signum) for signum in signals}

    def request_stop(signum: int, frame) -> None:
        request.signum = signum
        for other in signals:  # the next one is not caught: a second Ctrl-C interrupts the cleanup
            signal.signal(other, signal.default_int_handler if other == signal.SIGINT else signal.SIG_DFL)
        raise KeyboardInterrupt(request.reason)

    for signum in signals:
        signal.signal(signum, request_stop)
    try:
        yield request
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
