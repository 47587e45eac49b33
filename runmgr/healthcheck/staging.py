"""``runmgr health-check --stage``: copy the run's dataset from the shared
mount to every node's local disk at once (seed 000: read local copies, not
one shared disk from many nodes), resumable, under one progress bar.

Each node copies with :func:`health.probes.data.stage_dataset` (a partial
file renamed into place only when complete and verified, so a second run
resumes where a killed one stopped) and reports its bytes to a small actor
the driver reads.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Sequence

from health.config import DataChecks
from health.findings import Finding, fail
from health.probes.data import progress_line
from runmgr.errors import UserError
from runmgr.healthcheck.nodes import RayNode

Progress = Callable[[str], None]
REPORT_EVERY_S = 0.2
"""A node tells the driver its progress at most this often."""
BAR_STEP = 0.1
"""The driver prints the bar each time the fleet's progress moves by this much."""


class StagingProgress:
    """Bytes copied per node (a Ray actor the staging tasks report to)."""

    def __init__(self) -> None:
        self.done: dict[str, int] = {}
        self.total: dict[str, int] = {}

    def update(self, node: str, done: int, total: int) -> None:
        self.done[node], self.total[node] = done, total

    def snapshot(self) -> tuple[int, int]:
        return sum(self.done.values()), sum(self.total.values())


def check_stage_config(data: DataChecks) -> None:
    """--stage needs both ends of the copy; say which key is missing."""
    for key in ("shared_path", "local_path"):
        if not getattr(data, key):
            raise UserError(f"--stage needs health.data.{key}: set health.data.shared_path=/mnt/hpfs/"
                            "corpus.bin health.data.local_path=/data/corpus.bin (sha256 recommended)")


def stage_here(data: DataChecks, node_id: str, reporter) -> dict:
    """Stage the dataset on this node (runs in a task pinned to it)."""
    from health.probes.data import StagingError, stage_dataset

    last = [0.0]

    def report(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= REPORT_EVERY_S or done == total:
            last[0] = now
            reporter.update.remote(node_id, done, total)

    try:
        outcome = stage_dataset(data.shared_path, data.local_path, data.sha256,
                                int(data.chunk_mb * 1e6), report)
    except (StagingError, OSError) as exc:
        return {"error": str(exc)}
    import ray

    # Waited for: the driver reads the bar after this task returns, and must see the end.
    ray.get(reporter.update.remote(node_id, outcome.total_bytes, outcome.total_bytes))
    return {"copied": outcome.copied_bytes, "resumed_from": outcome.resumed_from,
            "total": outcome.total_bytes}


def _outcome_line(node: RayNode, result: dict) -> str:
    if "error" in result:
        return f"  stage {node.display()}: FAILED {result['error']}"
    if not result["copied"]:
        return f"  stage {node.display()}: already staged ({result['total'] / 1e6:.1f} MB)"
    resumed = f", resumed at {result['resumed_from'] / 1e6:.1f} MB" if result["resumed_from"] else ""
    return f"  stage {node.display()}: copied {result['copied'] / 1e6:.1f} MB{resumed}"


def stage_on_nodes(nodes: Sequence[RayNode], data: DataChecks, progress: Progress,
                   poll_s: float = 0.5) -> dict[str, list[Finding]]:
    """Stage on every node at once; returns the failures as findings per node id."""
    import ray
    from ray.exceptions import RayError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    check_stage_config(data)
    reporter = ray.remote(num_cpus=0)(StagingProgress).remote()
    task = ray.remote(num_cpus=0, max_retries=0)(stage_here)
    refs = {task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False))
            .remote(data, n.node_id, reporter): n for n in nodes}
    label = f"stage {os.path.basename(str(data.local_path))} on {len(nodes)} node(s)"
    progress(f"{label}: from {data.shared_path}")
    failures: dict[str, list[Finding]] = {}
    pending, shown = list(refs), -1.0
    while pending:
        done, pending = ray.wait(pending, num_returns=len(pending), timeout=poll_s)
        for ref in done:
            node = refs[ref]
            try:
                result = ray.get(ref)
            except RayError as exc:
                result = {"error": f"the staging task died: {type(exc).__name__}"}
            progress(_outcome_line(node, result))
            if "error" in result:
                failures[node.node_id] = [fail("data.stage_failed", f"staging {data.shared_path} "
                                               f"-> {data.local_path} failed: {result['error']}")]
        copied, total = ray.get(reporter.snapshot.remote())
        fraction = copied / total if total else 0.0
        if total and (fraction - shown >= BAR_STEP or (not pending and fraction > shown)):
            shown = fraction
            progress(progress_line(copied, total, label=label))
    ray.kill(reporter)
    return failures

