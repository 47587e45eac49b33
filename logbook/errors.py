"""The one exception the logbook raises for bad input or an unusable store."""


class LogbookError(Exception):
    """A problem a person can fix, described in one line that says how.

    The CLI prints the message alone and exits with status 2.
    """
