"""``runmgr launch``: compose, check, then (unless ``--dry-run``) hand the run
to :mod:`runmgr.lineage`, which connects and drives sub-runs until the run
finishes or needs a person. Re-running it on a run directory that holds a
lineage resumes that lineage as its next sub-run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from runmgr import cluster as ray_cluster
from runmgr.config.compose import load_run_config
from runmgr.rehearsal import Mapping, load_rehearsal, refuse_rehearse_settings, render_mapping
from runmgr.config.schema import RunConfig
from runmgr.megatron.job import aligned
from runmgr.dryrun import build_plan, inspect_cluster, render_plan
from runmgr.refusals import refuse_changed_model_shape, refuse_unrunnable_plan
from runmgr.lint.gate import lint_before_launch, print_findings
from runmgr.metrics.server import MetricsServer
from trainer.data import check_data_path


def load_config(conf_name: str, overrides: list[str], conf_dir: Path | None) -> RunConfig:
    """The checked config; for a Megatron job, with the iterations, batch sizes and checkpoint
    directory its arguments say (they are the truth runmgr's progress and arithmetic read)."""
    config = load_run_config(conf_name, overrides, conf_dir)
    return aligned(config)


def launch_config(conf_name: str, overrides: list[str], conf_dir: Path | None,
                  rehearse: bool = False) -> tuple[RunConfig, Mapping | None]:
    """The config a launch runs: the conf's, or with ``rehearse`` its rehearsal and how it maps
    to the real plan (runmgr/rehearsal.py)."""
    if rehearse:
        return load_rehearsal(conf_name, overrides, conf_dir)
    refuse_rehearse_settings(overrides)
    return load_config(conf_name, overrides, conf_dir), None


def launch(conf_name: str, overrides: list[str], dry_run: bool = False, conf_dir: Path | None = None,
           out: TextIO = sys.stdout, rehearse: bool = False) -> int:
    config, rehearsal = launch_config(conf_name, overrides, conf_dir, rehearse)
    check_data_path(config.data)
    linted = lint_before_launch(config)  # a lint error: one line, exit 2, nothing written or started
    if dry_run:
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
    refuse_unrunnable_plan(config, conf_name, [*overrides, *(["--rehearse"] if rehearse else [])])
    print_findings(linted, out)
    if note:
        out.write(note + "\n")
    metrics = MetricsServer.start(config.metrics)  # an address it cannot take: one line, before anything is written
    from runmgr.lineage import run_in_dir  # Ray, the workers, S3: only for a run that starts

    def recompose(more: list[str]) -> RunConfig:
        return load_config(conf_name, [*overrides, *more], conf_dir)

    try:
        return run_in_dir(config, recompose, out, metrics, linted, rehearsal)
    finally:
        if metrics is not None:
            metrics.close()
