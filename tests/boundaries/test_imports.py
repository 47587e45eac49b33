"""The trainer stays free of fault-tolerance code: it imports nothing from
runmgr, health, logbook or ray, so it runs alone and under any driver."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN_FOR_TRAINER = {"runmgr", "health", "logbook", "ray"}


def imported_top_levels(package: Path) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = {node.module.split(".")[0]}
            else:
                continue
            for name in names:
                found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_trainer_source_imports_nothing_from_the_manager():
    imports = imported_top_levels(ROOT / "trainer")
    offenders = {name: sorted(files) for name, files in imports.items() if name in FORBIDDEN_FOR_TRAINER}
    assert offenders == {}


def test_importing_the_trainer_loads_none_of_them_at_run_time():
    code = (
        "import sys, trainer, trainer.loop, trainer.checkpoint, trainer.data, trainer.model;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in %r); print(bad); sys.exit(1 if bad else 0)"
        % (FORBIDDEN_FOR_TRAINER,)
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


NOT_FOR_THE_DRIVER = {"torch", "boto3"}
"""What a launch's driver need not import: torch, the ranks' and their fork servers' (a driver
names a rank's place with plain data: trainer/dist_env.py, trainer/rejoin.py; importing the CLI,
the launch and the lineage took 2.7 CPU-seconds and 268 MB with torch, 1.1 and 90 without), and
boto3 (imported by a run that mirrors its checkpoints to S3, and by it only)."""


def test_a_launch_s_driver_loads_neither_torch_nor_boto3():
    code = ("import sys, runmgr.cli, runmgr.launch, runmgr.lineage;"
            "bad = sorted(set(sys.modules) & %r); print(bad); sys.exit(1 if bad else 0)" % (NOT_FOR_THE_DRIVER,))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_logbook_and_health_do_not_import_the_driver_or_ray():
    for package in ("logbook", "health"):
        imports = imported_top_levels(ROOT / package)
        assert not {"runmgr", "ray"} & set(imports), (package, {k: imports[k] for k in {"runmgr", "ray"} & set(imports)})
