"""Seeding. Training draws random numbers only from torch's RNG, which is
reseeded before every step from (seed, step, rank): a resumed run therefore
needs no RNG replay to reproduce the uninterrupted one, and the checkpoint
records the states only so a person can inspect them."""

from __future__ import annotations

import base64
import random

import numpy as np
import torch

RESEED_RULE = "torch.manual_seed(numpy SeedSequence([seed, step, rank]).generate_state(1, uint64)[0] >> 1) before each step"


def step_seed(seed: int, step: int, rank: int) -> int:
    """The torch seed of ``step`` on ``rank`` (a pure function, see RESEED_RULE)."""
    state = np.random.SeedSequence([seed, step, rank]).generate_state(1, dtype=np.uint64)[0]
    return int(state) >> 1


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (weights initialise from torch's RNG)."""
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def reseed_for_step(seed: int, step: int, rank: int) -> None:
    torch.manual_seed(step_seed(seed, step, rank))


def rng_snapshot() -> dict:
    """This process's python/numpy/torch RNG states as JSON-friendly values."""
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    return {
        "rule": RESEED_RULE,
        "python": {"version": py_version, "state": list(py_state), "gauss": py_gauss},
        "numpy": {"name": np_name, "keys": np_keys.tolist(), "pos": int(np_pos),
                  "has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii"),
    }
