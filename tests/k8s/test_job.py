"""The RayJob of each overlay: what it runs on the head (the health check
with --k8s-label, then the launch), that its command lines are ones runmgr
accepts, that a lost head or driver is submitted again, and that the run's
config (ConfigMap runmgr-job, k8s.yaml) composes with runmgr's own loader
into a valid run that fits the cluster the overlay asks for, with a spare
node where excluded nodes are replaced; for the Megatron overlays, that the
user's job is what runs and that runmgr's dry run plans it."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from runmgr.cli import build_parser, parse_args
from runmgr.config.argv import flag_value
from runmgr.config.compose import CONF_DIR_ENV, load_run_config
from runmgr.config.schema import RunConfig
from runmgr.errors import ConfigError
from tests import cli
from tests.k8s.manifests import (K8S, OVERLAYS, ROOT, config_map_data, head_group, mount_at, rank_groups, rayjob,
                                 render, worker_groups)

JOB_SCRIPT = ROOT / "k8s" / "base" / "job.sh"
DEVICE_OF_GROUP = {"gpu": ("cuda", "nvidia.com/gpu"), "npu": ("npu", "huawei.com/Ascend910"), "cpu": ("cpu", None)}
"""Worker group -> (the run's ``device``, the resource its pods hold one of per device)."""
REPLACING = ("gpu", "npu", "megatron-gpu", "mindspeed-npu")
"""The overlays whose driver hands an excluded node's pod back to KubeRay (kubernetes.replace_excluded_nodes)."""
MEGATRON = {"megatron-gpu": "megatron_lm", "mindspeed-npu": "mindspeed_llm"}
"""The overlays that run a user's own Megatron job, and its flavor."""
RESUBMISSIONS = 3
"""KubeRay submits a failed job (a lost head, a dead driver) again this many times."""


def run_yaml(overlay: str) -> str:
    """The run's config as the overlay ships it (the ConfigMap's k8s.yaml)."""
    return config_map_data(render(overlay), "runmgr-job")["k8s.yaml"]


def conf_dir(tmp_path: Path, text: str) -> Path:
    """The image's conf/ groups with ``text`` as k8s.yaml beside them, as the pods have it."""
    conf = tmp_path / "conf"
    if not conf.exists():
        shutil.copytree(ROOT / "conf", conf)
    (conf / "k8s.yaml").write_text(text)
    return conf


def stand_in_script(tmp_path: Path) -> str:
    """A file where the job's script would be: megatron.script must name one, and
    only the user's image holds the real pretrain_gpt.py (k8s/image/Dockerfile checks it)."""
    script = tmp_path / "pretrain_gpt.py"
    script.write_text("# the user's script is in the image\n")
    return str(script)


def runmgr_lines(script: str) -> list[list[str]]:
    """The runmgr command lines of a shell script, as argument lists."""
    lines = [shlex.split(line.strip()) for line in script.splitlines() if not line.strip().startswith("#")]
    return [words[words.index("runmgr") + 1:] for words in lines if "runmgr" in words[:2]]


def launch_overrides(script: str) -> list[str]:
    (launch,) = [argv for argv in runmgr_lines(script) if argv[0] == "launch"]
    return [item for item in launch[1:] if "=" in item and not item.startswith("conf=")]


def composed(overlay: str, tmp_path: Path, overrides: list[str] = (), text: str | None = None) -> RunConfig:
    """The run's config as the pods compose it (k8s.yaml beside the image's conf/),
    through runmgr's own loader: an unknown key or a bad value raises ConfigError.
    A Megatron job's script is a stand-in file here (it is in the user's image)."""
    conf = conf_dir(tmp_path, text or run_yaml(overlay))
    script = [f"megatron.script={stand_in_script(tmp_path)}"] if overlay in MEGATRON else []
    return load_run_config("k8s", [*script, *overrides], conf)


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
def test_a_lost_head_or_driver_is_submitted_again(overlay):
    """The driver runs on the head: losing either fails the job, and KubeRay
    submits it again on a new RayCluster; the run directory on the shared
    volume (next test) makes each attempt resume the run."""
    spec = rayjob(render(overlay))["spec"]
    assert spec["backoffLimit"] == RESUBMISSIONS
    assert spec.get("submissionMode", "K8sJobMode") == "K8sJobMode"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_run_config_composes_and_fits_the_cluster(overlay, tmp_path):
    """cluster.num_workers is the training nodes' ranks: the worker group holds
    those nodes whole, plus spares (at least one where excluded nodes are
    replaced); each pod has the CPUs its ranks ask for."""
    config = composed(overlay, tmp_path)
    job = rayjob(render(overlay))
    (worker,) = worker_groups(job)
    device, resource = DEVICE_OF_GROUP[worker["groupName"]]
    assert config.device.value == device and config.cluster.address == "auto"
    assert config.run_dir().is_relative_to("/shared")  # the logbook outlives the cluster
    if overlay not in MEGATRON:
        assert config.unsupported() is None  # the built-in trainer runs all of it
    assert set(rank_groups(job)) == {worker["groupName"]}  # the head holds none
    (container,) = worker["template"]["spec"]["containers"]
    limits = container["resources"]["limits"]
    per_pod = int(limits[resource]) // config.cluster.devices_per_worker if resource else 1
    if config.drives_megatron:
        assert per_pod == config.megatron.nproc_per_node == 8  # one torchrun of 8 ranks per node
    assert per_pod * config.cluster.cpus_per_worker <= float(limits["cpu"])
    training_nodes, partial = divmod(config.cluster.num_workers, per_pod)
    assert partial == 0 and training_nodes >= 1
    assert worker["replicas"] == worker["minReplicas"] == worker["maxReplicas"]
    spares = worker["replicas"] - training_nodes
    assert spares >= (1 if config.kubernetes.replace_excluded_nodes else 0), (worker["replicas"], training_nodes)
    if overlay in REPLACING:
        assert config.kubernetes.replace_excluded_nodes is True
    if overlay == "cpu":  # the laptop is the only node: nothing to replace it with
        assert config.kubernetes.replace_excluded_nodes is False and spares == 0


@pytest.mark.parametrize("overlay", REPLACING)
def test_replacing_overlays_keep_a_spare_node(overlay, tmp_path):
    """Where an excluded node's pod is handed back to KubeRay, a spare pod
    stands by: worker replicas exceed the training nodes."""
    config = composed(overlay, tmp_path)
    (worker,) = worker_groups(rayjob(render(overlay)))
    per_pod = config.megatron.nproc_per_node if config.drives_megatron else 8 // config.cluster.devices_per_worker
    assert config.kubernetes.replace_excluded_nodes is True
    assert worker["replicas"] > config.cluster.num_workers // per_pod


@pytest.mark.parametrize("overlay", sorted(MEGATRON))
def test_the_megatron_overlays_run_the_user_s_job_from_the_shared_volume(overlay, tmp_path):
    """trainer.kind=megatron with the overlay's flavor, the script where the
    image recipe puts it, 8 ranks per node, and every path the job reads or
    writes on the shared volume (the checkpoints under the run directory)."""
    raw = yaml.safe_load(run_yaml(overlay))
    config = composed(overlay, tmp_path)
    assert config.drives_megatron and config.megatron.flavor.value == MEGATRON[overlay]
    assert config.megatron.nproc_per_node == 8 and config.cluster.devices_per_worker == 1
    args = raw["megatron"]["args"]
    paths = {flag: flag_value(args, flag) for flag in ("--save", "--data-path", "--tokenizer-model")}
    assert all(value and value.startswith("/shared/") for value in paths.values()), paths
    assert Path(paths["--save"]).is_relative_to(config.run_dir())
    assert config.checkpoint_dir() == Path(paths["--save"])
    assert flag_value(args, "--log-interval") == "1"  # the watcher judges every iteration's loss
    assert raw["megatron"]["script"].endswith("/pretrain_gpt.py")


def test_the_megatron_lm_script_is_where_the_image_recipe_puts_it():
    """k8s/image/Dockerfile's default MEGATRON_SCRIPT (Megatron-LM cloned into
    MEGATRON_DIR) is the script megatron-gpu runs; the MindSpeed build line the
    recipe shows names mindspeed-npu's."""
    from tests.k8s.test_image import recipe_build_args

    args = recipe_build_args()
    assert yaml.safe_load(run_yaml("megatron-gpu"))["megatron"]["script"] == args["MEGATRON_SCRIPT"]
    mindspeed = yaml.safe_load(run_yaml("mindspeed-npu"))["megatron"]["script"]
    assert f"--build-arg MEGATRON_SCRIPT={mindspeed}" in (K8S / "image" / "Dockerfile").read_text()


@pytest.mark.parametrize("overlay", sorted(MEGATRON))
@pytest.mark.parametrize("misspelt", [("nproc_per_node:", "nprocs_per_node:"),
                                      ("replace_excluded_nodes:", "replace_excluded_node:"),
                                      ("num_workers:", "num_worker:")])
def test_a_misspelt_key_in_the_run_fails_to_compose(overlay, misspelt, tmp_path):
    """The loader the pods use refuses the run (one line), so a key the
    overlay's run.yaml spells wrong cannot pass these tests."""
    text = run_yaml(overlay)
    assert misspelt[0] in text
    with pytest.raises(ConfigError, match="unknown config key"):
        composed(overlay, tmp_path, text=text.replace(misspelt[0], misspelt[1], 1))


@pytest.mark.parametrize("overlay", sorted(MEGATRON))
def test_runmgr_s_dry_run_plans_the_megatron_job(overlay, tmp_path):
    """`runmgr launch conf=k8s --dry-run` as the head would run it (the image's
    conf/ and the ConfigMap's k8s.yaml): lint and plan pass, and the plan is
    the overlay's layout with room on a device (80 GB GPUs, 64 GB NPUs)."""
    conf = conf_dir(tmp_path, run_yaml(overlay))
    env = {**os.environ, CONF_DIR_ENV: str(conf), "PYTHONPATH": str(ROOT)}
    # Its own process (the conf/ directory from the environment, as the pod's), forked from the
    # session's CLI fork server (tests/cli.py), which imported the CLI and torch once.
    result = cli.runmgr("launch", "conf=k8s", "--dry-run", f"megatron.script={stand_in_script(tmp_path)}",
                        cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "world size 64 = TP 8 x PP 4 x DP 2" in result.stdout
    memory = re.search(r"memory/device\s+([\d.]+) GiB", result.stdout)
    assert memory and float(memory.group(1)) < 60, result.stdout


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_launch_line_s_settings_are_ones_the_config_knows(overlay, tmp_path):
    overrides = launch_overrides(JOB_SCRIPT.read_text())
    config = composed(overlay, tmp_path, overrides)
    assert config.health.skip is True  # the job's health check just ran
    assert config.metrics.enabled and config.metrics.address == "0.0.0.0:8000"  # what the Service targets
