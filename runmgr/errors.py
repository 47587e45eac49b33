"""Errors a user can fix. The CLI prints their message as one line and exits 2
(4 for :class:`RayStartTimeoutError`: nothing to fix, only to try again)."""


class UserError(Exception):
    """Base class: bad input or an environment problem the user must fix."""


class ConfigError(UserError):
    """A wrong key, a wrong type or an inconsistent value in the run config."""


class ClusterError(UserError):
    """The Ray cluster cannot be reached or cannot hold the run."""


class RunStateError(UserError):
    """A run directory that is missing, locked by a live driver, or unreadable."""


class RayStartTimeoutError(ClusterError):
    """A local Ray that runmgr started did not come up within Ray's own start-up time, try after
    try: a busy machine, not a wrong input. The CLI exits 4 (EXIT_RAY_START_TIMEOUT) so that a
    script can tell it from a refusal and run the same command again later."""


class ClusterLostError(ClusterError):
    """The Ray cluster's head stopped answering during the run: no sub-run can go
    on or start on it, so the controller ends the run instead of retrying."""


class DiskFullError(RunStateError):
    """The disk holding the run directory has no room left for the run's records."""


class PlanRefusedError(UserError):
    """The trainer cannot carry out a sub-run's plan (a remedy its arguments cannot express):
    deterministic, so the run stops for a person instead of retrying. One line: what and why."""
