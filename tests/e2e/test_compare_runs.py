"""`runmgr logbook compare` on real runs (issue 13, must-show 2): real `runmgr launch`
runs of the demo model on a local Ray, the e2e config's 40 steps, no faults.

- two deterministic runs of the same config: ``identical`` (the second is the session's reference
  run, tests/conftest.py, which the suite launches anyway: one launch fewer, issue 28);
- ``optim.weight_decay`` changed: ``diverging from step N``, N the step where the
  difference leaves the baseline band (and stays out);
- two runs whose floats differ only by the order of their reductions, judged
  against a baseline pair made the same way: ``consistent``.

The CPU trainer is deterministic even with ``training.deterministic=false`` (one
intra-op thread, gloo's fixed reduction order; docs/compare.md), so the
run-to-run noise seed 004 measures comes from the reduction order, which is what
non-deterministic reductions vary on a device: the baseline pair is the reference
on 2 ranks and on 1 rank (the gradients are summed across ranks in another order),
the judged pair is the reference and the same training with micro-batches of 4
instead of 2 at the same global batch (gradients accumulated in another order).
Neither change alters the mathematics of a step (docs/compare.md).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests import cli
from tests.e2e.harness import E2E_OVERRIDES, ROOT, LaunchedRun

pytestmark = pytest.mark.slow

BASE = E2E_OVERRIDES  # the reference run's config: "again" is that run
RUNS = {
    "ref": [],
    "wd": ["optim.weight_decay=0.0"],           # the demo's is 0.1
    "one_rank": ["cluster.num_workers=1"],       # baseline: the reference's sum over ranks in another order
    "mb4": ["training.micro_batch_size=4"],      # judged: accumulation in another order (E2E: micro-batch 2)
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shared_ray, reference_run) -> dict[str, Path]:
    """The runs of :data:`RUNS`, one after the other (2 cores), each finished, all on
    one real local Ray (``cluster.address``, the session's: tests/conftest.py): a Ray
    start per run would double the time. ``again`` is the session's reference run."""
    root = tmp_path_factory.mktemp("compare")
    for name, extra in RUNS.items():
        run = LaunchedRun(root / name, extra=[f"cluster.address={shared_ray.address}", *extra], base=BASE).start()
        assert run.wait(timeout=600) == 0, run.output()[-3000:]
    return {**{name: root / name for name in RUNS}, "again": reference_run}


def compare(runs: dict[str, Path], *args: str) -> subprocess.CompletedProcess:
    result = cli.runmgr("logbook", "compare", *(str(runs[a]) if a in runs else a for a in args), cwd=ROOT,
                        timeout=120)
    assert result.returncode == 0, result.stderr
    print(result.stdout)
    return result


def judged(runs: dict[str, Path], *args: str) -> dict:
    return json.loads(compare(runs, *args, "--json").stdout)


def test_two_deterministic_runs_of_the_same_config_are_identical(runs):
    assert compare(runs, "ref", "again").stdout.splitlines()[-1] == "verdict: identical"


def test_a_changed_weight_decay_diverges_where_it_leaves_the_band(runs, tmp_path):
    result = judged(runs, "ref", "wd", "--baseline", "ref", "one_rank", "--plot", str(tmp_path / "wd.png"))
    assert result["config_diff"] == {"optim.weight_decay": [0.1, 0.0]}
    assert result["kind"] == "diverging", result["why"]
    step = result["step"]
    for name, metric in result["metrics"].items():
        if metric["kind"] == "diverging":  # inside the band until its step, outside from there
            outside = dict(zip(metric["steps"], metric["outside"]))
            assert outside[metric["step"]] and not any(outside[s] for s in outside if s < metric["step"]), name
            assert metric["step"] >= step
    # Step 1 is computed before the first update: weight decay cannot show there.
    assert result["metrics"]["loss"]["diff"][0] == 0.0 and step >= 2
    assert (tmp_path / "wd.png").read_bytes()[:4] == b"\x89PNG"


def test_reduction_order_noise_is_consistent_with_the_baseline_band(runs):
    result = judged(runs, "ref", "mb4", "--baseline", "ref", "one_rank")
    # the plan says the layout too: one rank is data parallel 1 (the diff names both, issue 32)
    assert result["baseline_config_diff"] == {"cluster.num_workers": [2, 1], "plan.data_parallel_size": [2, 1]}
    assert result["config_diff"] == {"training.micro_batch_size": [2, 4]}
    loss = result["metrics"]["loss"]
    assert any(d != 0 for d in loss["diff"]) and loss["band"][-1] > 0  # real noise on both sides
    assert result["verdict"] == "consistent", result["why"]
