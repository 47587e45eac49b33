"""The one exception type of the data pipeline."""

from __future__ import annotations


class DataError(Exception):
    """Bad or missing training data.

    The message is one line that names the problem (file, key, line) and how
    to fix it, so that a CLI can print it as is and exit with code 2.
    """
