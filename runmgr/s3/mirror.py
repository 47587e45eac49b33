"""The driver's background mirror of verified checkpoints on S3.

One thread works through a queue, oldest job first: an upload per checkpoint
the logbook recorded (or found on the local disk at a launch), and a
retirement of the copies past a sub-run's start (an abandoned branch, as the
trainer retires the local ones). A job that fails on S3 stays at the head of
the queue and is tried again after ``retry_backoff_s``, doubling up to
``max_backoff_s``, for as long as the run lasts: an outage delays the copies,
never loses one, and never blocks training, whose driver only hands jobs over
and collects what happened (:meth:`S3Mirror.drain`). Until a checkpoint's
copy verifies, retention keeps its local copy (:meth:`S3Mirror.is_durable`).

It is also the remote source a resume falls back to
(:class:`runmgr.resume.RemoteCheckpoints`): the complete copies, their
manifests, a download checked against the manifest. Itself, it asks S3 (a
launch, which has just seen S3 answer); its :attr:`S3Mirror.known` view
answers from what the mirror has listed and verified, so that a decision
during the run never waits on an S3 that does not answer.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Literal, Optional, Union

from runmgr.resume import RemoteUnavailable
from runmgr.s3.client import S3_ERRORS, S3Client
from runmgr.s3.copies import (
    CopyMismatch, LocalCopyGone, NoCopy, Uploaded, complete_steps, download_checkpoint, read_remote_manifest,
    retire_copy, transfer_config, upload_checkpoint,
)
from trainer.manifest import verify_checkpoint

MirrorEventKind = Literal["uploaded", "failed", "skipped", "retired"]


@dataclass(frozen=True)
class MirrorEvent:
    """What one job of the mirror came to."""

    kind: MirrorEventKind
    """``uploaded`` (the copy verified), ``failed`` (an attempt; it is tried again),
    ``skipped`` (the local checkpoint is gone or damaged: nothing to mirror),
    ``retired`` (copies of an abandoned branch made incomplete)."""
    step: int
    time: float
    error: str = ""
    uploaded: Optional[Uploaded] = None
    upload_s: float = 0.0
    """Seconds the successful attempt took."""
    attempts: int = 0
    """Attempts this job took, the successful one included."""
    pending: tuple[int, ...] = ()
    """Checkpoints still waiting for their copy after this job."""
    retired: tuple[int, ...] = ()


@dataclass
class _Upload:
    step: int
    path: Path
    attempts: int = 0


@dataclass
class _Retire:
    after_step: int
    tag: str
    attempts: int = 0

    @property
    def step(self) -> int:
        return self.after_step


_Job = Union[_Upload, _Retire]
MIRROR_ERRORS = (*S3_ERRORS, CopyMismatch)
"""An attempt that failed on S3's side (or whose copy did not verify): tried again."""


