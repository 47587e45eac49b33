"""Versions of the software stack on a node: Python, torch, torch_npu, CANN,
the accelerator driver, Ray, runmgr, DeepSpeed, Megatron.

Packages are read from their installed metadata, never imported (importing
torch_npu without CANN breaks torch; importing Ray costs seconds). The fleet
analysis flags a node whose stack differs from the majority (seed 000).
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import platform
import re
from typing import Optional

from health.findings import ProbeResult, ok

# Fact name -> distribution name on PyPI.
PACKAGES = {
    "torch": "torch",
    "torch_npu": "torch_npu",
    "ray": "ray",
    "runmgr": "runmgr",
    "deepspeed": "deepspeed",
    "megatron_core": "megatron-core",
    "mindspeed": "mindspeed",
}
_CANN_INFO_GLOBS = (
    "ascend-toolkit/latest/*-linux/ascend_toolkit_install.info",
    "cann/*-linux/ascend_toolkit_install.info",
    "cann-*/*-linux/ascend_toolkit_install.info",
)
_NVIDIA_MODULE = re.compile(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+(?:\.\d+)+)")


def package_version(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def parse_key_equals(text: str) -> dict[str, str]:
    """``key=value`` lines (Ascend install/version files) -> lower-case keys."""
    out = {}
    for line in text.splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            out[key.strip().lower()] = value.strip()
    return out


def parse_nvidia_driver(text: str) -> Optional[str]:
    """``/proc/driver/nvidia/version`` -> ``535.104.05``."""
    match = _NVIDIA_MODULE.search(text)
    return match.group(1) if match else None


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def cann_version(ascend_root: str) -> Optional[str]:
    """CANN toolkit version from its install-info file under ``ascend_root``."""
    for pattern in _CANN_INFO_GLOBS:
        for path in sorted(glob.glob(os.path.join(ascend_root, pattern))):
            version = parse_key_equals(_read(path) or "").get("version")
            if version:
                return version
    return None


def driver_version(ascend_root: str, nvidia_version_file: str) -> Optional[str]:
    """Ascend driver (``driver/version.info``) or NVIDIA kernel module version."""
    ascend = _read(os.path.join(ascend_root, "driver", "version.info"))
    if ascend is not None:
        return parse_key_equals(ascend).get("version")
    nvidia = _read(nvidia_version_file)
    return parse_nvidia_driver(nvidia) if nvidia is not None else None


def collect_versions(ascend_root: str = "/usr/local/Ascend",
                     nvidia_version_file: str = "/proc/driver/nvidia/version"
                     ) -> dict[str, Optional[str]]:
    """Every version the fleet compares; None where a part is not installed."""
    versions: dict[str, Optional[str]] = {"python": platform.python_version()}
    versions.update({name: package_version(dist) for name, dist in PACKAGES.items()})
    versions["cann"] = cann_version(ascend_root)
    versions["driver"] = driver_version(ascend_root, nvidia_version_file)
    return versions


def probe_software(ascend_root: str = "/usr/local/Ascend",
                   nvidia_version_file: str = "/proc/driver/nvidia/version") -> ProbeResult:
    """Versions as facts ``software.<name>``; judged only against the fleet."""
    versions = collect_versions(ascend_root, nvidia_version_file)
    present = ", ".join(f"{k} {v}" for k, v in versions.items() if v)
    return ProbeResult([ok("software.versions", f"stack: {present}")],
                       facts={f"software.{k}": v for k, v in versions.items()})
