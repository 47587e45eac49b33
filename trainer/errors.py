"""Errors the trainer raises for bad input. Each carries one line that names
the problem and how to fix it; the CLI prints it and exits with the code from
:mod:`trainer.exitcodes`. (``DataError`` lives in :mod:`trainer.data`.)"""

from __future__ import annotations


class TrainerConfigError(ValueError):
    """The configuration cannot run: a key is wrong, missing or inconsistent."""


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or does not match its manifest."""
