"""Writes the run's history into the logbook as the controller moves:
sub-run starts and ends, incidents and decisions, metrics and checkpoints.
The driver is the logbook's only writer, and this is the only place it writes."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from logbook import Logbook
from runmgr.controller.judgement import Judgement
from runmgr.controller.states import AwaitingApproval, Failed, Finished, Launching, Restarting, Running, State
from runmgr.controller.group import GroupPoll, WorkerInfo
from runmgr.stacks import stacks_dir
from runmgr.watch.observations import RefusedValue

REFUSALS_PER_FIELD = 5
"""Refused values of one field recorded one by one in a sub-run; past them they are counted, and
the count recorded when the sub-run ends (a job that prints nothing but garbage would otherwise
write an event per line)."""


WORKERS_LISTED = 64
"""Up to this many workers, a sub-run's start records each (rank, pid, node, address); past
it, each node's ranks and address: at 16,384 ranks and a restart every few hours a list per
sub-run would make most of the logbook (the live list with pids is in the status file)."""


def workers_record(workers: Sequence[WorkerInfo]) -> dict:
    """A sub-run's workers for its ``workers_started`` event."""
    if len(workers) <= WORKERS_LISTED:
        return {"workers": [w.to_dict() for w in workers]}
    nodes: dict[str, dict] = {}
    for worker in workers:
        nodes.setdefault(worker.node_id, {"node_ip": worker.node_ip, "ranks": []})["ranks"].append(worker.rank)
    for entry in nodes.values():
        entry["ranks"] = rank_ranges(entry["ranks"])
    return {"worker_count": len(workers), "nodes": nodes}


