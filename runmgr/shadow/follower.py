"""Shadow mode: a live Megatron-LM or MindSpeed-LLM log judged as runmgr would judge the job if
it ran it, and nothing done about it.

Each poll takes the lines written since the last one (runmgr/shadow/lines.py), turns them into
the reports and observations a launched Megatron job's output becomes (the same translator,
runmgr/workers/megatron_output.py), and hands them to the same judge with the run's own watcher
and policy settings. The logbook gets what it gets for a launched run (sub-runs, metrics,
checkpoints, incidents, decisions, through the same writer) and, for every decision that would
have acted, a ``recommendation`` event: "not acted on", the plan as data and, for a job whose
arguments the config holds (``megatron.args``), the exact arguments runmgr would restart it
with. The first sub-run's start says it is a shadow run.

The followed job restarts by itself (its own launcher): an iteration going back, or a checkpoint
loaded after steps were seen, ends the sub-run and starts the next one. A decision that would
have ended the sub-run restarts the detectors instead (the job goes on; a persistent spike is
one incident, not one per line).

The follower's own restart (``kill -9`` included) loses nothing and repeats nothing: after each
poll's records are committed, it saves where the source stands (``shadow_state.json`` in the run
directory, written atomically). A new follower of the same run directory restores that position,
warms the judge with the open sub-run's recorded metrics (its detectors see the history they
saw) and drops what is already recorded: steps up to the last recorded one, incidents recorded
with the same kind and step.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

from logbook import Logbook
from runmgr.config.argv import flag_value
from runmgr.config.compose import recorded_config
from runmgr.config.schema import RunConfig
from runmgr.controller.group import GroupPoll, WorkerInfo
from runmgr.controller.judge import Judge
from runmgr.controller.judgement import Judgement
from runmgr.controller.states import Launching, Running
from runmgr.errors import UserError
from runmgr.megatron.flags import PlanNotCarried, checkpoint_step, script_args
from runmgr.megatron.flavors import abilities_of, job_abilities
from runmgr.notify.observer import NotifyObserver
from runmgr.observers.logbook_writer import LogbookObserver
from runmgr.policy.abilities import BUILTIN_ABILITIES, TrainerAbilities
from runmgr.policy.checkpoints import VerifiedCheckpoint
from runmgr.policy.plan_update import next_plan
from runmgr.shadow.lines import Line, LineSource
from runmgr.shadow.stops import stop_of
from runmgr.watch.megatron_log import MegatronLogReader
from runmgr.watch.trainer_log import TrainerLogReader
from runmgr.watch.observations import LoadedCheckpoint, StepObservation
from runmgr.workers.megatron_output import OutputTranslator
from trainer.manifest import checkpoint_dir
from trainer.plan import ResumePlan
from trainer.report import StepReport

STATE_FILE = "shadow_state.json"
"""In the run directory: where the followed source stands, saved after each poll's records."""
RANK = 0
"""The followed log speaks for the whole job: its lines are one rank's beats (Megatron prints on
rank 0 and the last rank only)."""
NOT_ACTED_ON = "not acted on (shadow)"


class ShadowStateError(UserError):
    """Where a previous follower stood cannot be read: one line."""


@dataclass
class _Subrun:
    """The open sub-run: its id, plan, reader and what it has recorded."""

    id: str
    plan: ResumePlan
    translator: OutputTranslator
    label: str = ""
    """What the judge calls the sub-run: its id, then ``ID+1``, ``ID+2`` ... after each decision that
    would have ended it (as a replay does): the job went on, and what follows is judged as the
    next sub-run runmgr would have started, not as part of one already ending."""
    last_step: Optional[int] = None
    """The last step recorded (or, after a follower's restart, recorded before it)."""
    incidents: set = field(default_factory=set)
    """(kind, step) of the incidents recorded: a restarted follower does not record them again."""
    continuations: int = 0


