"""Scripted Ascend tools for the tests: ``npu-smi`` and ``hccn_tool`` that
print the real formats (../shared/FORMATS.md 1.1-1.5) for two 910B NPUs.

Each answer is a file the script cats, so a test changes what a node's
device says by rewriting a file (atomically), as a failing chip would.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

INFO_910B = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.0                   Version: 24.1.0                                               |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | {h0:<14}| 95.2        38                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3402 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | {h1:<14}| 97.8        40                0    / 0             |
| 0                         | 0000:C2:00.0  | 0           0    / 0          3398 / 65536         |
+===========================+===============+====================================================+
"""

ECC_910B = """\
        NPU ID                                   : {npu}
        Chip Count                               : 1
        DDR Single Bit Error Count               : 0
        DDR Double Bit Error Count               : 0
        DDR Single Bit Aggregate Total Err Cnt   : 0
        DDR Double Bit Aggregate Total Err Cnt   : 0
        DDR Single Bit Isolated Pages Count      : 0
        DDR Double Bit Isolated Pages Count      : 0
        HBM Single Bit Error Count               : {single}
        HBM Double Bit Error Count               : {double}
        HBM Single Bit Aggregate Total Err Cnt   : {single}
        HBM Double Bit Aggregate Total Err Cnt   : {double}
        HBM Single Bit Isolated Pages Count      : 0
        HBM Double Bit Isolated Pages Count      : 0
        Chip ID                                  : 0
"""

HEALTH = """\
        NPU ID                         : {npu}
        Health                         : {health}
        Error Code                     : {code}
        Error Information              : {info}
"""


def _script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\nPATH=/usr/bin:/bin\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _replace(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # a poll never reads half a file


class FakeAscend:
    """Two 910B NPUs behind scripted tools in ``directory`` (put it first on PATH)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.answers = self.directory / "answers"
        self.answers.mkdir(exist_ok=True)
        a = self.answers
        _script(self.directory / "npu-smi", f"""case "$*" in
  "info") cat '{a}/info' ;;
  "info -t health -i "[01]) cat '{a}/health-'"$5" ;;
  "info -t ecc -i "[01]) cat '{a}/ecc-'"$5" ;;
  *) echo "npu-smi: bad arguments: $*" >&2; exit 2 ;;
esac
""")
        _script(self.directory / "hccn_tool", f"""case "$*" in
  "-i "[01]" -link -g") cat '{a}/link-'"$2" ;;
  "-i "[01]" -net_health -g") echo "net health status: Success" ;;
  *) echo "hccn_tool: bad arguments: $*" >&2; exit 2 ;;
esac
""")
        for npu in (0, 1):
            self.set_ecc(npu, 0, 0)
            self.set_health(npu, "OK")
            _replace(self.answers / f"link-{npu}", "link status: UP\n")

    @property
    def path(self) -> str:
        """A PATH with these tools first."""
        return f"{self.directory}:{os.environ.get('PATH', '/usr/bin:/bin')}"

    def set_ecc(self, npu: int, single: int, double: int) -> None:
        _replace(self.answers / f"ecc-{npu}", ECC_910B.format(npu=npu, single=single, double=double))

    def set_health(self, npu: int, health: str, code: str = "NA", info: str = "NA") -> None:
        _replace(self.answers / f"health-{npu}", HEALTH.format(npu=npu, health=health, code=code, info=info))
        states = {n: (health if n == npu else self._table_health(n)) for n in (0, 1)}
        _replace(self.answers / "info", INFO_910B.format(h0=states[0], h1=states[1]))

    def _table_health(self, npu: int) -> str:
        try:
            text = (self.answers / f"health-{npu}").read_text()
        except FileNotFoundError:
            return "OK"
        return text.split("Health")[1].split(":")[1].split()[0]