class S3Mirror:
    """Uploads checkpoints in the background; the resume's remote source."""

    def __init__(self, s3: S3Client, clock: Callable[[], float] = time.time) -> None:
        self.s3 = s3
        self.clock = clock
        self.transfer = transfer_config(s3)
        self._jobs: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._durable: set[int] = set()
        self._known: dict[int, Optional[int]] = {}
        """Complete copies seen (listed or verified): step -> consumed samples, None when not read."""
        self._events: list[MirrorEvent] = []
        self._stopping = False
        self._thread: Optional[threading.Thread] = None

    @property
    def location(self) -> str:
        return self.s3.place.url

    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, name="s3-mirror", daemon=True)
        self._thread.start()

    def submit(self, step: int, path: Path) -> None:
        """Mirror the checkpoint of ``step`` at ``path`` (once; a known copy is not sent again)."""
        with self._cond:
            if step in self._durable or any(isinstance(j, _Upload) and j.step == step for j in self._jobs):
                return
            self._jobs.append(_Upload(step, Path(path)))
            self._cond.notify_all()

    def retire_after(self, step: int, tag: str) -> None:
        """A sub-run starts from ``step``: copies past it belong to an abandoned branch.
        Waiting uploads past it are dropped (the one in flight finishes and is retired)."""
        with self._cond:
            head = self._jobs[0] if self._jobs else None
            self._jobs = deque(j for j in self._jobs if j is head or not (isinstance(j, _Upload) and j.step > step))
            self._durable = {s for s in self._durable if s <= step}
            self._known = {s: samples for s, samples in self._known.items() if s <= step}
            self._jobs.append(_Retire(step, tag))
            self._cond.notify_all()

    def is_durable(self, step: int) -> bool:
        """True once the copy of ``step`` verified on S3."""
        with self._cond:
            return step in self._durable

    def durable_count(self) -> int:
        """How many copies verified so far (retention looks again when it grows)."""
        with self._cond:
            return len(self._durable)

    def pending_steps(self) -> tuple[int, ...]:
        with self._cond:
            return self._pending()

    def known_steps(self) -> list[int]:
        """The steps of the copies listed or verified on S3, oldest first."""
        with self._cond:
            return sorted(self._known)

    def known_samples(self, step: int) -> Optional[int]:
        """The consumed samples of the copy of ``step`` as read when it was listed or verified;
        None when its manifest was not read."""
        with self._cond:
            return self._known.get(step)

    def drain(self) -> list[MirrorEvent]:
        """What happened since the last call, oldest first."""
        with self._cond:
            events, self._events = self._events, []
            return events

    def finish(self, timeout_s: float) -> tuple[int, ...]:
        """Wait up to ``timeout_s`` for the queue to empty, then stop; the steps still without a copy."""
        deadline = self.clock() + timeout_s
        with self._cond:
            while self._jobs and self._thread is not None and self.clock() < deadline:
                self._cond.wait(timeout=min(1.0, max(0.0, deadline - self.clock())))
            pending = self._pending()
        self.close()
        return pending

    def close(self) -> None:
        """Stop the thread (an attempt in flight is abandoned with the process)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=self.s3.config.connect_timeout_s + 1.0)
            self._thread = None

    # The resume's remote source (runmgr.resume.RemoteCheckpoints), on the caller's thread.

    @property
    def known(self) -> "KnownCopies":
        """The copies this mirror has seen, answered from memory (never waits on S3 but to fetch)."""
        return KnownCopies(self)

    def complete_steps(self) -> list[int]:
        steps = self._remote(lambda: complete_steps(self.s3))
        with self._cond:
            self._known = {step: self._known.get(step) for step in steps}
        return steps

    def consumed_samples(self, step: int) -> Optional[int]:
        samples = self._remote(lambda: read_remote_manifest(self.s3, step).get("consumed_samples"))
        with self._cond:
            self._known[step] = samples
        return samples

    def fetch(self, step: int, save_dir: Path) -> Path:
        return self._remote(lambda: download_checkpoint(self.s3, step, Path(save_dir), self.transfer))

    def _remote(self, action):
        try:
            return action()
        except NoCopy:
            raise RemoteUnavailable("no complete copy (its manifest is not there)") from None
        except (*MIRROR_ERRORS, OSError, ValueError) as error:
            raise RemoteUnavailable(self.s3.describe(error)) from None

    # The thread.

    def _pending(self) -> tuple[int, ...]:
        return tuple(j.step for j in self._jobs if isinstance(j, _Upload))

    def _work(self) -> None:
        backoff = self.s3.config.retry_backoff_s
        while True:
            with self._cond:
                while not self._jobs and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                job = self._jobs[0]
            job.attempts += 1
            event = self._attempt(job)
            with self._cond:
                if event.kind != "failed" and self._jobs and self._jobs[0] is job:
                    self._jobs.popleft()
                self._events.append(event if event.kind == "failed" else replace(event, pending=self._pending()))
                self._cond.notify_all()
                if event.kind == "failed":
                    self._back_off(backoff)
                    backoff = min(2 * backoff, self.s3.config.max_backoff_s)
                else:
                    backoff = self.s3.config.retry_backoff_s

    def _back_off(self, seconds: float) -> None:
        """Wait ``seconds`` before the next attempt (new work does not shorten it; a stop does)."""
        deadline = time.monotonic() + seconds
        while not self._stopping and time.monotonic() < deadline:
            self._cond.wait(timeout=deadline - time.monotonic())

    def _attempt(self, job: _Job) -> MirrorEvent:
        started = self.clock()
        try:
            if isinstance(job, _Retire):
                return self._retire(job)
            uploaded = upload_checkpoint(self.s3, job.path, self.transfer)
        except LocalCopyGone as gone:
            return MirrorEvent("skipped", job.step, self.clock(), error=str(gone), attempts=job.attempts)
        except OSError as error:  # a local file vanished mid-upload (retired), or the network below botocore
            if isinstance(job, _Upload) and not verify_checkpoint(job.path, check_hashes=False)[0]:
                return MirrorEvent("skipped", job.step, self.clock(), error=f"{job.path.name} is gone",
                                   attempts=job.attempts)
            return self._failed(job, error)
        except MIRROR_ERRORS as error:
            return self._failed(job, error)
        with self._cond:
            self._durable.add(job.step)
            self._known[job.step] = uploaded.consumed_samples
        return MirrorEvent("uploaded", job.step, self.clock(), uploaded=uploaded, upload_s=self.clock() - started,
                           attempts=job.attempts)

    def _failed(self, job: _Job, error: BaseException) -> MirrorEvent:
        with self._cond:
            pending = self._pending()
        return MirrorEvent("failed", job.step, self.clock(), error=self.s3.describe(error), attempts=job.attempts,
                           pending=pending)

    def _retire(self, job: _Retire) -> MirrorEvent:
        steps = tuple(step for step in complete_steps(self.s3) if step > job.after_step)
        for step in steps:
            retire_copy(self.s3, step, job.tag)
            with self._cond:
                self._known.pop(step, None)
        return MirrorEvent("retired", job.after_step, self.clock(), retired=steps, attempts=job.attempts)


class KnownCopies:
    """:class:`runmgr.resume.RemoteCheckpoints` from what the mirror has listed or verified:
    what the policy may choose from and a restart may fetch, without asking S3 for a list."""

    def __init__(self, mirror: S3Mirror) -> None:
        self.mirror = mirror

    @property
    def location(self) -> str:
        return self.mirror.location

    def complete_steps(self) -> list[int]:
        return self.mirror.known_steps()

    def consumed_samples(self, step: int) -> Optional[int]:
        """As read when the copy was listed or verified; None when its manifest was not read."""
        return self.mirror.known_samples(step)

    def fetch(self, step: int, save_dir: Path) -> Path:
        return self.mirror.fetch(step, save_dir)