class Follower:
    """Follows one source into one logbook. ``poll()`` once per interval; ``close()`` at the end."""

    def __init__(self, config: RunConfig, source: LineSource, book: Logbook, clock: Callable[[], float],
                 observers: tuple = (), notify: Optional[NotifyObserver] = None, keeps_position: bool = True) -> None:
        """``observers``: more observers of the sub-runs, polls and judgements (the metrics exporter);
        ``notify``: told of each recommendation (and, as an observer, of the rest); ``keeps_position``
        false: no position file (a played-back log, which no follower resumes)."""
        self.keeps_position = keeps_position
        self.config = config
        self.source = source
        self.book = book
        self.clock = clock
        self.writer = LogbookObserver(book, {**recorded_config(config),
                                             "shadow": {"source": source.describe(), "acted_on": False}})
        self.notify = notify
        self.observers = (self.writer, *observers, *((notify,) if notify is not None else ()))
        self.args = list(config.megatron.args)
        self.checkpoints: dict[int, VerifiedCheckpoint] = {}
        # Nothing is carried out in shadow: every decision is a recommendation, none held (policy.act_on).
        self.judge = Judge(config.watcher, replace(config.policy, act_on=["all"]),
                           lambda max_step: [c for c in self.checkpoints.values() if c.step <= max_step],
                           abilities=self._abilities())
        self.subrun: Optional[_Subrun] = None
        self.recommendations = 0
        self._state_path = Path(book.run_dir) / STATE_FILE
        self._resume()

    # --- one poll ----------------------------------------------------------------------------

    def poll(self) -> list[Judgement]:
        """Take the new lines, record and judge them; the judgements of this poll."""
        judgements: list[Judgement] = []
        poll = GroupPoll()
        for at, line in self.source.take():
            stopping = stop_of(line)
            if stopping is not None and self.subrun is not None:
                # Stopped on purpose (its scheduler, a person): the silence that follows is no hang.
                judgements += self._judge(poll)
                poll = GroupPoll()
                self._end_subrun("stopped", f"the job was stopped ({stopping}); runmgr did nothing")
                continue
            if self.subrun is None:
                first = _parsed(at, line, self._translator("probe", ResumePlan(subrun="probe"), 0))
                if not (first.steps or first.observations or first.checkpoints):
                    continue  # the job's preamble (arguments, model building): nothing to judge yet
                self._start_subrun(first, f"shadow: following {self.source.describe()} ({NOT_ACTED_ON})")
            probe = _parsed(at, line, self.subrun.translator)
            if self._job_restarted(probe):
                judgements += self._judge(poll)
                poll = GroupPoll()
                self._end_subrun("restarting", "the job restarted by itself (its own launcher; runmgr did nothing)")
                self._start_subrun(probe, "the job restarted by itself (its own launcher)")
                probe = _parsed(at, line, self.subrun.translator)
            _merge(poll, self._new_only(probe))
        judgements += self._judge(poll)
        self._save_position()
        return judgements

    def next_silence_at(self) -> Optional[float]:
        """When the followed job's silence would first be a hang if no line came before (None:
        never, or no sub-run open): a replay of a recorded log polls then (runmgr/score)."""
        return self.judge.next_silence_at() if self.subrun is not None else None

    def _job_restarted(self, probe: GroupPoll) -> bool:
        """An iteration at or before the last one recorded, or a checkpoint loaded after steps (not
        the lines a killed follower had read past its last save: those are dropped)."""
        assert self.subrun is not None
        last = self.subrun.last_step
        if last is None:
            return False
        went_back = any(report.step <= last for report in probe.steps) and not self._catching_up
        loaded = any(isinstance(o, LoadedCheckpoint) for o in probe.observations)
        return went_back or loaded

    def _new_only(self, probe: GroupPoll) -> GroupPoll:
        """Drops steps already recorded: the lines a killed follower read after its last save."""
        assert self.subrun is not None
        if self._catching_up:
            last = self.subrun.last_step or 0
            if probe.steps and all(report.step <= last for report in probe.steps):
                return GroupPoll()
            if probe.steps:
                self._catching_up = False
        if probe.steps:
            self.subrun.last_step = max(report.step for report in probe.steps)
        return probe

    def _judge(self, poll: GroupPoll) -> list[Judgement]:
        """Record the poll, judge it (a poll without lines too: silences are judged), record the
        judgements and what each would have done."""
        if self.subrun is None:
            return []
        running = Running(self.subrun.id, self.subrun.plan, self.subrun.translator.start_step)
        for checkpoint in poll.checkpoints:
            self.checkpoints[checkpoint.step] = VerifiedCheckpoint(checkpoint.step, None)
        for observer in self.observers:
            observer.on_poll(running, poll)
        recorded = []
        for judgement in self._judged(poll, self.clock()):
            key = (judgement.incident.kind, judgement.incident.onset_step)
            if key in self.subrun.incidents:
                continue
            self.subrun.incidents.add(key)
            for observer in self.observers:
                observer.on_judgement(running, judgement)
            if judgement.decision.action != "ignore":
                self._recommend(judgement)
            recorded.append(judgement)
        return recorded

    def _judged(self, poll: GroupPoll, now: float) -> list[Judgement]:
        """The judge's judgements of ``poll``; after one that would have ended the sub-run, the job
        (which goes on) is judged as the next sub-run: one incident per condition, not one per line,
        and later incidents decided afresh rather than as part of a sub-run already ending."""
        assert self.subrun is not None
        judgements = self.judge.judge(self.subrun.label, poll, [], now, self.subrun.last_step or 0)
        if any(j.ends_subrun for j in judgements):
            self.subrun.continuations += 1
            self.subrun.label = f"{self.subrun.id}+{self.subrun.continuations}"
            start = self.subrun.last_step or 0
            self.subrun.translator = self._translator(self.subrun.label, ResumePlan(subrun=self.subrun.label), start)
            self.judge.restart_detectors({RANK: "followed job"})
            if poll.heartbeats:  # lines of this poll after the decision: the job is alive now, and silent from here
                judgements += self.judge.judge(self.subrun.label, GroupPoll(heartbeats=[poll.heartbeats[-1]]), [],
                                               now, self.subrun.last_step or 0)
        return judgements

    # --- recommendations ---------------------------------------------------------------------

    def _recommend(self, judgement: Judgement) -> None:
        assert self.subrun is not None
        decision = judgement.decision
        checkpoint = self._checkpoint_path(decision.restart_from_step)
        # The sub-run runmgr would have started (none after an abort): the label the judge now goes
        # on with (``ID+N``).
        plan = next_plan(self.subrun.plan, decision, self.subrun.label, checkpoint) if decision.restarts else None
        args, refused = self._restart_args(plan) if plan is not None else ([], None)
        where = f" from the checkpoint at step {decision.restart_from_step}" \
            if decision.restart_from_step is not None else ""
        how = f"; it would restart the job with: {shlex.join(args)}" if args else \
            (f"; {refused}" if refused else "")
        self.recommendations += 1
        text = f"{NOT_ACTED_ON}: runmgr would {decision.action}{where} ({judgement.incident.summary()}){how}"
        seq = self.book.record_event(
            self.subrun.id, "recommendation", text,
            {"acted_on": False, "action": str(decision.action), "reason": decision.reason,
             "incident_kind": judgement.incident.kind, "step": judgement.incident.onset_step,
             "restart_from_step": decision.restart_from_step, "start_checkpoint": checkpoint,
             "plan": plan.to_dict() if plan is not None else None, "script": self.config.megatron.script, "args": args,
             **({"not_carried": refused} if refused else {})},
            step=judgement.incident.onset_step)
        if self.notify is not None:
            self.notify.on_recommendation(self.subrun.id, judgement, text, about_seq=seq)

    def _checkpoint_path(self, step: Optional[int]) -> Optional[str]:
        """Megatron's ``iter_%07d`` under the job's ``--load`` (or ``--save``) directory; runmgr's
        own trainer's ``step_%08d`` under the conf's checkpoint directory."""
        if step is None:
            return None
        if not self.config.drives_megatron:
            return str(checkpoint_dir(self.config.checkpoint_dir(), step))
        folder = flag_value(self.args, "--load") or flag_value(self.args, "--save")
        return str(Path(folder) / f"iter_{step:07d}") if folder else f"iter_{step:07d}"

    def _restart_args(self, plan: ResumePlan) -> tuple[list[str], Optional[str]]:
        """The job's arguments with the plan's flags (empty when the config holds none), or why the
        job's flavor cannot carry the plan out."""
        if not self.args:
            return [], None
        try:
            return script_args(self.args, plan, self.config.megatron.flavor,
                               checkpoint_step(plan.start_checkpoint)), None
        except PlanNotCarried as refusal:
            return [], f"the job cannot carry it out: {refusal}"

    # --- sub-runs ----------------------------------------------------------------------------

    def _start_subrun(self, probe: GroupPoll, cause: str) -> None:
        loaded = [o.step for o in probe.observations if isinstance(o, LoadedCheckpoint)]
        first = min((report.step for report in probe.steps), default=None)
        start = loaded[0] if loaded else (max(0, first - 1) if first is not None else 0)
        subrun = self.book.next_subrun_id(self.config.run.number)
        plan = ResumePlan(subrun=subrun)
        evidence = {"shadow": True, "acted_on": False, "source": self.source.describe()}
        launching = Launching(subrun, plan, start, cause, evidence)
        for observer in self.observers:
            observer.on_transition(None, launching)
        self.subrun = _Subrun(subrun, plan, self._translator(subrun, plan, start), label=subrun)
        self.judge.start_subrun([WorkerInfo(RANK, 0, "followed job", "")], start_step=start)
        self._catching_up = False

    def _abilities(self) -> TrainerAbilities:
        """What the followed job could carry out: its Megatron flavor's (with its arguments), or
        runmgr's own trainer's."""
        if not self.config.drives_megatron:
            return BUILTIN_ABILITIES
        flavor = self.config.megatron.flavor
        return job_abilities(flavor, self.args) if self.args else abilities_of(flavor)

    def _translator(self, subrun: str, plan: ResumePlan, start: int) -> OutputTranslator:
        if not self.config.drives_megatron:  # runmgr's own trainer's lines (python -m trainer)
            return OutputTranslator(plan, (RANK,), TrainerLogReader(subrun), self.config.checkpoint_dir(),
                                    self.config.model.seq_length,
                                    start_step=start)
        seq = flag_value(self.args, "--seq-length")
        folder = flag_value(self.args, "--save")
        return OutputTranslator(plan, (RANK,), MegatronLogReader(subrun), Path(folder) if folder else None,
                                int(seq) if seq and seq.isdigit() else None, start_step=start)

    def _end_subrun(self, end_state: str, reason: str) -> None:
        assert self.subrun is not None
        self.book.end_subrun(self.subrun.id, end_state, self.subrun.last_step, reason)
        self.subrun = None

    def close(self, reason: Optional[str] = None) -> None:
        """The source ended (a stream closed): the open sub-run ends as ``stopped``. Without a
        reason the sub-run stays open for the next follower of this run directory."""
        if reason is not None and self.subrun is not None:
            self._end_subrun("stopped", reason)
        self._save_position()

    # --- the follower's own restart ----------------------------------------------------------

    def _save_position(self) -> None:
        if not self.keeps_position:
            return
        state = {"source": self.source.position(), "subrun": self.subrun.id if self.subrun else None}
        temporary = self._state_path.with_suffix(".tmp")
        temporary.write_text(json.dumps(state))
        os.replace(temporary, self._state_path)

    def _resume(self) -> None:
        """Go on where a previous follower of this run directory stopped: its source position,
        its open sub-run (the judge warmed with the sub-run's recorded steps) and its incidents."""
        self._catching_up = False
        if not self._state_path.exists():
            return
        try:
            state = json.loads(self._state_path.read_text())
        except (OSError, ValueError) as problem:  # written atomically: damaged by hand or by the disk
            raise ShadowStateError(f"{self._state_path} cannot be read ({problem}): remove it to follow the log "
                                   f"from its start into a new run.dir, or point run.dir elsewhere") from None
        self.source.restore(state.get("source", {}))
        if self.notify is not None:  # killed between recording a recommendation and sending it
            self.notify.resend_untold(self.book.events())
        lineage = self.book.lineage()
        if not lineage or not lineage[-1].is_open or lineage[-1].id != state.get("subrun"):
            return
        open_subrun = lineage[-1]
        plan = ResumePlan(subrun=open_subrun.id)
        self.subrun = _Subrun(open_subrun.id, plan, self._translator(open_subrun.id, plan, open_subrun.start_step),
                              label=open_subrun.id)
        self.judge.start_subrun([WorkerInfo(RANK, 0, "followed job", "")], start_step=open_subrun.start_step)
        self._warm_judge(open_subrun.id)
        self._catching_up = True

    def _warm_judge(self, subrun: str) -> None:
        """The detectors and the policy's history see the sub-run's recorded steps again (nothing
        is recorded); the incidents already recorded are remembered so that they are not recorded
        twice."""
        assert self.subrun is not None
        for checkpoint in (e for e in self.book.events() if e.get("type") == "checkpoint" and e["subrun"] == subrun):
            self.checkpoints[checkpoint["step"]] = VerifiedCheckpoint(checkpoint["step"], None)
        for row in (row for row in self.book.all_metrics() if row.get("subrun") == subrun):
            report = _report_of(self.subrun.label, row)
            poll = GroupPoll(steps=[report], observations=[_observation_of(self.subrun.label, row)])
            self.subrun.last_step = report.step
            self._judged(poll, row.get("time") or self.clock())
        for event in self.book.events():
            if event.get("type") == "incident" and event.get("subrun") == subrun:
                self.subrun.incidents.add((event["kind"], event.get("step")))


