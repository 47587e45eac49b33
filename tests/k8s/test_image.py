"""The images of k8s/, checked without building them (no Docker engine runs
on the test machines): against the Makefile, pyproject.toml and the rendered
manifests, and, for the recipe on the user's base, by running its pieces.

- Dockerfile, runmgr's own image (cpu, gpu, npu overlays): installs runmgr as
  the README does (the Makefile's pinned torch, then the project itself).
- k8s/image/Dockerfile, runmgr added to the user's NGC PyTorch or
  MindSpeed-LLM image (megatron-gpu, mindspeed-npu): no install line can
  replace the base's torch (every one constrained by the base's own versions,
  none naming torch, the project without its dependencies, and a check that
  nothing pinned changed), its dependency list is pyproject's less torch, and
  the job's script must be in the image.

Both: the Ray the manifests declare, the configs where the pods compose the run's."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from runmgr.config.compose import CONF_DIR_ENV
from tests.k8s.manifests import K8S, OVERLAYS, ROOT, head_group, rayjob, render

DOCKERFILE = ROOT / "Dockerfile"
RECIPE = K8S / "image" / "Dockerfile"
"""runmgr on the user's own base image (its torch, Transformer Engine, apex / torch_npu, MindSpeed)."""
PIN_BASE = K8S / "image" / "pin_base.py"
TORCH_FAMILY = {"torch", "torch-npu", "torchvision", "torchaudio", "triton", "transformer-engine", "apex"}
"""Packages the base image built together: no install line of the recipe may name one."""
REPLACING_FLAGS = {"-U", "--upgrade", "--force-reinstall", "-I", "--ignore-installed", "--upgrade-strategy",
                   "-e", "--editable", "-r", "--requirement", "--no-index", "--index-url", "-i", "--extra-index-url"}
"""pip options that could replace an installed package, or install what this test cannot read."""
IMAGES = (DOCKERFILE, RECIPE)


def instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined."""
    return parse_instructions(path.read_text())


def parse_instructions(text: str) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", text)
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def substitute(text: str, values: dict[str, str]) -> str:
    """``$VAR`` and ``${VAR}`` replaced as Docker does for build args (unknown ones left)."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values.get(m.group(1) or m.group(2), m.group(0)), text)


def build_args(path: Path = DOCKERFILE) -> dict[str, str]:
    """ARG defaults, each with the ARGs before it substituted (as Docker does)."""
    values: dict[str, str] = {}
    for kind, arg in instructions(path):
        if kind == "ARG" and "=" in arg:
            name, value = arg.split("=", 1)
            values[name] = substitute(value, values)
    return values


def recipe_build_args() -> dict[str, str]:
    return build_args(RECIPE)


def env(path: Path = DOCKERFILE) -> dict[str, str]:
    pairs = [shlex.split(arg) for kind, arg in instructions(path) if kind == "ENV"]
    return dict(item.split("=", 1) for words in pairs for item in words)


def shell_commands(text: str) -> list[list[str]]:
    """Every simple command of the RUN lines (split at ``&&``, ``;`` and ``||``), as words,
    with leading ``NAME=value`` assignments left out."""
    commands = []
    for kind, arg in parse_instructions(text):
        if kind != "RUN":
            continue
        for part in re.split(r"&&|\|\||;", arg):
            words = shlex.split(part, posix=True)
            while words and re.fullmatch(r"\w+=\S*", words[0]):
                words = words[1:]
            if words:
                commands.append(words)
    return commands


def pip_installs(text: str) -> list[list[str]]:
    """The arguments of each ``pip install`` the RUN lines run (``python3 -m pip install ...``)."""
    found = []
    for words in shell_commands(text):
        for start in range(len(words) - 1):
            if words[start] == "pip" and words[start + 1] == "install":
                found.append(words[start + 2:])
                break
    return found


