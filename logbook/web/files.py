"""Files of a run directory the page shows beside the logbook: stack dumps
(``stacks/<sub-run>/rank<N>.txt``), health reports (``health/``) and plots
(``plots/*.png``, and the ``plots/*.html`` pages of ``logbook plot --html``).
Only names found by listing those folders are ever opened, so no URL can
reach outside them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

MAX_SHOWN_BYTES = 256 * 1024
"""A file is shown up to here; past it the page says it was cut (the file itself is whole)."""


def read_text(path: Path) -> str:
    """The file as text (bad bytes replaced), cut at :data:`MAX_SHOWN_BYTES` with a note."""
    with path.open("rb") as handle:
        data = handle.read(MAX_SHOWN_BYTES + 1)
    text = data[:MAX_SHOWN_BYTES].decode("utf-8", errors="replace")
    if len(data) > MAX_SHOWN_BYTES:
        text += f"\n… cut at {MAX_SHOWN_BYTES} bytes: the whole file is {path}"
    return text


def _rank_number(path: Path) -> int:
    found = re.search(r"\d+", path.stem)
    return int(found.group()) if found else -1


def stack_dumps(run_dir: Path, subrun: str) -> list[dict]:
    """Each rank's dumped stack of ``subrun``, rank 0 first: ``{"name", "text"}``."""
    folder = run_dir / "stacks" / subrun
    if not folder.is_dir():
        return []
    return [{"name": path.name, "text": read_text(path)}
            for path in sorted(folder.glob("rank*.txt"), key=_rank_number) if path.is_file()]


def health_reports(run_dir: Path) -> list[dict]:
    """Every file under ``health/``: ``{"name", "text"}``, JSON pretty-printed."""
    folder = run_dir / "health"
    if not folder.is_dir():
        return []
    reports = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        text = read_text(path)
        if path.suffix == ".json":
            try:
                text = json.dumps(json.loads(text), indent=2)
            except ValueError:
                pass  # shown as it is: a report cut mid-write is still worth reading
        reports.append({"name": path.relative_to(folder).as_posix(), "text": text})
    return reports


def plot_images(run_dir: Path) -> list[str]:
    """Names of the PNG plots ``runmgr logbook plot`` wrote into ``plots/``."""
    folder = run_dir / "plots"
    return sorted(p.name for p in folder.glob("*.png") if p.is_file()) if folder.is_dir() else []


def plot_path(run_dir: Path, name: str) -> Optional[Path]:
    """The plot called ``name`` when it is one :func:`plot_images` lists, else None."""
    return run_dir / "plots" / name if name in plot_images(run_dir) else None


def html_plots(run_dir: Path) -> list[str]:
    """Names of the interactive pages ``runmgr logbook plot --html`` wrote into ``plots/``."""
    folder = run_dir / "plots"
    return sorted(p.name for p in folder.glob("*.html") if p.is_file()) if folder.is_dir() else []


def html_plot_path(run_dir: Path, name: str) -> Optional[Path]:
    """The page called ``name`` when it is one :func:`html_plots` lists, else None."""
    return run_dir / "plots" / name if name in html_plots(run_dir) else None
