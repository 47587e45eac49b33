"""health/ stands alone: runmgr decides where probes run, not the other way."""

import ast
from pathlib import Path

import health

FORBIDDEN = {"runmgr", "trainer", "logbook", "ray"}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_health_imports_nothing_from_the_driver_the_trainer_the_logbook_or_ray():
    package = Path(health.__file__).parent
    offenders = {str(p.relative_to(package)): sorted(imported_roots(p) & FORBIDDEN)
                 for p in package.rglob("*.py") if imported_roots(p) & FORBIDDEN}
    assert offenders == {}