def split_install(words: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """(options -> their values, requirement words) of one ``pip install``."""
    with_value = {"-c", "--constraint", "-r", "--requirement", "-i", "--index-url", "--extra-index-url",
                  "--upgrade-strategy"}
    options: dict[str, list[str]] = {}
    requirements: list[str] = []
    items = iter(words)
    for word in items:
        if word.startswith("-"):
            options.setdefault(word, []).append(next(items) if word in with_value else "")
        else:
            requirements.append(word)
    return options, requirements


def recipe_requirements(text: str) -> list[str]:
    """The dependency list of the recipe: the requirements of its installs, less the
    project itself and the user's own additions ($EXTRA_PIP)."""
    args = recipe_args(text)
    return [substitute(word, args) for words in pip_installs(text) for word in split_install(words)[1]
            if word != "." and not word.startswith("$")]


def recipe_args(text: str) -> dict[str, str]:
    """The ARG defaults of a recipe's text, unsubstituted."""
    return {name: value for name, value in
            (a.split("=", 1) for kind, a in parse_instructions(text) if kind == "ARG" and "=" in a)}


def install_problems(text: str) -> list[str]:
    """Why the recipe ``text`` could replace the base image's torch (or anything the
    base holds), one line each; empty when no install line can."""
    pinned = re.findall(r"pin_base\.py\s*>\s*(\S+)", text)
    if not pinned:
        return ["the base's distributions are never pinned (python3 k8s/image/pin_base.py > FILE)"]
    constraints = pinned[0]
    installs = pip_installs(text)
    problems = [] if installs else ["no pip install"]
    for words in installs:
        options, requirements = split_install(words)
        line = " ".join(words)
        if constraints not in options.get("-c", []) + options.get("--constraint", []):
            problems.append(f"not constrained by the base's versions ({constraints}): {line}")
        problems += [f"{flag} may replace what the base holds: {line}" for flag in sorted(REPLACING_FLAGS & set(options))]
        for word in requirements:
            if word == ".":
                if "--no-deps" not in options:
                    problems.append(f"the project with its dependencies (its pyproject names torch): {line}")
            elif not word.startswith("$"):
                name = canonicalize_name(Requirement(substitute(word, recipe_args(text))).name)
                if name in TORCH_FAMILY:
                    problems.append(f"installs {name}, which the base built together with torch: {line}")
    checks = [words for words in shell_commands(text) if "--check" in words and any("pin_base.py" in w for w in words)]
    if not checks or checks[0][-1] != constraints:
        problems.append(f"no check after the installs that the base's versions are unchanged "
                        f"(pin_base.py --check {constraints})")
    elif text.rfind("pin_base.py --check") < text.rfind("pip install"):
        problems.append("the check of the base's versions runs before the last install")
    return problems


def pyproject_dependencies() -> list[str]:
    """[project] dependencies of pyproject.toml (tomllib is 3.11+; we support 3.10)."""
    block = re.search(r"^dependencies = \[(.*?)^\]", (ROOT / "pyproject.toml").read_text(), re.M | re.S).group(1)
    lines = [line.split("#", 1)[0] for line in block.splitlines()]
    return re.findall(r'"([^"]+)"', "\n".join(lines))


def by_name(requirements: list[str]) -> dict[str, Requirement]:
    parsed = [Requirement(r) for r in requirements]
    assert len({canonicalize_name(r.name) for r in parsed}) == len(parsed), requirements
    return {canonicalize_name(r.name): r for r in parsed}


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
@pytest.mark.parametrize("image", IMAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_image_s_ray_is_the_one_the_rayjob_declares(overlay, image):
    assert rayjob(render(overlay))["spec"]["rayClusterSpec"]["rayVersion"] == build_args(image)["RAY_VERSION"]


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("image", IMAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_run_config_lands_in_the_image_s_config_directory(overlay, image):
    """The pods compose conf=k8s from the image's conf/ groups plus the
    ConfigMap's k8s.yaml, mounted into that directory."""
    (head,) = head_group(rayjob(render(overlay)))["template"]["spec"]["containers"]
    mounts = [m for m in head["volumeMounts"] if m.get("subPath") == "k8s.yaml"]
    assert [m["mountPath"] for m in mounts] == [f"{env(image)[CONF_DIR_ENV]}/k8s.yaml"]
    workdir = [arg for kind, arg in instructions(image) if kind == "WORKDIR"][-1]
    assert env(image)[CONF_DIR_ENV] == f"{workdir}/conf"
    assert ("COPY", ". .") in instructions(image)


def test_the_recipe_starts_from_the_user_s_image_and_installs_into_its_python():
    """FROM the user's base (NGC PyTorch by default); runmgr goes into the
    base's own environment, where the job's torch is (docs/megatron.md: the
    nodes' actors run torchrun with runmgr's interpreter), not into a venv."""
    steps = instructions(RECIPE)
    assert steps[[kind for kind, _ in steps].index("FROM")] == ("FROM", "${BASE}")
    assert recipe_build_args()["BASE"].startswith("nvcr.io/nvidia/pytorch:")
    assert not [words for words in shell_commands(RECIPE.read_text()) if "venv" in words or "virtualenv" in words]
    assert "VIRTUAL_ENV" not in env(RECIPE)
    assert all(words[:3] == ["python3", "-m", "pip"] for words in shell_commands(RECIPE.read_text())
               if "pip" in words)


def test_no_install_line_of_the_recipe_can_replace_the_base_s_torch():
    assert install_problems(RECIPE.read_text()) == []


def _add_to_list(text: str, requirement: str) -> str:
    return text.replace('"numpy" \\', f'"numpy" "{requirement}" \\', 1)


@pytest.mark.parametrize("mutate, says", [
    (lambda t: _add_to_list(t, "torch>=2.4"), "installs torch"),
    (lambda t: _add_to_list(t, "torch_npu"), "installs torch-npu"),
    (lambda t: t.replace("-c /opt/runmgr/base-constraints.txt \\\n        \"numpy\"", "\"numpy\"", 1),
     "not constrained"),
    (lambda t: t.replace("--no-deps .", "."), "with its dependencies"),
    (lambda t: t.replace("--no-deps .", "--no-deps --upgrade ."), "--upgrade may replace"),
    (lambda t: t.replace("pin_base.py --check", "pin_base.py --help"), "no check after the installs"),
    (lambda t: t.replace("python3 k8s/image/pin_base.py > /opt/runmgr/base-constraints.txt", "true"),
     "never pinned"),
], ids=["torch", "torch_npu", "unconstrained", "project-deps", "upgrade", "no-check", "no-pins"])
def test_the_recipe_check_fails_a_recipe_that_could(mutate, says):
    text = RECIPE.read_text()
    changed = mutate(text)
    assert changed != text, "the mutation no longer applies: update it with the recipe"
    assert any(says in line for line in install_problems(changed)), install_problems(changed)


def test_the_recipe_installs_pyproject_s_dependencies_less_torch_and_the_rayjob_s_ray():
    project = by_name(pyproject_dependencies())
    assert "torch" in project  # what the recipe leaves to the base
    recipe = by_name(recipe_requirements(RECIPE.read_text()))
    assert set(recipe) == set(project) - {"torch"}
    ray_version = recipe_build_args()["RAY_VERSION"]
    assert str(recipe["ray"].specifier) == f"=={ray_version}"
    assert recipe["ray"].extras == project["ray"].extras and project["ray"].specifier.contains(ray_version)
    for name in set(recipe) - {"ray"}:
        assert (recipe[name].extras, recipe[name].specifier) == (project[name].extras, project[name].specifier), name


def test_pin_base_pins_every_installed_distribution_and_sees_a_change(tmp_path):
    """The recipe's own pinning, run here: this environment's torch (and every
    other distribution) comes out pinned at its version; --check passes on it,
    and fails, naming torch, once torch is not the pinned one."""
    pins = subprocess.run([sys.executable, str(PIN_BASE)], capture_output=True, text=True, timeout=120)
    assert pins.returncode == 0, pins.stderr
    lines = set(pins.stdout.splitlines())
    assert f"torch=={importlib.metadata.version('torch')}" in lines
    assert f"pytest=={importlib.metadata.version('pytest')}" in lines
    (tmp_path / "pins.txt").write_text(pins.stdout)
    same = subprocess.run([sys.executable, str(PIN_BASE), "--check", str(tmp_path / "pins.txt")],
                          capture_output=True, text=True, timeout=120)
    assert same.returncode == 0, same.stderr
    (tmp_path / "moved.txt").write_text(re.sub(r"^torch==.*$", "torch==1.0.0", pins.stdout, flags=re.M))
    moved = subprocess.run([sys.executable, str(PIN_BASE), "--check", str(tmp_path / "moved.txt")],
                           capture_output=True, text=True, timeout=120)
    assert moved.returncode == 1 and "torch 1.0.0 -> " in moved.stderr


def _script_step() -> str:
    """The recipe's RUN that fetches the job's code and checks its script."""
    (step,) = [arg for kind, arg in parse_instructions(RECIPE.read_text()) if kind == "RUN" and "MEGATRON_SCRIPT" in arg]
    return step


@pytest.mark.parametrize("ref, script_there, ok", [("", True, True), ("", False, False), ("core_v0.17.0", None, True)])
def test_the_recipe_fetches_the_job_at_its_ref_or_stops_without_its_script(tmp_path, ref, script_there, ok):
    """The step as the build runs it (git replaced by a stand-in that checks out a
    pretrain_gpt.py): a ref clones and checks it out detached; no ref uses the
    base's copy; a missing script stops the build with one line."""
    bin_dir, code = tmp_path / "bin", tmp_path / "megatron"
    bin_dir.mkdir()
    (bin_dir / "git").write_text('#!/bin/sh\necho "$@" >> "$GIT_CALLS"\n'
                                 'if [ "$1" = clone ]; then mkdir -p "$4" && touch "$4/pretrain_gpt.py"; fi\n')
    (bin_dir / "git").chmod(0o755)
    if script_there:
        code.mkdir()
        (code / "pretrain_gpt.py").touch()
    calls = tmp_path / "calls"
    args = recipe_build_args()
    env_ = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GIT_CALLS": str(calls),
            "MEGATRON_REPO": args["MEGATRON_REPO"], "MEGATRON_REF": ref, "MEGATRON_DIR": str(code),
            "MEGATRON_SCRIPT": str(code / "pretrain_gpt.py")}
    result = subprocess.run(["sh", "-c", _script_step()], env=env_, capture_output=True, text=True, timeout=60)
    assert (result.returncode == 0) is ok, result.stderr
    if not ok:
        assert f"no {code / 'pretrain_gpt.py'} in the image" in result.stderr
    git = calls.read_text().splitlines() if calls.exists() else []
    assert git == ([f"clone --filter=blob:none {args['MEGATRON_REPO']} {code}",
                    f"-C {code} checkout --detach {ref}"] if ref else [])


def test_the_build_context_keeps_every_package_and_the_configs():
    ignored = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
               if p.strip() and not p.startswith("#")]
    # [tool.setuptools.packages.find] include = ["runmgr*", ...] (tomllib is 3.11+; we support 3.10)
    include = re.search(r"^include = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    packages = [name.strip().strip('"').rstrip("*") for name in include.split(",")]
    needed = ["pyproject.toml", "README.md", "conf", *packages, "k8s/image/pin_base.py"]  # the last: the recipe runs it
    assert all((ROOT / name).exists() for name in needed)
    assert not [name for name in needed if any(fnmatch.fnmatch(part, pattern) for pattern in ignored
                                               for part in (name, *Path(name).parents))]
