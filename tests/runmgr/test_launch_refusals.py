"""`runmgr launch` refuses a run that cannot start before it writes or starts
anything: one line saying why and how to see the plan, exit code 2, no run
directory (or, for a lineage, its files untouched).

- a plan the cluster in view cannot hold (run12's 992 GPUs on this machine; an
  existing Ray cluster with too few CPUs);
- a setting the built-in trainer cannot execute (ZeRO-1 over tensor parallel, a tensor-parallel
  size that does not divide the heads, ...);
- a resume whose checkpoint holds a model of other shapes than the config
  builds (a changed model.hidden_size).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from logbook import Logbook
from runmgr import cluster as ray_cluster
from runmgr.config.compose import load_run_config
from runmgr.errors import ConfigError
from runmgr.launch import launch
from runmgr.preflight import LaunchRequest, prepare_launch
from runmgr.refusals import refuse_changed_model_shape
from tests import cli
from tests.runmgr.without_ray import RAY_IMPORTED_EXIT, runmgr_without_ray
from trainer.manifest import MANIFEST_NAME, PARAMETERS_FIELD, list_checkpoints

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["model.seq_length=32", "model.max_position_embeddings=32", "data.corpus_max_bytes=200000"]


def runmgr(*args: str) -> subprocess.CompletedProcess:
    return cli.runmgr(*args, cwd=ROOT, timeout=300)


def refused_in_one_line(result: subprocess.CompletedProcess, *expected: str) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    assert result.stdout == ""  # no health table, no progress: nothing started
    return lines[0]


def files_of(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_run12_on_this_machine_names_the_992_devices_it_lacks_and_how_to_see_the_plan(tmp_path):
    run_dir = tmp_path / "run12"
    line = refused_in_one_line(runmgr("launch", "conf=run12", f"run.dir={run_dir}"),
                               "run12 cannot run on the cluster in view",
                               "needs 992 GPUs (992 workers x 1 cuda device), the cluster has ",
                               f"`runmgr launch --dry-run conf=run12 run.dir={run_dir}` shows the plan")
    assert "cannot execute" not in line  # the built-in trainer runs TP 8 with FSDP2: only the devices lack
    assert not run_dir.exists()


def test_a_megatron_node_no_local_node_can_hold_is_refused_before_ray_and_names_the_closest(tmp_path):
    """Issue 26 case 6: two ranks per node on the demo's local nodes of one CPU each. Refused from
    the config, before Ray is imported (no placement wait), naming a node and what to change."""
    run_dir = tmp_path / "run"
    done, wall_s = runmgr_without_ray(tmp_path, "launch", "conf=demo", f"run.dir={run_dir}", "chaos=none",
                                      "trainer.kind=megatron", "megatron.nproc_per_node=2")
    print(f"refused in {wall_s:.2f} s wall")
    assert done.returncode != RAY_IMPORTED_EXIT, done.stderr
    line = refused_in_one_line(done, "demo cannot run on the cluster in view, a local Ray of 3 nodes of 1 CPU",
                               "no node can hold one node of megatron.nproc_per_node=2 ranks (CPU 2 on one node",
                               "the closest, local node 1 of 3, has CPU 1",
                               "set megatron.nproc_per_node=1, or set cluster.local_nodes=1")
    assert line.endswith("megatron.nproc_per_node=2` shows the plan")
    assert not run_dir.exists()


def test_the_refusal_comes_before_ray_is_started(tmp_path, monkeypatch):
    def no_ray(cluster):
        raise AssertionError("Ray was started for a run that cannot run")

    monkeypatch.setattr(ray_cluster, "connect", no_ray)
    with pytest.raises(ConfigError, match=r"parallel.tensor_model_parallel_size \(3\) must divide model.num_attention_heads"):
        launch(prepare_launch(LaunchRequest("demo", (f"run.dir={tmp_path / 'run'}",
                                                     "parallel.tensor_model_parallel_size=3"))))
    assert not (tmp_path / "run").exists()


def test_a_tensor_parallel_size_that_does_not_divide_the_heads_is_refused_by_launch_dry_run_and_lint(tmp_path):
    run_dir = tmp_path / "run"
    overrides = [f"run.dir={run_dir}", "parallel.tensor_model_parallel_size=3"]
    named = "parallel.tensor_model_parallel_size (3) must divide model.num_attention_heads (4)"
    for command in (("launch",), ("launch", "--dry-run"), ("lint",)):
        line = refused_in_one_line(runmgr(*command, "conf=demo", *overrides), named)
        assert line.startswith("runmgr: error: ")
    assert not run_dir.exists()


@pytest.mark.parametrize("conf, executable", [("run12", True), ("llama2_70b", False)])
def test_the_big_recipes_dry_run_and_say_whether_the_built_in_trainer_can_execute_them(conf, executable):
    """run12's TP 8 with FSDP2 runs in the built-in trainer; llama2_70b's ZeRO-1 over TP 8 does not yet."""
    plan = runmgr("launch", "--dry-run", f"conf={conf}")
    assert plan.returncode == 0, plan.stderr
    assert "TP 8" in plan.stdout
    assert ("CANNOT be executed: the built-in trainer" in plan.stdout) is not executable


def test_an_existing_cluster_too_small_for_the_plan_is_named_by_its_address(tmp_path, shared_ray):
    """The session's Ray (one node of 2 CPUs, tests/conftest.py): the refusal starts nothing on it.
    A real cluster whose nodes hold the run's CPUs in all but no Megatron node on one:
    tests/runmgr/healthcheck/test_driver_only_head.py, on that module's cluster of 1-CPU nodes."""
    run_dir = tmp_path / "run"
    refused_in_one_line(
        runmgr("launch", "conf=demo", f"run.dir={run_dir}", f"cluster.address={shared_ray.address}",
               "cluster.num_workers=4", "health.skip=true"),
        f"cannot run on the cluster in view, Ray cluster at {shared_ray.address}: needs 4 CPUs for 4 workers, "
        "the cluster has 2")
    assert not run_dir.exists()


