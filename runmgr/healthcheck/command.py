"""``runmgr health-check [conf=NAME] [key=value ...]``: check every node of
the run's Ray cluster, print a table (or ``--json``), keep the exclusions
where ``runmgr launch`` reads them, with ``--stage`` first copy the dataset
to every node's local disk, and with ``--k8s-label`` mark the excluded
Kubernetes nodes (label and annotations; ``--k8s-taint`` adds a NoSchedule
taint).

Two more modes (runmgr/healthcheck/recheck.py): ``--readmit NODE ...`` clears
runmgr's marks from those Kubernetes nodes and their stored exclusions,
probing nothing; ``--recheck-self`` checks the machine it runs on alone (a
local Ray) against the fleet's figures kept when it was excluded, and with
``--k8s-label`` clears its marks when it passes (k8s/components/recheck-excluded).

Progress goes to stderr, the table or JSON to stdout. Exit codes: 0 every
node admitted (--readmit: every node answered; --recheck-self: it passed),
1 some node excluded (--recheck-self: still failing), 2 bad input, 3 the
Kubernetes API refused some of the calls (one line on stderr says how many
and why; the report has each node's error), 4 the local Ray started for the
check did not come up in Ray's time, try after try (a busy machine:
runmgr/cli.py's EXIT_RAY_START_TIMEOUT).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

DEFAULT_CONF = "demo"
EXIT_ALL_ADMITTED, EXIT_SOME_EXCLUDED, EXIT_K8S_REFUSED = 0, 1, 3


def add_parser(sub) -> None:
    """Register the subcommand on the ``runmgr`` parser's subparsers."""
    parser = sub.add_parser(
        "health-check", help="check every node (devices, ECC, compute, collectives, mounts, data, "
                             "versions) and keep the bad ones out of runs")
    parser.add_argument("items", nargs="*", metavar="[conf=NAME] key=value",
                        help=f"the run's config (default conf={DEFAULT_CONF}) and overrides, "
                             "e.g. health.storage.timeout_s=10")
    parser.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    parser.add_argument("--k8s-label", action="store_true",
                        help="label (runmgr.io/health=excluded) and annotate (why, which check) the Kubernetes "
                             "nodes of excluded Ray nodes, which runmgr's pods keep off; clear nodes admitted "
                             "again (see them: kubectl get nodes -L runmgr.io/health)")
    parser.add_argument("--k8s-taint", action="store_true",
                        help="with --k8s-label: also taint them runmgr.io/unhealthy:NoSchedule, which keeps "
                             "every other workload off them too")
    parser.add_argument("--readmit", nargs="+", default=None, metavar="NODE",
                        help="clear runmgr's label, annotations and taint from these Kubernetes nodes and their "
                             "stored exclusions (runmgr launch uses them again); probes nothing")
    parser.add_argument("--recheck-self", action="store_true",
                        help="check this machine alone (a local Ray) against the fleet's figures kept when its "
                             "Kubernetes node ($RUNMGR_K8S_NODE_NAME) was excluded; with --k8s-label clear "
                             "its marks when it passes (k8s/components/recheck-excluded runs it)")
    parser.add_argument("--k8s-host", default=None, metavar="URL",
                        help="Kubernetes API server (default: in-cluster, else ~/.kube/config)")
    parser.add_argument("--stage", action="store_true",
                        help="first copy health.data.shared_path to health.data.local_path on every node "
                             "(resumable, with a progress bar)")
    parser.add_argument("--config-dir", type=Path, default=None, help="directory of the configs (default: ./conf)")
    parser.set_defaults(func=cmd_health_check)


def split_items(items: list[str]) -> tuple[str, list[str]]:
    """(conf name, overrides); the demo's config when no ``conf=`` is given."""
    from runmgr.errors import UserError

    confs = [i.split("=", 1)[1] for i in items if i.startswith("conf=")]
    if len(confs) > 1:
        raise UserError("name at most one config, e.g. `runmgr health-check conf=run12`")
    return (confs[0] if confs else DEFAULT_CONF), [i for i in items if not i.startswith("conf=")]


def _progress(err: TextIO):
    def say(line: str) -> None:
        err.write(line + "\n")
        err.flush()
    return say


