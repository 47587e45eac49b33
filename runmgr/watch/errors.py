"""Errors of the watch package that a user can fix (the CLI prints one line, exits 2)."""

from runmgr.errors import UserError


class ReplayInputError(UserError):
    """A log file that is missing, unreadable, or holds no training steps."""
