"""Errors the trainer raises for bad input. Each carries one line that names
the problem and how to fix it; the CLI prints it and exits with the code from
:mod:`trainer.exitcodes`. (``DataError`` lives in :mod:`trainer.data`.)"""

from __future__ import annotations

from typing import Optional


class TrainerConfigError(ValueError):
    """The configuration cannot run: a key is wrong, missing or inconsistent."""


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used as asked: it is missing, incomplete, or holds
    another model than the config builds."""


class BadCheckpointError(CheckpointError):
    """The checkpoint a run resumes from is unusable in itself: it does not
    verify, its data disagree with its manifest, or it asks to run code. An
    older checkpoint may be sound: runmgr rejects this one and restarts from
    the previous. The message (one line) names the checkpoint, its step and the
    reason: ``checkpoint /ck/step_00000020 (step 20) is unusable: ...``."""

    def __init__(self, path: object, step: Optional[int], reason: str) -> None:
        """``step``: the step the checkpoint stands for (None when its directory name tells none)."""
        self.path, self.step, self.reason = str(path), step, " ".join(reason.split())
        numbered = f" (step {step})" if step is not None else ""
        super().__init__(f"checkpoint {self.path}{numbered} is unusable: {self.reason}")

    def __reduce__(self) -> tuple:
        # Raised inside a Ray actor, it travels pickled: rebuild it from its own fields.
        return type(self), (self.path, self.step, self.reason)
