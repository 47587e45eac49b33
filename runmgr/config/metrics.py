"""The driver's Prometheus exporter and its optional TensorBoard event files,
mirrored by ``conf/metrics/default.yaml`` (the metrics themselves: docs/metrics.md)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

DEFAULT_ADDRESS = "127.0.0.1:0"


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for an IPv6 host) as (host, port); ValueError
    with what is wrong otherwise. The host is not resolved here: binding does it."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port:
        raise ValueError("expected host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError("write an IPv6 host in brackets, e.g. [::1]:8000")
    if not host or any(c.isspace() or c in "[]/" for c in host):
        raise ValueError(f"{host!r} is not a host name or address")
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"port {port!r} is not a number from 0 to 65535")
    return host, int(port)


TENSORBOARD_INSTALL = "pip install 'runmgr[tensorboard]' (or pip install tensorboard)"
"""How to get the ``tensorboard`` package, as a refusal says it."""


def tensorboard_installed() -> bool:
    """Whether the ``tensorboard`` package can be imported here (found, not imported: it is slow to import)."""
    return importlib.util.find_spec("tensorboard") is not None


@dataclass
class TensorBoardConfig:
    """Each step's metrics, incidents and decisions also written as TensorBoard event files
    (runmgr/observers/tensorboard.py), one TensorBoard run per sub-run."""

    enabled: bool = False
    """Write them (needs the ``tensorboard`` package: the ``tensorboard`` extra of runmgr);
    false writes nothing."""
    dir: Optional[str] = None
    """The folder TensorBoard is pointed at (``tensorboard --logdir DIR``); each sub-run writes
    into ``DIR/<sub-run>/``. Unset: ``<run dir>/tensorboard``. A relative path is taken from
    where ``runmgr launch`` runs, as ``checkpoint.save`` is."""

    def directory(self, run_dir: Path) -> Path:
        """Where the event files go for the run in ``run_dir``."""
        return Path(self.dir) if self.dir else run_dir / "tensorboard"

    def problems(self) -> list[str]:
        # Refused at composition (launch, --dry-run, lint) rather than when the first sub-run
        # starts: a run asked to feed a dashboard must not train for hours feeding none.
        if self.enabled and not tensorboard_installed():
            return [f"metrics.tensorboard.enabled=true needs the tensorboard package, which is not installed: "
                    f"{TENSORBOARD_INSTALL}, or set metrics.tensorboard.enabled=false"]
        if self.dir is not None and not self.dir.strip():
            return ["metrics.tensorboard.dir is empty: name a folder, or leave it unset for <run dir>/tensorboard"]
        return []


@dataclass
class MetricsConfig:
    """Where the driver serves the run's metrics to Prometheus while it runs, and whether it
    also writes them for TensorBoard."""

    enabled: bool = True
    """Serve ``/metrics`` over HTTP from the driver (``runmgr launch``); false serves nothing."""
    address: str = DEFAULT_ADDRESS
    """``host:port`` to listen on. Port 0 takes a free port; the one taken is in
    ``runmgr status --json`` (``metrics.address``). 127.0.0.1 keeps it on this
    machine; the Kubernetes overlays listen on 0.0.0.0:8000 for Prometheus (k8s/components/servicemonitor).
    An address that cannot be bound (a port in use, an unknown host) refuses the launch."""
    tensorboard: TensorBoardConfig = field(default_factory=TensorBoardConfig)
    """TensorBoard event files of the per-step curves, incidents and decisions (off by default)."""

    def problems(self) -> list[str]:
        try:
            split_address(self.address)
        except ValueError as exc:
            return [f"metrics.address {self.address!r}: {exc} (e.g. {DEFAULT_ADDRESS} for a free port on this "
                    f"machine, 0.0.0.0:8000 for every interface)"] + self.tensorboard.problems()
        return self.tensorboard.problems()
