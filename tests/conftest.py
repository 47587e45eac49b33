"""Fixtures shared by the tests: the CLI fork server, and the end-to-end and fault tests' Ray and reference run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Callable

import pytest
from filelock import FileLock

from tests.e2e.harness import LaunchedRun, kept_losses


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with slow tests first, in their own order: under pytest-xdist (``make test``: a
    module's tests on one worker, in the order collected) the long ones start at once and the
    many short ones fill in after them, so that the workers end together."""
    slow = {item.module.__name__ for item in items if item.module is not None and item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.module is None or item.module.__name__ not in slow)


@pytest.fixture(scope="session")
def shared_ray():
    """One real local Ray of 2 CPUs (the 2 ranks of a run) for the session's runs that neither kill
    nor reconfigure a cluster: a launch passes ``cluster.address=`` its address instead of starting
    a Ray of its own (seconds each on a loaded machine). Runs that kill their driver, their head or
    a node, or watch their own Ray's processes, keep a Ray of their own."""
    from runmgr.cluster import LocalCluster, start_local
    from runmgr.config.schema import ClusterConfig

    # Retried as a launch retries its own Ray: on a loaded machine a raylet may miss Ray's 30 s.
    head = start_local(lambda: LocalCluster(ClusterConfig(local_nodes=1, cpus_per_worker=2)))
    try:
        yield head
    finally:
        head.shutdown()


@pytest.fixture(scope="session")
def session_shared_dir(tmp_path_factory, worker_id) -> Path:
    """A directory every pytest-xdist worker of the session sees (their base directories' parent):
    what one worker computes once for the session is kept there, under a FileLock, for the others."""
    base = tmp_path_factory.getbasetemp()
    return base if worker_id == "master" else base.parent


@pytest.fixture(scope="session")
def reference_losses(request, tmp_path_factory, session_shared_dir) -> dict[int, float]:
    """Per-step losses of an uninterrupted run of the e2e config: one run for the whole session,
    shared by its pytest-xdist workers through a file (the first to need it runs it)."""
    kept = session_shared_dir / "reference_losses.json"
    with FileLock(str(kept) + ".lock"):
        if kept.exists():
            return {int(step): loss for step, loss in json.loads(kept.read_text()).items()}
        shared_ray = request.getfixturevalue("shared_ray")
        run = LaunchedRun(tmp_path_factory.mktemp("e2e") / "reference",
                          extra=[f"cluster.address={shared_ray.address}"]).start()
        assert run.wait() == 0, run.output()[-3000:]
        losses = kept_losses(run.run_dir)
        assert sorted(losses) == list(range(1, 41))
        (session_shared_dir / "reference_run.txt").write_text(str(run.run_dir))  # before the losses: they mark it done
        kept.write_text(json.dumps(losses))  # floats as repr: read back bit for bit
        return losses


@pytest.fixture(scope="session")
def reference_run(reference_losses, session_shared_dir) -> Path:
    """The run directory of :func:`reference_losses`'s run (whichever worker made it): a test that
    needs an unbroken run of the e2e config reads this one instead of launching its own (issue 28)."""
    return Path((session_shared_dir / "reference_run.txt").read_text())


@pytest.fixture(scope="session")
def detectors_score(session_shared_dir) -> Callable[[], subprocess.CompletedProcess]:
    """``runmgr watch score tests/data/detectors`` as the README writes it (in the repository's
    root), run once for the whole session when first called, shared by its pytest-xdist workers
    through a file: the README's line (tests/test_readme.py) and the detectors page's table
    (tests/runmgr/score/test_corpus.py) read the same output, where each scored the corpus's 18
    logs itself (about 10 CPU-seconds each)."""
    from tests import cli

    kept = session_shared_dir / "detectors_score.json"

    def score() -> subprocess.CompletedProcess:
        with FileLock(str(kept) + ".lock"):
            if not kept.exists():
                done = cli.runmgr("watch", "score", "tests/data/detectors", cwd=Path(__file__).resolve().parents[1])
                kept.write_text(json.dumps([done.args, done.returncode, done.stdout, done.stderr]))
            return subprocess.CompletedProcess(*json.loads(kept.read_text()))

    return score


@pytest.fixture(scope="session", autouse=True)
def runmgr_cli_server():
    """Short ``runmgr`` commands fork from one server that imported the CLI once (tests/cli.py)."""
    from tests import cli

    with cli.serving():
        yield
