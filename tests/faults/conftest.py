"""Fixtures of the fault tests: the e2e harness's uninterrupted reference run."""

from __future__ import annotations

from tests.e2e.conftest import reference_losses  # noqa: F401  (the per-step losses of an uninterrupted run)
