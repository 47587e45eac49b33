"""No object of runmgr reaches into another's private state: a part that needs
another's state asks through its methods, or holds it (composition), never
reads or rewrites its ``_fields`` (issue 28: the warm group once subclassed the
rank group and rewrote its actors, runs and drains). Found in every module's
syntax tree: an attribute ``_name`` of anything but ``self`` or ``cls`` that is
a runmgr object (a library's own private names, argparse's or Ray's, are the
library's business and listed)."""

from __future__ import annotations

import ast
from pathlib import Path

from runmgr.workers.agent_group import AgentWorkerGroup
from runmgr.workers.warm_agents import WarmAgentGroup

ROOT = Path(__file__).resolve().parents[2]
LIBRARIES = {"argparse", "os", "parser", "other", "ray_worker"}
"""Names that hold a library's module or object (argparse's parsers, Ray's worker module)."""


def reaches_in(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in {"self", "cls", *LIBRARIES}:
            continue
        found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_runmgr_module_reads_or_writes_another_object_s_private_fields():
    found = {str(path.relative_to(ROOT)): hits for path in sorted((ROOT / "runmgr").rglob("*.py"))
             if (hits := reaches_in(ast.parse(path.read_text())))}
    assert found == {}


def test_the_check_sees_a_field_reached_through_a_held_object():
    assert reaches_in(ast.parse("self.ranks._actors[0] = spare")) == [(1, "self.ranks._actors")]
    assert reaches_in(ast.parse("self._actors[0] = spare")) == []


def test_the_warm_group_holds_the_rank_group_instead_of_subclassing_it():
    assert not issubclass(WarmAgentGroup, AgentWorkerGroup)
