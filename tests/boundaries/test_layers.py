"""Inside runmgr/, imports run one way: from a higher layer to a lower one
(docs/design.md, "Layers"). The controller, the policy and the watcher never
import Ray, so they are tested without it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "runmgr"

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors", "choices", "nodes", "__init__"}),
    frozenset({"config", "placement"}),
    frozenset({"watch"}),
    frozenset({"policy", "megatron"}),
    frozenset({"controller", "resume", "agents"}),
    frozenset({"workers", "observers", "metrics", "chaos", "healthcheck", "stacks", "status", "rundir", "cluster",
               "dryrun", "refusals", "stopping", "logbook_samples", "reaper", "headwatch", "diskspace", "s3",
               "precision", "simulate", "kuberay", "rehearsal", "scale", "ports", "notify", "approvals"}),
    frozenset({"lint"}),
    frozenset({"preflight", "launch", "lineage", "wiring", "runners", "replay", "shadow", "score", "cli", "logbook_command", "__main__"}),
)
"""Lowest first. A part may import its own layer and the ones below."""
RAY_FREE = ("controller", "policy", "megatron", "watch", "config", "simulate", "agents", "shadow", "score")


def layer_of(part: str) -> int:
    for index, parts in enumerate(LAYERS):
        if part in parts:
            return index
    raise AssertionError(f"runmgr/{part} is in no layer: place it in LAYERS and in docs/design.md")


def part_of(path: Path) -> str:
    """``runmgr/watch/spikes.py`` -> ``watch``; ``runmgr/launch.py`` -> ``launch``."""
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def runmgr_imports(path: Path) -> set[str]:
    """The runmgr parts a file imports (``runmgr.config.watcher`` -> ``watch``), at any depth in the file."""
    parts = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names
                                       if node.module == "runmgr"]
        else:
            continue
        parts |= {m.split(".")[1] for m in modules if m.startswith("runmgr.")}
    return parts


def top_level_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_every_import_inside_runmgr_runs_down_the_layers():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = part_of(path)
        for target in runmgr_imports(path) - {source}:
            if layer_of(target) > layer_of(source):
                upward.append(f"{path.relative_to(ROOT)} imports runmgr.{target}")
    assert upward == []


def test_the_layers_written_in_the_design_are_the_ones_guarded():
    design = (ROOT / "docs" / "design.md").read_text()
    section = design[design.index("## Layers"):]
    section = section[:section.index("\n## ", 1)]
    assert "config -> watch -> policy -> controller -> workers -> launch, cli" in section
    for index, parts in enumerate(LAYERS):
        row = next(line for line in section.splitlines() if line.startswith(f"| {index} |"))
        assert {part for part in parts if part != "__init__"} <= set(row.replace("`", " ").replace(",", " ").split()), row


def test_controller_policy_watch_and_config_name_no_ray():
    offenders = {str(path.relative_to(ROOT)) for part in RAY_FREE for path in (PACKAGE / part).rglob("*.py")
                 if "ray" in top_level_imports(path)}
    assert offenders == set()


def test_importing_them_loads_no_ray_at_run_time():
    modules = ["runmgr.controller.machine", "runmgr.controller.judge", "runmgr.controller.group",
               "runmgr.policy.ladder", "runmgr.watch.watcher", "runmgr.config.schema", "runmgr.resume",
               "runmgr.simulate.ettr", "runmgr.agents.summary", "runmgr.agents.rank_processes"]
    code = (f"import sys, importlib; [importlib.import_module(m) for m in {modules!r}]; "
            "loaded = sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')); "
            "print(loaded); sys.exit(1 if loaded else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_only_the_s3_part_talks_to_s3():
    """boto3 stays in runmgr/s3: the detectors, the policy and the controller see upload
    observations, and the trainer never needs boto3 (the driver mirrors its checkpoints)."""
    aws = {"boto3", "botocore", "s3transfer"}
    sources = [*PACKAGE.rglob("*.py"), *(ROOT / "trainer").rglob("*.py")]
    offenders = {str(path.relative_to(ROOT)) for path in sources
                 if aws & top_level_imports(path) and not path.is_relative_to(PACKAGE / "s3")}
    assert offenders == set()
