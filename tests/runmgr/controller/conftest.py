"""The controller's tests run with Ray absent: it is taken out of sys.modules and
any import of it fails, so a controller that reached for Ray would fail here."""

from __future__ import annotations

import importlib.abc
import sys

import pytest


class RayBlocker(importlib.abc.MetaPathFinder):
    """Refuses to import ray or any of its modules."""

    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(f"{name}: the controller must work without Ray")
        return None


@pytest.fixture(autouse=True)
def without_ray(monkeypatch):
    for name in [n for n in sys.modules if n == "ray" or n.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [RayBlocker(), *sys.meta_path])
