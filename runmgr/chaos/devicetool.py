"""The chaos tools directory: a scripted ``npu-smi`` and the switch that breaks a node.

runmgr puts :attr:`DeviceTools.directory` first on the PATH of its device
poll; from then on the poll reads whatever the script prints, exactly as it
would read the real tool. :meth:`break_node` makes the script report
uncorrectable (double-bit) HBM ECC errors on one node.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Optional

from runmgr.chaos import npu_smi_tool

TOOL_NAME = "npu-smi"


class DeviceTools:
    """A directory holding the scripted vendor tool and the faults it reports."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory).resolve()

    @property
    def state_path(self) -> Path:
        return self.directory / npu_smi_tool.STATE_NAME

    def install(self) -> Path:
        """Write the tool (idempotent; the faults already switched on stay)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        source = Path(npu_smi_tool.__file__).read_text()
        tool = self.directory / TOOL_NAME
        # -S: no site, no site-packages (the tool is standard library only). The device poll runs it
        # twice a poll on every node, and the venv's site (its .pth files) was three quarters of its CPU.
        _write_atomically(tool, f"#!{sys.executable} -S\n{source}")
        tool.chmod(0o755)
        if not self.state_path.exists():
            _write_atomically(self.state_path, json.dumps({"faults": []}))
        return tool

    def faults(self) -> list[dict]:
        if not self.state_path.exists():
            return []
        return list(json.loads(self.state_path.read_text()).get("faults", []))

    def break_node(self, node_id: str, raylet_pid: Optional[int], npu: int = 0, double_bit: int = 2) -> dict:
        """From now on the node's NPU ``npu`` reports ``double_bit`` uncorrectable ECC errors."""
        fault = {"node_id": node_id, "raylet_pid": raylet_pid, "npu": npu, "double_bit": double_bit,
                 "single_bit": 0}
        others = [f for f in self.faults() if not (f.get("node_id") == node_id and f.get("npu") == npu)]
        _write_atomically(self.state_path, json.dumps({"faults": [*others, fault]}, indent=1))
        return fault

    def heal_node(self, node_id: str) -> None:
        """The node's devices report healthy again (a replaced or reset device)."""
        kept = [f for f in self.faults() if f.get("node_id") != node_id]
        _write_atomically(self.state_path, json.dumps({"faults": kept}, indent=1))


def _write_atomically(path: Path, text: str) -> None:
    # The tool may be run by a poll at any moment: it must see the old file or the new one.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the poll may run as another user
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
