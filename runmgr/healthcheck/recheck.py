"""Undoing exclusions: by hand (``runmgr health-check --readmit NODE ...``) and
by a re-check of the excluded machine itself (``--recheck-self``).

An excluded Kubernetes node carries runmgr's label (and maybe its taint), so
no Ray pod of a run lands there again and no fleet check ever looks at it:

* ``--readmit NODE ...`` clears our label, annotations and taint from those
  nodes (no one else's) and admits their exclusions in runmgr's own store
  (records whose Kubernetes node, or host name, is NODE), so that ``runmgr
  launch`` uses them again. It starts no Ray and probes nothing.
* ``--recheck-self`` runs where k8s/components/recheck-excluded's DaemonSet
  puts it: on an excluded node only, every few minutes. It checks this
  machine alone (a local Ray of one node) and judges it with
  :func:`health.fleet.decide_alone` against the fleet's figures kept on the
  node at exclusion (``runmgr.io/health-baseline``): a node excluded for being
  slow has no peers to be compared with now. With ``--k8s-label`` a node that
  passes loses its marks (and the DaemonSet controller then removes the pod);
  one that does not keeps them, with the latest reasons in its annotation.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from typing import Optional, TextIO

from runmgr.errors import UserError
from runmgr.healthcheck.node_task import K8S_NODE_ENV

EXIT_PASSED, EXIT_STILL_EXCLUDED, EXIT_K8S_REFUSED = 0, 1, 3
"""The codes of ``runmgr health-check`` (runmgr/healthcheck/command.py), in these modes' words."""

_MARK_NAMES = {"label": "label runmgr.io/health", "taint": "taint runmgr.io/unhealthy",
               "annotations": "annotations"}


def _say(err: TextIO):
    def say(line: str) -> None:
        err.write(line + "\n")
        err.flush()
    return say


def _stamp(now: float, what: str) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now)) + f"-{what}-{os.getpid()}"


def _readmit_stored(store, node_name: str, check_id: str, say) -> str:
    """Admit the node's stored exclusions; the clause saying so (a store that cannot be
    written is said on a line of its own: the Kubernetes marks are gone all the same)."""
    try:
        cleared = store.readmit([node_name], check_id, time.time(), source="recheck")
    except OSError as exc:
        say(f"recheck: the stored exclusions in {store.path} could not be updated ({exc})")
        return ""
    return _stored_clause(cleared.get(node_name, []), store.path)


def _stored_clause(cleared: list, store_path) -> str:
    if not cleared:
        return ""
    return f"; cleared {len(cleared)} stored exclusion(s) in {store_path} (runmgr launch uses it again)"


def cmd_readmit(args: argparse.Namespace, conf: str, overrides: list[str], out: TextIO = sys.stdout,
                err: TextIO = sys.stderr) -> int:
    """``--readmit NODE ...``: one line per node on stdout (or ``--json``); 0, or 3 with one
    line on stderr when the API refused a node (its marks and stored exclusions are kept)."""
    from runmgr.config.compose import load_run_config
    from runmgr.healthcheck.gate import store_for
    from runmgr.healthcheck.k8s import HEALTH_LABEL, check_node_names, core_api, readmit, readmit_refusal_line

    names = list(dict.fromkeys(args.readmit))
    check_node_names(names)
    store = store_for(load_run_config(conf, overrides, args.config_dir))
    done = readmit(core_api(args.k8s_host), names)
    answered = [d.node for d in done if d.outcome != "failed"]
    try:
        cleared = store.readmit(answered, _stamp(time.time(), "readmit"), time.time()) if answered else {}
        store_error = None
    except OSError as exc:
        cleared, store_error = {}, exc
    if args.json:
        out.write(json.dumps([{**d.to_dict(), "stored_exclusions_cleared": len(cleared.get(d.node, []))}
                              for d in done], indent=1) + "\n")
    for d in done if not args.json else ():
        stored = _stored_clause(cleared.get(d.node, []), store.path)
        if d.outcome == "readmitted":
            removed = ", ".join(_MARK_NAMES[m] for m in d.removed)
            out.write(f"{d.node}: readmitted: removed its {removed}{stored}\n")
        elif d.outcome == "no marks":
            out.write(f"{d.node}: had no marks (no {HEALTH_LABEL} label, taint or annotation of runmgr's)"
                      f"{stored}\n")
        elif d.outcome == "not found":
            out.write(f"{d.node}: not found: no Kubernetes node of that name{stored}\n")
        else:
            out.write(f"{d.node}: failed: {d.error}\n")
    out.flush()
    refused = readmit_refusal_line(done)
    if refused:
        print(f"runmgr: error: {refused}", file=sys.stderr)
        return EXIT_K8S_REFUSED
    if store_error is not None:
        raise UserError(f"--readmit: the Kubernetes marks were cleared, but the stored exclusions in {store.path} "
                        f"could not be ({store_error}): fix its permissions and readmit again")
    return EXIT_PASSED


def this_node(environ=os.environ) -> str:
    name = next((environ[k] for k in K8S_NODE_ENV if environ.get(k)), None)
    if not name:
        raise UserError("--recheck-self checks the Kubernetes node it runs on: set RUNMGR_K8S_NODE_NAME to it "
                        "(the downward API's spec.nodeName, as k8s/components/recheck-excluded does)")
    return name


