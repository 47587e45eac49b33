"""What ``runmgr launch`` refuses before it writes anything: no run
directory, no logbook, no Ray started for it. Each refusal is one line raised
as a :class:`~runmgr.errors.UserError` (the CLI exits 2).

- a plan the cluster in view cannot hold, or the built-in trainer cannot
  execute (the verdict ``--dry-run`` prints, runmgr/dryrun.py);
- a resume whose checkpoint holds a model of other shapes than the config
  builds (a changed ``model.hidden_size``, say), compared through the shapes
  the checkpoint's manifest records, never by unpickling DCP's metadata.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from runmgr.config.schema import RunConfig
from runmgr.dryrun import build_plan, inspect_cluster, refusal
from runmgr.errors import ClusterError, ConfigError
from trainer.errors import CheckpointError
from trainer.manifest import list_checkpoints, read_manifest, recorded_shapes, verify_checkpoint


def dry_run_command(conf_name: str, overrides: list[str]) -> str:
    """The command that prints the plan of this launch."""
    return shlex.join(["runmgr", "launch", "--dry-run", f"conf={conf_name}", *overrides])


def refuse_unrunnable_plan(config: RunConfig, conf_name: str, overrides: list[str]) -> None:
    """Raise when the cluster in view cannot hold the run, in all or node by node
    (ClusterError), or the built-in trainer cannot execute it (ConfigError). For an
    existing cluster this connects briefly to read its nodes; a local Ray is not
    started (its nodes are known from the config)."""
    plan = build_plan(config, inspect_cluster(config.cluster))
    reason = refusal(plan, dry_run_command(conf_name, overrides))
    if reason is not None:
        raise (ClusterError if plan.shortfalls else ConfigError)(reason)


def newest_complete_checkpoint(checkpoint_dir: Path) -> Path | None:
    """The newest checkpoint with a manifest and files of the right sizes
    (the one a resume would start from, checksums aside)."""
    for path in reversed(list_checkpoints(checkpoint_dir)):
        if verify_checkpoint(path, check_hashes=False)[0]:
            return path
    return None


def refuse_changed_model_shape(config: RunConfig) -> str | None:
    """Raise ConfigError when the lineage's newest checkpoint holds a model of
    other shapes than ``config.model`` builds (built on the meta device: no
    memory). Returns a note to print when that checkpoint records no shapes
    (written before manifests did): it cannot be checked here, and the
    workers' load names a mismatch instead."""
    newest = newest_complete_checkpoint(config.checkpoint_dir())
    if newest is None:
        return None
    if recorded_shapes(read_manifest(newest)) is None:
        return (f"note: {newest} records no model shapes (written by an older runmgr); "
                "a changed model size shows only when the workers load it")
    from trainer.checkpoint import check_shapes  # torch: only when there is something to compare

    try:
        check_shapes(newest, config.model)
    except CheckpointError as error:
        raise ConfigError(str(error)) from None
    return None
