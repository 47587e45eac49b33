"""The RayJob of each overlay: what it runs on the head (the health check
with --k8s-label, then the launch), that its command lines are ones runmgr
accepts, and that the run's config (ConfigMap runmgr-job, k8s.yaml) composes
into a valid run that fits the cluster the overlay asks for."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from runmgr.cli import build_parser, parse_args
from runmgr.config.compose import load_run_config
from runmgr.config.schema import RunConfig
from tests.k8s.manifests import (OVERLAYS, ROOT, config_map_data, head_group, mount_at, rank_groups, rayjob, render,
                                 worker_groups)

JOB_SCRIPT = ROOT / "k8s" / "base" / "job.sh"
DEVICE_OF_GROUP = {"gpu": ("cuda", "nvidia.com/gpu"), "npu": ("npu", "huawei.com/Ascend910"), "cpu": ("cpu", None)}
"""Worker group -> (the run's ``device``, the resource its pods hold one of per device)."""


def runmgr_lines(script: str) -> list[list[str]]:
    """The runmgr command lines of a shell script, as argument lists."""
    lines = [shlex.split(line.strip()) for line in script.splitlines() if not line.strip().startswith("#")]
    return [words[words.index("runmgr") + 1:] for words in lines if "runmgr" in words[:2]]


def launch_overrides(script: str) -> list[str]:
    (launch,) = [argv for argv in runmgr_lines(script) if argv[0] == "launch"]
    return [item for item in launch[1:] if "=" in item and not item.startswith("conf=")]


def composed(overlay: str, tmp_path: Path, overrides: list[str] = ()) -> RunConfig:
    """The run's config as the pods compose it: k8s.yaml beside the image's conf/."""
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (conf / "k8s.yaml").write_text(config_map_data(render(overlay), "runmgr-job")["k8s.yaml"])
    return load_run_config("k8s", list(overrides), conf)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_job_runs_the_script_of_its_configmap_and_then_shuts_the_cluster_down(overlay):
    docs = render(overlay)
    job = rayjob(docs)
    assert job["spec"]["shutdownAfterJobFinishes"] is True
    # KubeRay pastes the entrypoint into the submitter's shell line: one plain command.
    entrypoint = job["spec"]["entrypoint"]
    assert not re.search(r"[;&|$`'\"<>(){}]", entrypoint), entrypoint
    (script_path,) = [w for w in entrypoint.split() if w.endswith(".sh")]
    (head,) = head_group(job)["template"]["spec"]["containers"]
    mount = mount_at(head, str(Path(script_path).parent))
    volume = next(v for v in head_group(job)["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    assert config_map_data(docs, volume["configMap"]["name"])[Path(script_path).name] == JOB_SCRIPT.read_text()


def test_the_job_checks_the_nodes_with_k8s_labels_before_it_launches():
    lines = runmgr_lines(JOB_SCRIPT.read_text())
    assert [argv[0] for argv in lines] == ["health-check", "launch"]
    assert "--k8s-label" in lines[0] and "conf=k8s" in lines[0] and "conf=k8s" in lines[1]
    for argv in lines:
        parse_args(build_parser(), argv)  # exits 2 on a line runmgr would refuse
    assert "metrics.address=0.0.0.0:8000" in lines[1]  # the metrics Service's port


@pytest.mark.parametrize("check_exit, launched, job_exit", [(0, True, 0), (1, True, 0), (2, False, 2), (3, False, 3)])
def test_the_launch_follows_the_health_check_s_exit_code(tmp_path, check_exit, launched, job_exit):
    """0 (all admitted) and 1 (some excluded, the launch leaves them out) go
    on; 2 (bad config) and 3 (labels refused) stop the job with that code."""
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "runmgr"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "$1" >> "$CALLS"\n[ "$1" = health-check ] && exit "$CHECK_EXIT"\nexit 0\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "CALLS": str(calls),
           "CHECK_EXIT": str(check_exit)}
    result = subprocess.run(["sh", str(JOB_SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == job_exit, result.stderr
    assert calls.read_text().split() == (["health-check", "launch"] if launched else ["health-check"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_run_config_composes_and_fits_the_cluster(overlay, tmp_path):
    config = composed(overlay, tmp_path)
    job = rayjob(render(overlay))
    (worker,) = worker_groups(job)
    device, resource = DEVICE_OF_GROUP[worker["groupName"]]
    assert config.device.value == device and config.cluster.address == "auto"
    assert config.unsupported() is None  # the built-in trainer runs all of it
    assert config.run_dir().is_relative_to("/shared")  # the logbook outlives the cluster
    ranks = 0
    for group in rank_groups(job).values():
        (container,) = group["template"]["spec"]["containers"]
        limits = container["resources"]["limits"]
        per_pod = int(limits[resource]) // config.cluster.devices_per_worker if resource else 1
        assert per_pod * config.cluster.cpus_per_worker <= float(limits["cpu"])
        ranks += group["replicas"] * per_pod
    assert ranks == config.cluster.num_workers


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_launch_line_s_settings_are_ones_the_config_knows(overlay, tmp_path):
    overrides = launch_overrides(JOB_SCRIPT.read_text())
    config = composed(overlay, tmp_path, overrides)
    assert config.health.skip is True  # the job's health check just ran
    assert config.metrics.enabled and config.metrics.address == "0.0.0.0:8000"  # what the Service targets
