"""A launch's pre-flight: the config composed once, then an ordered list of checks
that refuse it before torch and Ray are imported and before anything is written
(each check raises a :class:`~runmgr.errors.UserError`; ``runmgr.cli.main`` is the
one place that turns any of them into one line and exit 2). ``runmgr launch`` then
takes the typed config from here; nothing composes it again (only a chaos schedule's
faulty inputs recompose it, with their overrides, when the run starts)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from runmgr.config.compose import load_run_config
from runmgr.config.schema import RunConfig
from runmgr.errors import UserError
from runmgr.megatron.job import aligned
from runmgr.rehearsal import Mapping, load_rehearsal, refuse_rehearse_settings
from runmgr.rundir import check_run_dir
from trainer.data import check_data_path


@dataclass(frozen=True)
class LaunchRequest:
    """What ``runmgr launch`` was asked."""

    conf: str
    """The conf's name (conf/NAME.yaml)."""
    overrides: tuple[str, ...]
    """``key=value`` items, in order."""
    conf_dir: Optional[Path] = None
    """Where the confs are (None: ./conf or RUNMGR_CONF_DIR)."""
    rehearse: bool = False
    """Run the recipe small on this machine (runmgr/rehearsal.py)."""
    dry_run: bool = False
    """Print the plan; write and start nothing."""

    def config_with(self, more: list[str]) -> RunConfig:
        """The conf composed again with ``more`` overrides (the chaos schedule's faulty inputs)."""
        return compose_config(self.conf, [*self.overrides, *more], self.conf_dir)


@dataclass(frozen=True)
class PreparedLaunch:
    """A launch that passed its pre-flight: its typed config, composed once."""

    request: LaunchRequest
    config: RunConfig
    rehearsal: Optional[Mapping] = None
    """How a rehearsal maps to the real run's plan (None: no rehearsal)."""


def compose_config(conf: str, overrides: list[str], conf_dir: Optional[Path]) -> RunConfig:
    """The checked config; for a Megatron job, with the iterations, batch sizes and checkpoint
    directory its arguments say (they are the truth runmgr's progress and arithmetic read)."""
    return aligned(load_run_config(conf, overrides, conf_dir))


def compose(request: LaunchRequest) -> PreparedLaunch:
    """The config the launch runs, composed once: the conf's, or its rehearsal with the mapping."""
    if request.rehearse:
        config, mapping = load_rehearsal(request.conf, list(request.overrides), request.conf_dir)
        return PreparedLaunch(request, config, mapping)
    refuse_rehearse_settings(list(request.overrides))  # rehearse.* without --rehearse would do nothing
    return PreparedLaunch(request, compose_config(request.conf, list(request.overrides), request.conf_dir))


def data_path(launch: PreparedLaunch) -> None:
    check_data_path(launch.config.data)


def run_directory(launch: PreparedLaunch) -> None:
    """The run and checkpoint directories can be written, the logbook there opens."""
    if not launch.request.dry_run:
        check_run_dir(launch.config)


def kubernetes(launch: PreparedLaunch) -> None:
    """kubernetes.* can be honoured here (the environment: only a launch can tell)."""
    problems = [] if launch.request.dry_run else launch.config.kubernetes.launch_problems(launch.config.cluster.address)
    if problems:
        raise UserError(problems[0])


def s3_bucket(launch: PreparedLaunch) -> None:
    """checkpoint.s3's bucket answers, with the credentials given."""
    if launch.config.checkpoint.s3.enabled and not launch.request.dry_run:
        from runmgr.s3.client import S3Client, probe  # boto3: only for a run that mirrors its checkpoints

        probe(S3Client(launch.config.checkpoint.s3, launch.config.run.name))


def webhooks(launch: PreparedLaunch) -> None:
    """notify's webhooks can be read where the config says they are (an environment variable, a file)."""
    if launch.config.notify.targets() and not launch.request.dry_run:
        from runmgr.notify.targets import resolve

        resolve(launch.config.notify)


CHECKS: tuple[Callable[[PreparedLaunch], None], ...] = (data_path, webhooks, run_directory, kubernetes, s3_bucket)
"""The pre-flight's checks, in order (a dry run writes nothing: it checks only the data)."""


def prepare_launch(request: LaunchRequest) -> PreparedLaunch:
    """The launch's config, composed once and checked; a UserError names the first problem."""
    launch = compose(request)
    for check in CHECKS:
        check(launch)
    return launch