@pytest.fixture(scope="module")
def trained_lineage(tmp_path_factory) -> Path:
    """A run directory whose checkpoints the real trainer wrote (one rank, 2 steps)."""
    run_dir = tmp_path_factory.mktemp("lineage") / "run"
    # `python -m trainer` forked from the session's CLI fork server (torch imported once: tests/cli.py).
    done = cli.runmgr("conf=demo", "training.train_iters=2", "checkpoint.save_interval=2",
                      f"checkpoint.save={run_dir / 'checkpoints'}", *SMALL, module="trainer", cwd=ROOT, timeout=300,
                      env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-3000:]
    Logbook.open(run_dir).close()  # the lineage's logbook, as a previous launch leaves it
    return run_dir


@pytest.fixture
def lineage(trained_lineage, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trained_lineage, copy)
    return copy


def test_a_resume_with_a_changed_hidden_size_is_refused_and_the_lineage_is_left_untouched(lineage):
    before = files_of(lineage)
    line = refused_in_one_line(runmgr("launch", "conf=demo", f"run.dir={lineage}", "model.hidden_size=64", *SMALL),
                               f"cannot resume from {lineage / 'checkpoints' / 'step_00000002'}",
                               "embedding.weight is [256, 128] there, [256, 64] here")
    assert "set the model as it was" in line
    assert files_of(lineage) == before  # no sub-run opened, nothing written


def test_the_same_model_resumes_and_a_checkpoint_without_shapes_gets_a_note(lineage):
    config = load_run_config("demo", [f"run.dir={lineage}", *SMALL])
    assert refuse_changed_model_shape(config) is None
    manifest_path = list_checkpoints(lineage / "checkpoints")[-1] / MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text())
    del manifest[PARAMETERS_FIELD]  # as written before manifests recorded shapes
    manifest_path.write_text(json.dumps(manifest))
    changed = load_run_config("demo", [f"run.dir={lineage}", "model.hidden_size=64", *SMALL])
    note = refuse_changed_model_shape(changed)
    assert note is not None and "records no model shapes" in note


def test_a_metrics_port_in_use_is_refused_before_anything_starts(tmp_path):
    run_dir = tmp_path / "scraped"
    with socket.socket() as taken:  # another exporter (or anything) already listens there
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        result = runmgr("launch", "conf=demo", f"run.dir={run_dir}", f"metrics.address={address}", *SMALL)
    refused_in_one_line(result, f"metrics.address '{address}': cannot listen there", "in use",
                        "metrics.address=127.0.0.1:0")
    assert not run_dir.exists()
