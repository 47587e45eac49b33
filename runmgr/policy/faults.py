"""Rules for systems faults: hangs, worker deaths, device faults, stragglers, slowdowns.

All restart from the newest verified checkpoint (no margin: nothing is wrong
with the weights), spend the restart budget and pass the storm breaker.
Hardware takes the node out first (OPT drained nodes with ECC errors, lost
GPUs and bad links), within the exclusion budget.
"""

from __future__ import annotations

from collections.abc import Sequence

from runmgr.policy.checkpoints import VerifiedCheckpoint, newest
from runmgr.policy.config import PolicyConfig
from runmgr.policy.decision import ABORT, DUMP_AND_RESTART, EXCLUDE_NODE, IGNORE, RESTART, Decision
from runmgr.policy.guards import storm_abort
from runmgr.policy.history import History
from runmgr.watch.incidents import DEVICE_FAULT, HANG, SLOWDOWN, STRAGGLER, WORKER_DEATH, Incident


def decide_fault(incident: Incident, history: History, config: PolicyConfig,
                 checkpoints: Sequence[VerifiedCheckpoint]) -> Decision:
    """The decision for a non-instability incident."""
    if incident.kind == HANG:
        return _restart(incident, history, config, checkpoints, DUMP_AND_RESTART,
                        "dump every rank's stack, kill the workers and restart")
    if incident.kind == WORKER_DEATH:
        return _death(incident, history, config, checkpoints)
    if incident.kind == DEVICE_FAULT:
        return _exclude(incident, history, config, checkpoints, incident.nodes)
    if incident.kind == STRAGGLER:
        return _straggler(incident, history, config, checkpoints)
    if incident.kind == SLOWDOWN:
        if config.slowdown_action == RESTART:
            return _restart(incident, history, config, checkpoints, RESTART, "restart the job")
        return Decision(IGNORE, f"recorded: {_context(incident)} (policy.slowdown_action is ignore)")
    raise ValueError(f"no policy rule for incident kind {incident.kind!r}")


def _death(incident: Incident, history: History, config: PolicyConfig,
           checkpoints: Sequence[VerifiedCheckpoint]) -> Decision:
    category = str(incident.evidence.get("category", "unknown"))
    action = config.death_actions.get(category, RESTART)
    if action == ABORT:
        hint = incident.evidence.get("hint", "the worker's log")
        return Decision(ABORT, f"{_context(incident)}: a {category} failure does not go away by restarting "
                               f"(policy.death_actions.{category} = abort); a human must look at {hint}")
    if action == EXCLUDE_NODE and incident.nodes:
        return _exclude(incident, history, config, checkpoints, incident.nodes)
    return _restart(incident, history, config, checkpoints, RESTART,
                    f"restart the workers ({category} failure, on the same or replacement workers)")


def _straggler(incident: Incident, history: History, config: PolicyConfig,
               checkpoints: Sequence[VerifiedCheckpoint]) -> Decision:
    hw = config.hardware
    counts = {node: history.strikes(STRAGGLER, node, incident.time, hw.straggler_window_s) + 1
              for node in incident.nodes}
    repeat = tuple(node for node, count in counts.items() if count >= hw.straggler_strikes)
    tally = ", ".join(f"{node}: strike {count} of {hw.straggler_strikes}" for node, count in counts.items())
    if not repeat:
        return Decision(IGNORE, f"recorded ({tally or 'no node known'} within "
                                f"{hw.straggler_window_s:.0f} s): {_context(incident)}")
    return _exclude(incident, history, config, checkpoints, repeat, note=f" ({tally})")


def _exclude(incident: Incident, history: History, config: PolicyConfig,
             checkpoints: Sequence[VerifiedCheckpoint], nodes: Sequence[str], note: str = "") -> Decision:
    excluded = history.excluded_nodes()
    fresh = tuple(node for node in nodes if node not in excluded)
    if not fresh:
        return Decision(IGNORE, f"recorded: {_context(incident)}; {', '.join(nodes) or 'no node named'} "
                                f"already excluded")
    limit = config.hardware.max_excluded_nodes
    if len(excluded) + len(fresh) > limit:
        return Decision(ABORT, (
            f"{_context(incident)}: excluding {', '.join(fresh)} would take {len(excluded) + len(fresh)} nodes "
            f"out (budget {limit}; already out: {', '.join(excluded) or 'none'}). A human must look at the "
            f"fleet's health (runmgr health-check) before more nodes go"))
    return _restart(incident, history, config, checkpoints, EXCLUDE_NODE,
                    f"exclude {', '.join(fresh)}{note} and restart on the remaining nodes or a spare "
                    f"(data parallel shrinks, the global batch is kept by accumulation)", exclude=fresh)


def _restart(incident: Incident, history: History, config: PolicyConfig,
             checkpoints: Sequence[VerifiedCheckpoint], action: str, what: str,
             exclude: tuple[str, ...] = ()) -> Decision:
    used, limit = history.fault_restarts(), config.restarts.max_restarts
    if used >= limit:
        return Decision(ABORT, (
            f"{_context(incident)}: the restart budget is spent ({used} of {limit} restarts for deaths, hangs "
            f"and exclusions). A human must look at why the run keeps failing: "
            f"{incident.evidence.get('hint', 'the incidents in the logbook')}"))
    storm = storm_abort(incident, history, config, checkpoints)
    if storm is not None:
        return storm
    start = newest(checkpoints)
    origin = f"the newest verified checkpoint, step {start.step}" if start else "initialisation (no checkpoint)"
    return Decision(
        action, f"{_context(incident)} -> {what} from {origin} (restart {used + 1} of {limit})",
        restart_from_step=start.step if start else None, exclude_nodes=exclude,
        dump_stacks=action == DUMP_AND_RESTART,
    )


def _context(incident: Incident) -> str:
    """What happened, in the few numbers a reason needs."""
    evidence = incident.evidence
    nodes = f" on {', '.join(incident.nodes)}" if incident.nodes else ""
    ranks = ", ".join(str(r) for r in incident.ranks) or "?"
    if incident.kind == HANG and evidence.get("silent"):
        first = evidence["silent"][0]
        return (f"rank(s) {ranks}{nodes} silent for {first['silent_s']:.0f} s in phase {first['phase']} at step "
                f"{first['step']} (timeout {first['timeout_s']:.0f} s)")
    if incident.kind == WORKER_DEATH:
        return f"rank {ranks}{nodes} died of {evidence.get('cause')} ({evidence.get('category')})"
    if incident.kind == DEVICE_FAULT:
        return f"device fault {evidence.get('reason')}{nodes}, device {evidence.get('device')}"
    if incident.kind == SLOWDOWN:
        return (f"throughput {evidence.get('drop', 0):.0%} below the run's baseline "
                f"(threshold {evidence.get('max_drop', 0):.0%})")
    return f"{incident.kind} of rank(s) {ranks}{nodes}"
