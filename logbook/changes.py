"""What changed from one sub-run to the next, as short phrases a person
reads at a glance: config keys, plan settings (skip ranges, LR scale,
clipping, an Adam reset) and nodes taken out. Pure functions over plain data."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from logbook.textfmt import value_text

NEUTRAL_PLAN = {"skip_ranges": [], "lr_scale": 1.0, "rewarmup_iters": 0, "clip_grad": None,
                "reset_optimizer": False}
"""Plan settings that change nothing; a first sub-run's plan is compared to these."""
_NOT_CHANGES = ("subrun", "start_checkpoint", "avoid_nodes", "data_parallel_size", "local_norms_steps")
"""Plan keys shown elsewhere: on the start line (they differ every time), as
"excluded node" (the nodes to avoid), or in their own words below (data parallel, local norms)."""


def skip_ranges(plan: Mapping[str, Any]) -> list[tuple[int, int]]:
    """The plan's skip ranges as ``(start, end)`` pairs of stream positions."""
    if not isinstance(plan, Mapping):
        return []
    return [(int(start), int(end)) for start, end in plan.get("skip_ranges") or ()]


def range_text(start: int, end: int) -> str:
    """``samples [3200, 3328)`` — a half-open range of stream positions."""
    return f"samples [{start}, {end})"


def plan_changes(before: Mapping[str, Any], after: Mapping[str, Any], clip_default: Any = None) -> list[str]:
    """Phrases for the plan settings that ``after`` changed relative to ``before``.

    ``before`` is the previous sub-run's plan (empty for the first one, then
    compared to :data:`NEUTRAL_PLAN`); ``clip_default`` is the config's
    clipping threshold, the old value of a first clipping override. An Adam
    reset and a re-warmup apply to one restart, so they are news whenever set.
    """
    old = {**NEUTRAL_PLAN, **before}
    phrases = []
    added = [r for r in skip_ranges(after) if r not in skip_ranges(old)]
    if added:
        phrases.append("skip " + ", ".join(range_text(*r) for r in added))
    if after.get("lr_scale", 1.0) != old["lr_scale"]:
        phrases.append(f"LR scale {_number(old['lr_scale'])} → {_number(after.get('lr_scale', 1.0))}")
    if after.get("clip_grad") != old["clip_grad"]:
        was = old["clip_grad"] if old["clip_grad"] is not None else clip_default
        now = after.get("clip_grad") if after.get("clip_grad") is not None else clip_default
        phrases.append(f"clip {_number(was)} → {_number(now)}")
    if before.get("data_parallel_size") and after.get("data_parallel_size") != before["data_parallel_size"]:
        phrases.append(f"data parallel {before['data_parallel_size']} → {after.get('data_parallel_size')}")
    asked = sorted(set(after.get("local_norms_steps") or ()) - set(old.get("local_norms_steps") or ()))
    if asked:
        phrases.append(f"local norms on steps {asked[0]}–{asked[-1]}")
    if after.get("reset_optimizer"):
        phrases.append("Adam reset")
    if after.get("rewarmup_iters"):
        phrases.append(f"re-warmup {after['rewarmup_iters']} steps")
    for key in sorted(set(old) | set(after)):
        if key in NEUTRAL_PLAN or key in _NOT_CHANGES or old.get(key) == after.get(key):
            continue
        if key not in before and not after.get(key):
            continue  # a neutral setting on its first appearance is no news
        phrases.append(f"{key} {value_text(old.get(key, '(unset)'))} → {value_text(after.get(key, '(unset)'))}")
    return phrases


def config_changes(diff: Mapping[str, Any]) -> list[str]:
    """``optim.lr 0.0003 → 0.00015`` for each key of a recorded config diff."""
    return [f"{key} {_config_value(old)} → {_config_value(new)}" for key, (old, new) in diff.items()]


def node_changes(evidence: Mapping[str, Any], previous_evidence: Optional[Mapping[str, Any]]) -> list[str]:
    """Nodes this start left out that the previous one did not (policy or health check)."""
    before = set(_excluded(previous_evidence or {}))
    new = [node for node in _excluded(evidence) if node not in before]
    if not new:
        return []
    return [f"excluded {'nodes' if len(new) > 1 else 'node'} {', '.join(str(n) for n in new)}"]


def _excluded(evidence: Mapping[str, Any]) -> list[str]:
    nodes = list(evidence.get("excluded_nodes") or ())
    health = evidence.get("health")
    if isinstance(health, Mapping):
        nodes += [n for n in (health.get("excluded") or ()) if n not in nodes]
    return [n if isinstance(n, str) else value_text(n) for n in nodes]


def _number(value: Any) -> str:
    if value is None:
        return "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _config_value(value: Any) -> str:
    return "(unset)" if value is None else value_text(value)


def health_fact(evidence: Mapping[str, Any]) -> Optional[str]:
    """The launch gate's verdict in one phrase (the report itself is in the run dir)."""
    health = evidence.get("health")
    if not isinstance(health, Mapping):
        return None
    summary = health.get("summary") if isinstance(health.get("summary"), Mapping) else {}
    excluded = len(health.get("excluded") or ())
    if health.get("skipped"):
        kept_out = f"; {excluded} node(s) kept out by the last check" if excluded else ""
        return f"health check skipped{kept_out}"
    counts = [f"{summary[key]} {word}" for key, word in
              (("admit", "admitted"), ("warn", "warned"), ("exclude", "excluded")) if summary.get(key)]
    nodes = summary.get("nodes")
    head = f"health check: {nodes} node{'s' if nodes != 1 else ''}" if nodes is not None else "health check"
    return head + (f", {', '.join(counts)}" if counts else "")
