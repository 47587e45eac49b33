"""``runmgr launch`` after its pre-flight (runmgr/preflight.py): lint, then (unless
``--dry-run``) the last refusals and the run handed to :mod:`runmgr.lineage`,
which connects and drives sub-runs until the run finishes or needs a person.
Re-running it on a run directory that holds a lineage resumes that lineage as
its next sub-run."""

from __future__ import annotations

import sys
from typing import TextIO

from runmgr import cluster as ray_cluster
from runmgr.preflight import PreparedLaunch
from runmgr.rehearsal import render_mapping
from runmgr.dryrun import build_plan, inspect_cluster, render_plan
from runmgr.refusals import refuse_changed_model_shape, refuse_unrunnable_plan
from runmgr.lint.gate import lint_before_launch, print_findings
from runmgr.metrics.server import MetricsServer


def launch(prepared: PreparedLaunch, out: TextIO | None = None) -> int:
    """The launch that passed its pre-flight (runmgr/preflight.py): lint, then the dry run's plan,
    or the run's last refusals and its lineage. ``out``: where it prints (None: the stdout of the
    moment, not the one at import)."""
    out = out if out is not None else sys.stdout
    config, rehearsal, request = prepared.config, prepared.rehearsal, prepared.request
    linted = lint_before_launch(config)  # a lint error: one line, exit 2, nothing written or started
    if request.dry_run:
        print_findings(linted, out)
        if rehearsal is not None:
            out.write(render_mapping(rehearsal) + "\n\n")
        # No Ray: a local one is known from the config, a remote one only asked whether it answers.
        out.write(render_plan(build_plan(config, inspect_cluster(config.cluster, connect=False))) + "\n")
        return 0
    # Before anything is written or started: a run that cannot start is one line, exit 2.
    ray_cluster.preflight(config.cluster)
    runs_this_conf = not config.job_describes_itself
    note = refuse_changed_model_shape(config) if runs_this_conf else None  # else the job's own args describe it
    # Every layout's capacity, node by node (a Megatron job's as its flags say); the built-in trainer's abilities.
    refuse_unrunnable_plan(config, request.conf, [*request.overrides, *(["--rehearse"] if request.rehearse else [])])
    print_findings(linted, out)
    if note:
        out.write(note + "\n")
    metrics = MetricsServer.start(config.metrics)  # an address it cannot take: one line, before anything is written
    from runmgr.lineage import run_in_dir  # Ray, the workers, S3: only for a run that starts

    try:
        return run_in_dir(config, request.config_with, out, metrics, linted, rehearsal)
    finally:
        if metrics is not None:
            metrics.close()
