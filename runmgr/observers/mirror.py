"""Between the controller and the S3 mirror (runmgr/s3/mirror.py).

Each checkpoint the logbook recorded (this observer comes after the logbook
writer) goes to the mirror; each sub-run's start retires the copies past its
start step (an abandoned branch). What the mirror did comes back on the
driver's thread, once per poll: verified copies are written into the logbook
(``checkpoint_uploaded`` with the step, the seconds from the checkpoint's
commit to its verified copy, and the bytes), and every attempt becomes an
:class:`~runmgr.watch.observations.UploadObservation` the judge reads right
after (:meth:`MirrorObserver.read_uploads`), so that an outage is detected by
the watcher and decided by the policy like any incident.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, TextIO

from logbook import Logbook
from runmgr.controller.group import GroupPoll
from runmgr.controller.judge import Judge
from runmgr.controller.judgement import Judgement
from runmgr.controller.states import Launching, Running, State
from runmgr.watch.observations import UploadObservation
from trainer.manifest import list_checkpoints, step_of, verify_checkpoint

if TYPE_CHECKING:  # boto3 is imported only by a run that mirrors its checkpoints (lineage.py)
    from runmgr.s3.mirror import MirrorEvent, S3Mirror


class MirrorObserver:
    """Feeds the mirror, records what it did, and hands its attempts to the judge."""

    def __init__(self, mirror: S3Mirror, book: Logbook) -> None:
        self.mirror = mirror
        self.book = book
        self.subrun = ""
        self._observations: list[UploadObservation] = []

    def on_transition(self, old: State | None, new: State) -> None:
        self.subrun = new.subrun
        if isinstance(new, Launching):
            self.mirror.retire_after(new.start_step, new.subrun)

    def on_judgement(self, state: Running | Launching, judgement: Judgement) -> None:
        """The mirror does not depend on judgements."""

    def on_poll(self, state: Running, poll: GroupPoll) -> None:
        for report in poll.checkpoints:
            self.mirror.submit(report.step, Path(report.path))
        self.collect()

    def collect(self) -> None:
        """Record what the mirror did since the last call, and keep its attempts for the judge."""
        for event in self.mirror.drain():
            record_mirror_event(self.book, self.subrun, event, self.mirror.location)
            if event.kind in ("uploaded", "failed"):
                self._observations.append(UploadObservation(event.step, event.time, event.kind == "uploaded",
                                                            event.error, event.pending))

    def read_uploads(self) -> list[UploadObservation]:
        """The attempts collected since the last call (the controller hands them to the judge)."""
        out, self._observations = self._observations, []
        return out


def submit_local_checkpoints(mirror: S3Mirror, save_dir: Path, up_to_step: int) -> None:
    """At a launch: the lineage's local checkpoints (at or before the sub-run's start) that
    may not be on S3 yet; one whose identical copy is there costs a few HEAD requests."""
    for path in list_checkpoints(save_dir):
        step = step_of(path)
        if step is not None and 0 < step <= up_to_step and verify_checkpoint(path, check_hashes=False)[0]:
            mirror.submit(step, path)


def settle_uploads(observer: MirrorObserver, judge: Judge, final: State, last_step: int, wait_s: float,
                   record_judgement: Callable[[State, Judgement], None], out: TextIO) -> tuple[int, ...]:
    """After the last sub-run: wait up to ``wait_s`` for the copies still pending, record
    them (and an outage's end) as during the run, and say which copies are missing."""
    pending = observer.mirror.finish(wait_s)
    observer.collect()
    now = observer.mirror.clock()
    for judgement in judge.judge_observations(observer.read_uploads(), now, last_step, check_silence=False):
        record_judgement(final, judgement)
    if pending:
        steps = ", ".join(str(step) for step in pending)
        line = (f"the S3 copies of checkpoint(s) {steps} are not verified after {wait_s:g} s: their local copies "
                f"are kept; the next `runmgr launch` of this run uploads them")
        observer.book.record_event(final.subrun, "checkpoint_upload_pending", line, {"steps": list(pending)})
        out.write(line + "\n")
    return pending


def upload_leftovers(mirror: S3Mirror, book: Logbook, save_dir: Path, wait_s: float, out: TextIO) -> None:
    """A finished run launched again: upload the local checkpoints whose copies an earlier
    launch could not verify (S3 was out at its end), recorded under its last sub-run."""
    last = book.lineage()[-1]
    observer = MirrorObserver(mirror, book)
    observer.subrun = last.id
    submit_local_checkpoints(mirror, save_dir, last.last_step or 0)
    if not mirror.pending_steps():
        return
    mirror.start()
    pending = mirror.finish(wait_s)
    observer.collect()
    if pending:
        out.write(f"the S3 copies of checkpoint(s) {', '.join(map(str, pending))} are still not verified after "
                  f"{wait_s:g} s; their local copies are kept\n")


def record_mirror_event(book: Logbook, subrun: str, event: MirrorEvent, location: str) -> None:
    """The logbook's view of one mirror event (a failed attempt is the watcher's business)."""
    if event.kind == "uploaded" and event.uploaded is not None:
        done = event.uploaded
        lag = max(0.0, event.time - done.committed_at) if done.committed_at is not None else event.upload_s
        verb = "already on S3" if done.already else f"uploaded in {event.upload_s:.1f} s"
        # A copy found complete at a launch is no upload: its lag would be the age of the checkpoint.
        book.record_event(
            subrun, "checkpoint_on_s3" if done.already else "checkpoint_uploaded",
            f"checkpoint {event.step} {verb} ({done.bytes} bytes, {done.files} files, {done.checked_by} verified; "
            f"{lag:.1f} s after its commit): {location}/step_{event.step:08d}",
            {"step": event.step, "seconds": lag, "bytes": done.bytes, "upload_seconds": event.upload_s,
             "attempts": event.attempts, "checked_by": done.checked_by, "already": done.already,
             "url": f"{location}/step_{event.step:08d}"},
            step=event.step)
    elif event.kind == "skipped":
        book.record_event(subrun, "checkpoint_upload_skipped", f"checkpoint {event.step} not mirrored: {event.error}",
                          {"step": event.step, "reason": event.error}, step=event.step)
    elif event.kind == "retired" and event.retired:
        steps = ", ".join(str(step) for step in event.retired)
        book.record_event(subrun, "checkpoint_copies_retired",
                          f"S3 copies of step(s) {steps} retired (past the start at step {event.step}): their "
                          f"manifests renamed manifest.retired-by-{subrun}.json",
                          {"steps": list(event.retired), "after_step": event.step})
