"""Errors a user can fix. The CLI prints their message as one line and exits 2."""


class UserError(Exception):
    """Base class: bad input or an environment problem the user must fix."""


class ConfigError(UserError):
    """A wrong key, a wrong type or an inconsistent value in the run config."""


class ClusterError(UserError):
    """The Ray cluster cannot be reached or cannot hold the run."""


class RunStateError(UserError):
    """A run directory that is missing, locked by a live driver, or unreadable."""


class ClusterLostError(ClusterError):
    """The Ray cluster's head stopped answering during the run: no sub-run can go
    on or start on it, so the controller ends the run instead of retrying."""


class DiskFullError(RunStateError):
    """The disk holding the run directory has no room left for the run's records."""