def _parsed(at: float, line: str, translator: OutputTranslator) -> GroupPoll:
    """What one line holds, as a poll's reports and observations."""
    poll = GroupPoll()
    translator.lines([(at, line)], poll)
    return poll


def _merge(into: GroupPoll, more: GroupPoll) -> None:
    for name in ("steps", "checkpoints", "heartbeats", "observations"):
        getattr(into, name).extend(getattr(more, name))


def _nan(value) -> float:
    return math.nan if value is None else float(value)


def _report_of(subrun: str, row: dict) -> StepReport:
    return StepReport(subrun=subrun, step=int(row["step"]), loss=_nan(row.get("loss")),
                      grad_norm=_nan(row.get("grad_norm")), lr=_nan(row.get("lr")),
                      loss_scale=_nan(row.get("loss_scale")), tokens=int(row.get("tokens") or 0),
                      consumed_samples=row.get("consumed_samples"), step_time=float(row.get("step_time") or 0.0),
                      compute_times=(), skipped=bool(row.get("skipped")), time=float(row.get("time") or 0.0))


def _observation_of(subrun: str, row: dict) -> StepObservation:
    return StepObservation(subrun=subrun, step=int(row["step"]), time=float(row.get("time") or 0.0),
                           loss=row.get("loss"), grad_norm=row.get("grad_norm"), lr=row.get("lr"),
                           loss_scale=row.get("loss_scale"), step_time=row.get("step_time"),
                           consumed_samples=row.get("consumed_samples"))