def _refused(what: str, exc: BaseException, node: str) -> int:
    from runmgr.healthcheck.k8s import api_error_text

    print(f"runmgr: error: --recheck-self: the Kubernetes API refused to {what} node {node} ({api_error_text(exc)}): "
          "check --k8s-host and that the account may get and patch nodes", file=sys.stderr)
    return EXIT_K8S_REFUSED


def cmd_recheck_self(args: argparse.Namespace, conf: str, overrides: list[str], out: TextIO = sys.stdout,
                     err: TextIO = sys.stderr) -> int:
    """``--recheck-self``: this machine alone, judged against its node's baseline."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from runmgr import cluster as ray_cluster
    from runmgr.config.compose import load_run_config
    from runmgr.healthcheck.k8s import CHECK_ANNOTATION, REASON_ANNOTATION, core_api, marks_of

    node_name = this_node()
    config = load_run_config(conf, overrides, args.config_dir)
    # This machine alone, whatever cluster the run's config joins (k8s: address auto).
    config.cluster = replace(config.cluster, address=None, local_nodes=1)
    if args.stage:
        from runmgr.healthcheck.staging import check_stage_config

        check_stage_config(config.health.data)
    api = core_api(args.k8s_host)
    try:
        marks = marks_of(api.read_node(node_name))
    except ApiException as exc:
        if exc.status == 404:
            raise UserError(f"--recheck-self: there is no Kubernetes node {node_name} (RUNMGR_K8S_NODE_NAME): "
                            "it must name the node this runs on") from None
        return _refused("read", exc, node_name)
    except HTTPError as exc:
        return _refused("read", exc, node_name)
    say = _say(err)
    excluded_by = marks.annotations.get(CHECK_ANNOTATION)
    say(f"health-check: re-checking Kubernetes node {node_name} alone"
        + (f" (excluded by check {excluded_by}: {marks.annotations.get(REASON_ANNOTATION, '?')})"
           if excluded_by else " (it carries no exclusion of runmgr's)"))
    local = ray_cluster.connect(config.cluster)
    try:
        check, verdict = _check_alone(config, args, marks.baseline(), say)
    finally:
        ray_cluster.disconnect(local)
    return _conclude(check, verdict, config, args, api, node_name, marks, out, say)


def _check_alone(config, args: argparse.Namespace, baseline: Optional[dict], say):
    import ray

    from health.fleet import decide_alone
    from runmgr.healthcheck.fleet_run import run_fleet_check
    from runmgr.healthcheck.nodes import alive_nodes
    from runmgr.healthcheck.staging import stage_on_nodes
    from runmgr.placement import resolve_device_kind

    device_kind = resolve_device_kind(config.device, ray.cluster_resources())
    nodes = alive_nodes()
    staged = stage_on_nodes(nodes, config.health.data, say) if args.stage else {}
    check = run_fleet_check(config.health, device_kind, say, nodes=nodes, extra_findings=staged)
    verdicts = [decide_alone(report, baseline, config.health.fleet) for report in check.reports]
    check.verdicts = verdicts
    if baseline is None:
        check.notes.append("baseline: the node carries no runmgr.io/health-baseline: its speed was not compared")
    else:
        check.notes.append(f"baseline: the fleet's figures of check {baseline.get('check', '?')} "
                           f"({baseline.get('nodes', '?')} nodes, {baseline.get('hosts', '?')} hosts), same rule")
    worst = next((v for v in verdicts if v.verdict == "exclude"), verdicts[0])
    return check, worst


def _conclude(check, verdict, config, args: argparse.Namespace, api, node_name: str, marks, out: TextIO,
              say) -> int:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from runmgr.healthcheck.gate import store_for
    from runmgr.healthcheck.k8s import clear_marks, mark_excluded
    from runmgr.healthcheck.nodes import history_keys
    from runmgr.healthcheck.summary import render

    passed = verdict.verdict != "exclude"
    refused = None
    if args.k8s_label:
        try:
            if passed:
                removed = clear_marks(api, node_name)
                say(f"k8s: node {node_name}: " + (
                    f"readmitted: removed its {', '.join(_MARK_NAMES[m] for m in removed)}" if removed
                    else "had no marks") + _readmit_stored(store_for(config), node_name, check.check_id, say))
            elif marks.what():
                # Still bad: the label stays (and any taint); the reason says what this check found.
                mark_excluded(api, node_name, verdict.reasons, check.check_id)
                say(f"k8s: node {node_name}: still excluded (reasons of check {check.check_id} annotated)")
        except (ApiException, HTTPError) as exc:
            refused = exc
    else:
        say(f"k8s: node {node_name}: marks left as they are (no --k8s-label)")
    if args.json:
        from health.report import fleet_report

        report = fleet_report(check.reports, check.verdicts, check.started_at)
        report.update(check_id=check.check_id, k8s_node=node_name, recheck="passed" if passed else "failed",
                      notes=list(check.notes))
        out.write(json.dumps(report, indent=1, sort_keys=True) + "\n")
    else:
        out.write(render(check, history_keys(check.nodes), {}) + "\n")
        out.write(f"recheck: node {node_name} " + ("passed" if passed else f"still fails: {verdict.reasons[0]}")
                  + "\n")
    out.flush()
    if refused is not None:
        return _refused("patch", refused, node_name)
    return EXIT_PASSED if passed else EXIT_STILL_EXCLUDED