def rank_ranges(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 9]`` -> ``"0-3,9"``."""
    parts: list[str] = []
    ordered = sorted(ranks)
    start = previous = ordered[0]
    for rank in ordered[1:] + [None]:
        if rank is not None and rank == previous + 1:
            previous = rank
            continue
        parts.append(f"{start}-{previous}" if previous > start else str(start))
        if rank is not None:
            start = previous = rank
    return ",".join(parts)


def metric_row(report) -> dict:
    return {
        "step": report.step, "loss": report.loss, "grad_norm": report.grad_norm, "lr": report.lr,
        "loss_scale": report.loss_scale, "tokens": report.tokens, "consumed_samples": report.consumed_samples,
        "tokens_per_s": tokens_per_s(report), "step_time": report.step_time, "time": report.time,
        "skipped": report.skipped, "mfu": getattr(report, "mfu", None),
        "peak_memory_bytes": max(getattr(report, "peak_memory_bytes", ()) or (0,)) or None,
    }


def tokens_per_s(report) -> float:
    """The report's own figure, else global tokens over rank 0's step time."""
    own = getattr(report, "tokens_per_s", None)
    if own is not None:
        return own
    return report.tokens / report.step_time if report.step_time > 0 else 0.0


def describe_start(start) -> str:
    """One line: what the optimizer really starts with (OPT 12.35's lesson)."""
    first = start.optimizer[0] if start.optimizer else {}
    fresh = all(g.get("step", 0) == 0 for g in start.optimizer)
    state = "fresh Adam state (step 0, zero moments)" if fresh else f"Adam state at step {first.get('step')}"
    layout = getattr(start, "layout", "")
    split = (f"; layout {layout}, {start.accumulation_steps} micro-batch(es) per replica per step"
             if layout else "")
    return (f"effective optimizer at step {start.start_step}: betas {tuple(first.get('betas', ()))}, "
            f"eps {first.get('eps')}, lr scale {start.lr_scale:g}, clip {start.clip_grad:g}, {state}{split}")


def describe_command(command: dict) -> str:
    """One line a person can paste into a shell on that node: the environment runmgr set, then the command
    (secrets already masked by whoever built it)."""
    env = " ".join(f"{key}={shlex.quote(str(value))}" for key, value in sorted(command.get("env", {}).items()))
    argv = " ".join(shlex.quote(str(arg)) for arg in command.get("argv", ()))
    return f"node {command.get('node_rank', '?')}: {env + ' ' if env else ''}{argv}"


def record_stop(book: Logbook, reason: str, end_state: str = "stopped") -> tuple[str, int] | None:
    """End the open sub-run as ``stopped`` (a person asked for it; ``failed`` when
    the driver had to stop it, e.g. on a full disk), at the furthest step
    recorded; (sub-run, step), or None when none was open."""
    lineage = book.lineage()
    if not lineage or not lineage[-1].is_open:
        return None
    subrun = lineage[-1].id
    step = book.reached_step(subrun)
    book.end_subrun(subrun, end_state, step, reason)
    return subrun, step


def record_stacks(book: Logbook, subrun: str) -> None:
    """Say where the stacks dumped before a sub-run's ranks were killed are."""
    where = stacks_dir(book.run_dir, subrun).resolve()
    files = sorted(path.name for path in where.glob("*.txt"))
    if files:
        book.record_event(subrun, "stacks_dumped", f"stack of every rank in {where}/ ({', '.join(files)})",
                          {"dir": str(where), "files": files})


def record_lint(book: Logbook, subrun: str, lint: dict | None) -> None:
    """The launch's lint (runmgr/lint): one ``lint`` event per warning, one ``lint_ignored``
    per rule ``lint.ignore`` silenced, with the finding it silenced (None: it did not fire)."""
    if not lint:
        return
    for finding in lint.get("warnings", []):
        book.record_event(subrun, "lint", f"lint warning {finding['rule']}: {finding['message']}", finding)
    for entry in lint.get("ignored", []):
        fired = entry.get("silenced")
        note = f": {fired['message']}" if fired else " (it did not fire)"
        book.record_event(subrun, "lint_ignored", f"lint rule {entry['rule']} ignored (lint.ignore){note}", entry)


def record_rehearsal(book: Logbook, subrun: str, mapping: dict | None) -> None:
    """A rehearsal's sub-run (``runmgr launch --rehearse``): one ``rehearsal`` event naming the run it
    rehearses, with every key of the mapping (real value, rehearsal value, why) as its data."""
    if not mapping:
        return
    scaled = [row for row in mapping["rows"] if row["real"] != row["rehearsal"]]
    shown = ", ".join(f"{row['key']} {row['real']} -> {row['rehearsal']}" for row in scaled
                      if row["key"].split(".")[0] in ("parallel", "data-parallel size", "model", "training")
                      and row["key"] != "model.max_position_embeddings")
    book.record_event(subrun, "rehearsal",
                      f"a rehearsal of {mapping['of']}: {len(scaled)} settings scaled ({shown}; ...), "
                      f"{len(mapping['rows']) - len(scaled)} kept; `runmgr logbook events` lists every one",
                      mapping)


class RefusalLog:
    """The values a job printed that the reader refused (runmgr/watch/megatron_log.py), as
    ``refused_value`` events: the first REFUSALS_PER_FIELD of each field per sub-run, then one
    ``refused_values`` event with how many more there were."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], int] = {}

    def record(self, book: Logbook, refused: RefusedValue) -> None:
        key = (refused.subrun, refused.field)
        self._counts[key] = count = self._counts.get(key, 0) + 1
        if count <= REFUSALS_PER_FIELD:
            book.record_event(refused.subrun, "refused_value",
                              f"refused {refused.field} {refused.raw!r} ({refused.reason}) in: {refused.line}",
                              {"field": refused.field, "raw": refused.raw, "reason": refused.reason,
                               "line": refused.line})

    def close(self, book: Logbook, subrun: str) -> None:
        """Record how many refusals of each field went uncounted in ``subrun``."""
        for (seen_in, name), count in sorted(self._counts.items()):
            if seen_in == subrun and count > REFUSALS_PER_FIELD:
                book.record_event(subrun, "refused_values",
                                  f"{count - REFUSALS_PER_FIELD} more values of {name} refused (not recorded one "
                                  f"by one; {count} in all)", {"field": name, "count": count})
        self._counts = {key: n for key, n in self._counts.items() if key[0] != subrun}


class LogbookObserver:
    """Turns transitions and judgements into logbook rows."""

    def __init__(self, book: Logbook, config: dict) -> None:
        self.book = book
        self.config = config
        self.refusals = RefusalLog()

    def on_transition(self, old: State | None, new: State) -> None:
        if isinstance(new, (Restarting, Finished, Failed)):
            self.refusals.close(self.book, new.subrun)
        if isinstance(new, Launching):
            self._start(new)
        elif isinstance(new, Running) and new.declined is not None:
            held = old.judgement if isinstance(old, AwaitingApproval) else None
            what = f" {held.decision.action} for the {held.incident.summary()}" if held else ""
            self.book.record_event(new.subrun, "declined", f"{new.declined.by} declined{what}; the run goes on",
                                   {"by": new.declined.by, "at": new.declined.at})
        elif isinstance(new, Running):
            self.book.record_event(new.subrun, "workers_started", f"{len(new.workers)} workers started",
                                   workers_record(new.workers))
        elif isinstance(new, AwaitingApproval):
            incident, decision = new.judgement.incident, new.judgement.decision
            self.book.record_event(
                new.subrun, "awaiting_approval",
                f"held for a person (policy.act_on): runmgr would {decision.action} for the {incident.summary()}; "
                f"`runmgr approve RUN` carries it out, `runmgr decline RUN` goes on without it",
                {"action": str(decision.action), "incident_kind": str(incident.kind)}, step=incident.onset_step)
        elif isinstance(new, Restarting):
            decision = new.judgement.decision
            if new.approval is not None:
                self.book.record_event(new.subrun, "approved",
                                       f"{new.approval.by} approved {decision.action}: carried out now",
                                       {"by": new.approval.by, "at": new.approval.at, "action": str(decision.action)})
            record_stacks(self.book, new.subrun)
            self.book.end_subrun(new.subrun, "restarting", new.last_step, f"{decision.action}: {new.judgement.incident.summary()}")
        elif isinstance(new, Finished):
            self.book.end_subrun(new.subrun, "finished", new.last_step, f"trained to step {new.last_step}")
        elif isinstance(new, Failed):
            record_stacks(self.book, new.subrun)
            self.book.record_event(new.subrun, "needs_human", new.reason, {"last_step": new.last_step})
            self.book.end_subrun(new.subrun, "failed", new.last_step, new.reason)

    def on_judgement(self, state: Running, judgement: Judgement) -> None:
        incident, decision = judgement.incident, judgement.decision
        incident_id = self.book.record_incident(
            state.subrun, incident.kind, incident.summary(), incident.to_dict(), step=incident.onset_step,
            ranks=incident.ranks, nodes=incident.nodes,
        )
        self.book.record_decision(state.subrun, incident_id, decision.action, decision.reason, decision.to_dict())

    def _start(self, new: Launching) -> None:
        self.book.start_subrun(new.subrun, new.cause, new.evidence, new.plan.start_checkpoint, new.start_step,
                               new.plan.to_dict(), self.config)
        for path, reason in new.evidence.get("rejected_checkpoints", []):
            self.book.record_event(new.subrun, "checkpoint_rejected", f"checkpoint {path} rejected: {reason}",
                                   {"path": path, "reason": reason})
        record_lint(self.book, new.subrun, new.evidence.get("lint"))
        record_rehearsal(self.book, new.subrun, new.evidence.get("rehearsal"))
        record_replacements(self.book, new.subrun, new.evidence)
        if new.evidence.get("driver_restarted"):
            previous = new.evidence["previous_subrun"]
            self.book.record_event(new.subrun, "driver_restarted", (
                f"driver restarted: sub-run {previous} was left open by its driver; resumed at step "
                f"{new.start_step} ({new.evidence['steps_lost']} step(s) lost past the last verified checkpoint)"),
                {"previous_subrun": previous, "resumed_step": new.start_step,
                 "steps_lost": new.evidence["steps_lost"]}, step=new.start_step)
        if new.evidence.get("fetched_from"):
            source = new.evidence["fetched_from"]
            self.book.record_event(new.subrun, "checkpoint_downloaded",
                                   f"checkpoint {new.start_step} downloaded from {source} and verified",
                                   {"step": new.start_step, "source": source, "path": new.plan.start_checkpoint},
                                   step=new.start_step)

    def on_poll(self, state: Running, poll: GroupPoll) -> None:
        for command in poll.commands:
            self.book.record_event(state.subrun, "command", describe_command(command), command)
        for start in poll.starts:
            self.book.record_event(state.subrun, "effective_settings", describe_start(start), start.to_dict(),
                                   step=start.start_step)
        for norms in poll.local_norms:  # before the metrics: a reader that sees a step sees its norms
            self.book.record_local_norms(state.subrun, norms.step, norms.norms)
        if poll.steps:
            self.book.record_metrics(state.subrun, [metric_row(r) for r in poll.steps])
        for ckpt in poll.checkpoints:
            self.book.record_checkpoint(state.subrun, ckpt.step, ckpt.path, ckpt.seconds)
        for event in poll.spare_events:
            self.book.record_event(state.subrun, event.kind, event.text, event.to_dict())
        for observation in poll.observations:
            if isinstance(observation, RefusedValue):
                self.refusals.record(self.book, observation)


def record_replacements(book: Logbook, subrun: str, evidence: dict) -> None:
    """The excluded nodes the cluster was asked to replace before ``subrun`` started
    (``node_replaced``, or ``node_replacement_refused`` with the API's answer), and how
    the wait for their room ended (``replacement_wait``)."""
    for request in evidence.get("replacements", []):
        kind = "node_replaced" if request["requested"] else "node_replacement_refused"
        book.record_event(subrun, kind, f"node {request['node']}: {request['detail']}", request)
    wait = evidence.get("replacement_wait")
    if wait:
        ended = "timed out" if wait["timed_out"] else "room there"
        book.record_event(subrun, "replacement_wait",
                          f"waited {wait['waited_s']:.0f} s for {wait['ranks']} rank(s) of room: {ended} "
                          f"({wait['held']} held)", wait)


def record_injection(book: Logbook, injection) -> None:
    """A chaos injection goes into the logbook next to the incidents it causes."""
    book.record_event(injection.subrun, "chaos", injection.summary(), injection.to_dict(), step=injection.step)
