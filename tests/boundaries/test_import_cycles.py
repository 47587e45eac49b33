"""No import circle in runmgr/, trainer/ or logbook/, counting imports inside
functions (a circle hidden in a function is still one: the modules cannot be
understood, or split, apart). Found with Tarjan's strongly connected components
over every module's imports, at any depth of its body."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("runmgr", "trainer", "logbook")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}


def imported(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The project modules ``path`` (module ``name``) imports, anywhere in its body."""
    def owner(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".") \
                if node.level else (node.module or "")
            # ``from a.b import c``: the module a.b.c, else a.b (c is a name in it)
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {m for m in map(owner, targets) if m and m != name}
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle_in_runmgr_trainer_or_logbook():
    modules = project_modules()
    graph = {name: imported(path, name, modules) for name, path in modules.items()}
    assert circles(graph) == []


def test_a_circle_hidden_in_a_function_is_found(tmp_path):
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    hidden = tmp_path / "schema.py"
    hidden.write_text("def f():\n    from runmgr.config.compose import load_run_config\n")
    modules = {"runmgr.config.compose": hidden, "runmgr.config.schema": hidden}
    assert imported(hidden, "runmgr.config.schema", modules) == {"runmgr.config.compose"}
