"""The Dockerfile installs runmgr as the README does (the Makefile's pinned
torch, then the project itself) with the Ray the manifests declare, and puts
the configs where the pods compose the run's. No image is built here (no
Docker engine runs on the test machines): the file is checked against the
Makefile, pyproject.toml and the rendered manifests."""

from __future__ import annotations

import fnmatch
import re
import shlex

import pytest

from runmgr.config.compose import CONF_DIR_ENV
from tests.k8s.manifests import OVERLAYS, ROOT, head_group, rayjob, render

DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def build_args() -> dict[str, str]:
    return dict(arg.split("=", 1) for kind, arg in instructions() if kind == "ARG" and "=" in arg)


def env() -> dict[str, str]:
    pairs = [shlex.split(arg) for kind, arg in instructions() if kind == "ENV"]
    return dict(item.split("=", 1) for words in pairs for item in words)


def pip_install_words() -> list[str]:
    (line,) = [arg for kind, arg in instructions() if kind == "RUN" and "pip install" in arg]
    words = shlex.split(line.split("&&")[0])
    return words[words.index("install") + 1:]


def test_the_image_pins_the_makefile_s_torch_and_installs_the_project():
    makefile_torch = re.search(r"^TORCH \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert build_args()["TORCH"] == makefile_torch == "torch==2.13.0"
    words = pip_install_words()
    assert "$TORCH" in words and "ray[default]==$RAY_VERSION" in words
    assert any(w == "." or w.startswith(".${EXTRAS") for w in words)  # `pip install .`, extras optional
    assert not any(w == "-e" for w in words)  # installed, not linked to a source tree


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_image_s_ray_is_the_one_the_rayjob_declares(overlay):
    assert rayjob(render(overlay))["spec"]["rayClusterSpec"]["rayVersion"] == build_args()["RAY_VERSION"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_run_config_lands_in_the_image_s_config_directory(overlay):
    """The pods compose conf=k8s from the image's conf/ groups plus the
    ConfigMap's k8s.yaml, mounted into that directory."""
    (head,) = head_group(rayjob(render(overlay)))["template"]["spec"]["containers"]
    mounts = [m for m in head["volumeMounts"] if m.get("subPath") == "k8s.yaml"]
    assert [m["mountPath"] for m in mounts] == [f"{env()[CONF_DIR_ENV]}/k8s.yaml"]
    workdir = [arg for kind, arg in instructions() if kind == "WORKDIR"][-1]
    assert env()[CONF_DIR_ENV] == f"{workdir}/conf"
    assert ("COPY", ". .") in instructions()


def test_the_build_context_keeps_every_package_and_the_configs():
    ignored = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
               if p.strip() and not p.startswith("#")]
    # [tool.setuptools.packages.find] include = ["runmgr*", ...] (tomllib is 3.11+; we support 3.10)
    include = re.search(r"^include = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    packages = [name.strip().strip('"').rstrip("*") for name in include.split(",")]
    needed = ["pyproject.toml", "README.md", "conf", *packages]
    assert all((ROOT / name).exists() for name in needed)
    assert not [name for name in needed if any(fnmatch.fnmatch(name, pattern) for pattern in ignored)]
