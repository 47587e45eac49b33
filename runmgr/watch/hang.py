"""Hangs: a rank silent for longer than its phase ever takes.

Each rank's heartbeats say which phase it is in (init, step, checkpoint,
eval). The gap between two beats of a rank is a duration of the earlier beat's
phase; a phase's timeout is ``safety_factor`` x the longest recent duration,
clamped to the phase's bounds (the initial value until one is seen). A hang
is reported once per silence, for all ranks silent at that moment together,
so that the remedy (dump every stack, kill, restart) happens once.
"""

from __future__ import annotations

from collections import deque

from runmgr.config.watcher import HangConfig
from runmgr.watch.incidents import HANG, Incident
from runmgr.watch.observations import HeartbeatObservation


class HangDetector:
    """Learns phase durations from heartbeats and reports silent ranks."""

    def __init__(self, config: HangConfig) -> None:
        self.config = config
        self._durations: dict[str, deque[float]] = {}
        self._last: dict[int, HeartbeatObservation] = {}
        self._reported: set[int] = set()

    def update(self, beat: HeartbeatObservation, now: float) -> list[Incident]:
        """Feed one heartbeat, then check every rank against ``now``."""
        if any(seen.subrun != beat.subrun for seen in self._last.values()):
            # A new sub-run: ranks of the old one will never beat again.
            self._last = {r: b for r, b in self._last.items() if b.subrun == beat.subrun}
            self._reported.clear()
        previous = self._last.get(beat.rank)
        if previous is not None and beat.time >= previous.time:
            seen = self._durations.setdefault(previous.phase, deque(maxlen=self.config.history))
            seen.append(beat.time - previous.time)
        self._last[beat.rank] = beat
        self._reported.discard(beat.rank)
        return self.check(now)

    def forget(self, rank: int) -> None:
        """Stop watching ``rank`` (it finished, or its worker is being replaced)."""
        self._last.pop(rank, None)
        self._reported.discard(rank)

    def timeout(self, phase: str) -> float:
        """Seconds of silence tolerated in ``phase``, learned and clamped."""
        bounds = self.config.bounds(phase)
        seen = self._durations.get(phase)
        if not seen:
            return bounds.initial_s
        return min(max(self.config.safety_factor * max(seen), bounds.min_s), bounds.max_s)

    def check(self, now: float) -> list[Incident]:
        """Report the ranks silent past their phase's timeout, once per silence."""
        silent = []
        for rank, beat in sorted(self._last.items()):
            limit = self.timeout(beat.phase)
            if rank not in self._reported and now - beat.time > limit:
                silent.append((beat, limit))
        if not silent:
            return []
        self._reported.update(beat.rank for beat, _ in silent)
        first, limit = silent[0]
        learned = self._durations.get(first.phase, ())
        basis = (f"{self.config.safety_factor:g} x longest of {len(learned)} observed {first.phase} "
                 f"durations ({max(learned):.1f} s), clamped" if learned else "initial value, nothing observed yet")
        ranks = tuple(beat.rank for beat, _ in silent)
        description = (f"{len(ranks)} rank(s) silent in phase {first.phase}: rank {first.rank} for "
                       f"{now - first.time:.1f} s at step {first.step}, timeout {limit:.1f} s ({basis})")
        return [Incident(
            kind=HANG, time=now, subrun=first.subrun, description=description,
            onset_step=min(beat.step for beat, _ in silent),
            ranks=ranks, nodes=tuple(sorted({beat.node for beat, _ in silent if beat.node})),
            evidence={"silent": [{"rank": b.rank, "node": b.node, "phase": b.phase, "step": b.step,
                                  "silent_s": now - b.time, "timeout_s": lim} for b, lim in silent],
                      "observed_durations": len(learned)},
        )]