def check_modes(args: argparse.Namespace) -> None:
    """Refuse, with one line, flags that do not go together. ``--readmit`` takes every
    word after it, so ``key=value`` items given after it (never a node name: a name
    has no '=') go back to the config's items."""
    from runmgr.errors import UserError

    if args.readmit is not None:
        args.items = [*args.items, *(w for w in args.readmit if "=" in w)]
        args.readmit = [w for w in args.readmit if "=" not in w]
        if not args.readmit:
            raise UserError("--readmit needs the Kubernetes node(s) to readmit, e.g. "
                            "`runmgr health-check --readmit gpu-07` (see `kubectl get nodes -L runmgr.io/health`)")
        extra = [flag for flag, given in (("--k8s-label", args.k8s_label), ("--k8s-taint", args.k8s_taint),
                                          ("--stage", args.stage), ("--recheck-self", args.recheck_self)) if given]
        if extra:
            raise UserError(f"--readmit clears marks by hand and checks nothing: drop {extra[0]}")
        return
    if args.k8s_taint and not args.k8s_label:
        raise UserError("--k8s-taint needs --k8s-label: the taint goes with the label on the nodes it excludes "
                        "(`runmgr health-check --k8s-label --k8s-taint`)")
    if args.recheck_self and args.k8s_taint:
        raise UserError("--recheck-self keeps or clears the marks its node already has: drop --k8s-taint")


def cmd_health_check(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    from runmgr import cluster as ray_cluster
    from runmgr.config.compose import load_run_config

    check_modes(args)
    conf, overrides = split_items(args.items)
    if args.readmit:
        from runmgr.healthcheck.recheck import cmd_readmit

        return cmd_readmit(args, conf, overrides, out, err)
    if args.recheck_self:
        from runmgr.healthcheck.recheck import cmd_recheck_self

        return cmd_recheck_self(args, conf, overrides, out, err)
    config = load_run_config(conf, overrides, args.config_dir)
    if args.stage:
        from runmgr.healthcheck.staging import check_stage_config

        check_stage_config(config.health.data)
    api = None
    if args.k8s_label:
        from runmgr.healthcheck.k8s import core_api

        api = core_api(args.k8s_host)  # before the probes: a bad API setup fails fast
    ray_cluster.preflight(config.cluster)
    say = _progress(err)
    say(f"health-check: connecting to {config.cluster.address or 'a local Ray started for the check'}")
    local_nodes = ray_cluster.connect(config.cluster)
    try:
        return _check(config, args, api, out, say)
    finally:
        ray_cluster.disconnect(local_nodes)


def _check(config, args: argparse.Namespace, api, out: TextIO, say) -> int:
    import ray

    from runmgr.healthcheck.gate import check_and_record, store_for
    from runmgr.healthcheck.nodes import rank_nodes
    from runmgr.healthcheck.staging import stage_on_nodes
    from runmgr.healthcheck.summary import render
    from runmgr.placement import resolve_device_kind

    store = store_for(config)
    device_kind = resolve_device_kind(config.device, ray.cluster_resources())
    nodes = rank_nodes(config.cluster, device_kind)
    staged = stage_on_nodes(nodes, config.health.data, say) if args.stage else {}
    check, report, path = check_and_record(config.health, device_kind, store, "health-check", say,
                                           nodes=nodes, extra_findings=staged)
    refused = None
    if api is not None:
        from runmgr.healthcheck.k8s import apply_health_labels, refusal_line

        actions = apply_health_labels(report, api, say, taint=args.k8s_taint)
        report["k8s"] = [a.to_dict() for a in actions]
        store.save_report(check.check_id, report)
        refused = refusal_line(actions)
    if args.json:
        out.write(json.dumps(report, indent=1, sort_keys=True) + "\n")
    else:
        keys = {entry["node"]: entry["history_key"] for entry in report["nodes"]}
        out.write(render(check, keys, store.lemons()) + "\n")
        out.write(f"report: {path}\nexclusions: {store.path} (runmgr launch honours them)\n")
    out.flush()
    if refused:
        # The labels are what keeps the scheduler off bad nodes: not applying them is a failure.
        print(f"runmgr: error: {refused}", file=sys.stderr)
        return EXIT_K8S_REFUSED
    return EXIT_SOME_EXCLUDED if check.excluded else EXIT_ALL_ADMITTED
