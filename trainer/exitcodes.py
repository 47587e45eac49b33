"""Exit codes of ``python -m trainer`` (and ``torchrun -m trainer``).

runmgr and shell scripts read these to tell a bad input (fix and relaunch)
from a fault (retry) without parsing messages.
"""

from __future__ import annotations

DONE = 0
"""Training reached ``training.train_iters``."""
FAILED = 1
"""Anything else: a lost peer, a hang turned timeout, a bug. Worth a retry."""
BAD_INPUT = 2
"""Bad configuration or data (TrainerConfigError, DataError, Hydra/OmegaConf
errors). Retrying the same input fails the same way."""
CHECKPOINT_ERROR = 3
"""The checkpoint to resume from does not verify (CheckpointError)."""
