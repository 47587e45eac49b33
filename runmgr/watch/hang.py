"""Hangs: a rank silent for longer than its phase ever takes.

Each rank's heartbeats say which phase it is in (init, step, checkpoint,
eval). The gap between two beats of a rank is a duration of the earlier beat's
phase; a phase's timeout is ``safety_factor`` x the longest recent duration,
clamped to the phase's bounds (the initial value until one is seen). The
durations are the lineage's: a new sub-run keeps what the earlier ones
measured (the same job, the same iteration times). A hang is reported once per
silence, for all ranks silent at that moment together, so that the remedy
(dump every stack, kill, restart) happens once.

A silence the sub-run's plan makes (:class:`runmgr.watch.silences.PlannedSilences`:
skipped iterations, evaluations, saves, the final save and teardown) widens
the window after the beat it follows, by what the measured times say it takes;
such a gap is not learned as a duration of its phase. A rank that finished
(exit 0) is never waited for again in its sub-run.

A beat may stand for a whole node (``HeartbeatObservation.for_node``: a node agent's
summary, its laggard rank's last beat); the detector then keeps one last beat per
node, so its work grows with nodes, and a silence names the laggard rank.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import Optional, Union

from runmgr.config.watcher import HangConfig
from runmgr.watch.incidents import HANG, Incident
from runmgr.watch.observations import HeartbeatObservation
from runmgr.watch.silences import PlannedSilences

STEP, CHECKPOINT = "step", "checkpoint"
Watched = Union[int, str]
"""A rank, or a node whose beats stand for its ranks."""
PHASES = ("init", "step", "checkpoint", "eval")


class HangDetector:
    """Learns phase durations from heartbeats and reports silent ranks."""

    def __init__(self, config: HangConfig, durations: Optional[dict[str, deque[float]]] = None) -> None:
        self.config = config
        self._durations: dict[str, deque[float]] = durations if durations is not None else {}
        self._last: dict[Watched, HeartbeatObservation] = {}
        """The last beat of each rank, or of each node whose beats stand for its ranks."""
        self._reported: set[Watched] = set()
        self._finished: set[int] = set()
        self._plan: Optional[PlannedSilences] = None
        self._subrun: Optional[str] = None
        """The sub-run of the beats in ``_last``."""
        self._oldest: list[tuple[float, int, Watched]] = []
        """Heap of (beat time, order, rank or node) of every beat taken; an entry whose rank or
        node has beaten since is dropped when it comes to the top. Its top is the oldest last beat,
        so that a check looks at every rank only when one may be silent (thousands beat each step)."""
        self._pushed = itertools.count()  # the order: ties in the heap never compare a rank with a node
        self._watched_as: dict[int, Watched] = {}
        """Where each rank's last beat is kept: under itself, or under its node (its laggard's beat)."""

    def for_new_subrun(self) -> "HangDetector":
        """A detector for the next sub-run's ranks that keeps the durations measured so far."""
        return HangDetector(self.config, self._durations)

    def expect(self, plan: PlannedSilences) -> None:
        """The silences the sub-run ``plan.subrun`` makes by plan."""
        self._plan = plan

    def update(self, beat: HeartbeatObservation, now: float) -> list[Incident]:
        """Feed one heartbeat, then check every rank against ``now``."""
        self.take(beat)
        return self.check(now)

    def take(self, beat: HeartbeatObservation) -> None:
        """Feed one heartbeat without checking: a poll's beats are taken together, then one
        :meth:`check` (a beat later in the batch may be the silent-looking rank's)."""
        if beat.subrun != self._subrun:
            # A new sub-run: ranks of the old one will never beat again.
            self._subrun = beat.subrun
            self._last = {r: b for r, b in self._last.items() if b.subrun == beat.subrun}
            self._reported.clear()
            self._finished.clear()
        if beat.rank in self._finished:
            return
        key = beat.watched_as
        previous = self._last.get(key)
        # A node's laggard may change from beat to beat: only one rank's own gaps are its phase's durations.
        if (previous is not None and previous.rank == beat.rank and beat.time >= previous.time
                and not self._planned_s(previous)[0]):
            seen = self._durations.setdefault(previous.phase, deque(maxlen=self.config.history))
            seen.append(beat.time - previous.time)
        self._last[key] = beat
        self._watched_as[beat.rank] = key
        heapq.heappush(self._oldest, (beat.time, next(self._pushed), key))
        self._reported.discard(key)

    def forget(self, rank: int) -> None:
        """Stop watching ``rank`` (it finished, or its worker is being replaced), and a node whose
        last beat was ``rank``'s (its agent sends the next laggard's while a rank of it runs)."""
        key = self._watched_as.pop(rank, rank)
        last = self._last.get(key)
        if last is not None and last.rank == rank:
            del self._last[key]
            self._reported.discard(key)

    def finish(self, rank: int) -> None:
        """``rank`` ended with exit 0: never wait for it again in this sub-run."""
        self.forget(rank)
        self._finished.add(rank)

    def timeout(self, phase: str) -> float:
        """Seconds of silence tolerated in ``phase``, learned and clamped."""
        bounds = self.config.bounds(phase)
        seen = self._durations.get(phase)
        if not seen:
            return bounds.initial_s
        return min(max(self.config.safety_factor * max(seen), bounds.min_s), bounds.max_s)

    def limit(self, beat: HeartbeatObservation, timeouts: Optional[dict[str, float]] = None) -> float:
        """Seconds of silence tolerated after ``beat``: its phase's timeout, widened by the
        silences the plan makes after it. ``timeouts``: the phases' timeouts, where a caller
        that asks for many beats keeps them."""
        if timeouts is None:
            return self.timeout(beat.phase) + self._planned_s(beat)[0]
        if beat.phase not in timeouts:
            timeouts[beat.phase] = self.timeout(beat.phase)
        return timeouts[beat.phase] + self._planned_s(beat)[0]

    def _planned_s(self, beat: HeartbeatObservation) -> tuple[float, list[str]]:
        """Extra seconds the plan's silences after ``beat`` take, and what they are."""
        plan = self._plan
        if plan is None or plan.subrun != beat.subrun:
            return 0.0, []
        extra, what = 0.0, []
        skipped = plan.skipped_after(beat.step)
        if skipped:
            extra += skipped * self._per_iteration_s()
            what.append(f"{skipped} skipped iteration(s)")
        if beat.phase == STEP and plan.evaluates_after(beat.step):
            extra += plan.eval_iters * self._per_iteration_s()
            what.append(f"an evaluation of {plan.eval_iters} iteration(s)")
        if beat.phase == STEP and plan.saves_after(beat.step):
            # The save's own line may come late or not at all: cover a save as measured.
            extra += self.timeout(CHECKPOINT)
            what.append("the final save and the job's teardown" if plan.is_final(beat.step) else "a save")
        return extra, what

    def _per_iteration_s(self) -> float:
        """A silent iteration's allowance: ``safety_factor`` x the longest step measured (the
        step's timeout until one is)."""
        seen = self._durations.get(STEP)
        return self.config.safety_factor * max(seen) if seen else self.timeout(STEP)

    def check(self, now: float) -> list[Incident]:
        """Report the ranks silent past their phase's timeout, once per silence."""
        shortest = self._shortest_s()
        if not self._may_be_silent(now, shortest):
            return []
        silent, timeouts = [], {}
        for key, beat in sorted(self._last.items(), key=lambda item: item[1].rank):
            if key in self._reported or now - beat.time <= shortest:
                continue
            limit = self.limit(beat, timeouts)
            if now - beat.time > limit:
                silent.append((beat, limit))
        if not silent:
            return []
        self._reported.update(beat.watched_as for beat, _ in silent)
        return [self._incident(silent, now)]

    def next_report_at(self) -> Optional[float]:
        """When :meth:`check` would first report a silence if no beat came before (None: it never
        would): a replay of a recorded log judges the silence then, as a live poll would have."""
        timeouts: dict[str, float] = {}
        return min((beat.time + self.limit(beat, timeouts) for key, beat in self._last.items()
                    if key not in self._reported), default=None)

    def _shortest_s(self) -> float:
        """No beat's silence is tolerated for less: the shortest timeout of the phases now (a
        planned silence only widens one; a phase never learned has its initial value)."""
        return min(self.timeout(phase) for phase in {*PHASES, *self._durations})

    def _may_be_silent(self, now: float, shortest: float) -> bool:
        """Whether the oldest last beat is older than the shortest timeout any phase has."""
        oldest = self._oldest
        while oldest:
            time, _, key = oldest[0]
            last = self._last.get(key)
            if last is not None and last.time == time:
                return now - time > shortest
            heapq.heappop(oldest)  # the rank beat since, or is no longer watched
        return False

    def _incident(self, silent: list[tuple[HeartbeatObservation, float]], now: float) -> Incident:
        first, limit = silent[0]
        learned = self._durations.get(first.phase, ())
        basis = (f"{self.config.safety_factor:g} x longest of {len(learned)} observed {first.phase} "
                 f"durations ({max(learned):.1f} s), clamped" if learned else "initial value, nothing observed yet")
        planned_s, planned = self._planned_s(first)
        if planned:
            basis += f", + {planned_s:.1f} s for {' and '.join(planned)} the plan makes"
        ranks = tuple(beat.rank for beat, _ in silent)
        # A node agent's beats name each node's laggard rank: the others of its node are silent too.
        who = f"{len(ranks)} node(s)" if first.for_node else f"{len(ranks)} rank(s)"
        description = (f"{who} silent in phase {first.phase}: rank {first.rank} for "
                       f"{now - first.time:.1f} s at step {first.step}, timeout {limit:.1f} s ({basis})")
        return Incident(
            kind=HANG, time=now, subrun=first.subrun, description=description,
            onset_step=min(beat.step for beat, _ in silent),
            ranks=ranks, nodes=tuple(sorted({beat.node for beat, _ in silent if beat.node})),
            evidence={"silent": [{"rank": b.rank, "node": b.node, "phase": b.phase, "step": b.step,
                                  "silent_s": now - b.time, "timeout_s": lim} for b, lim in silent],
                      "observed_durations": len(learned), "planned_silence_s": planned_s,
                      "planned_silences": planned},
        )
