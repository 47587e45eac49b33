"""Fixtures shared by the end-to-end and fault tests."""

from __future__ import annotations

import pytest

from tests.e2e.harness import LaunchedRun, kept_losses


@pytest.fixture(scope="session")
def reference_losses(tmp_path_factory) -> dict[int, float]:
    """Per-step losses of an uninterrupted run of the e2e config (one run for the whole session)."""
    run = LaunchedRun(tmp_path_factory.mktemp("e2e") / "reference").start()
    assert run.wait() == 0, run.output()[-3000:]
    losses = kept_losses(run.run_dir)
    assert sorted(losses) == list(range(1, 41))
    return losses
