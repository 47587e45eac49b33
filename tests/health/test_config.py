import ast
import dataclasses
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import health.config as config_module
from health.config import HealthConfig, HealthConfigError, MountSpec, health_config_from_dict

CONF_DIR = Path(__file__).resolve().parents[2] / "conf" / "health"


def default_yaml():
    return yaml.safe_load((CONF_DIR / "default.yaml").read_text())


def test_default_yaml_mirrors_the_dataclasses_key_for_key():
    data = default_yaml()
    assert health_config_from_dict(data) == HealthConfig()
    assert set(data) == {f.name for f in dataclasses.fields(HealthConfig)}
    for section in dataclasses.fields(HealthConfig):
        default = getattr(HealthConfig(), section.name)
        if not dataclasses.is_dataclass(default):
            continue  # a top-level scalar (skip, node_timeout_s, ...): compared above
        names = {f.name for f in dataclasses.fields(default)}
        assert set(data[section.name]) == names, section.name


def test_every_config_field_has_a_docstring():
    tree = ast.parse(Path(config_module.__file__).read_text())
    for cls in [n for n in tree.body if isinstance(n, ast.ClassDef) and n.decorator_list]:
        body = cls.body
        for i, node in enumerate(body):
            if isinstance(node, ast.AnnAssign):
                following = body[i + 1] if i + 1 < len(body) else None
                assert isinstance(following, ast.Expr) and isinstance(
                    following.value, ast.Constant), f"{cls.name}.{node.target.id}"


def test_hydra_composes_the_group_with_overrides():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        composed = compose("default", overrides=[
            "storage.timeout_s=60", "+storage.mounts=[{path: /mnt/lustre/ckpt, fstype: lustre}]"])
    config = health_config_from_dict(OmegaConf.to_container(composed, resolve=True))
    assert config.storage.timeout_s == 60.0
    assert config.storage.mounts == [MountSpec(path="/mnt/lustre/ckpt", fstype="lustre")]


@pytest.mark.parametrize("data, message", [
    ({"storage": {"mounts": [{"path": "/x", "fs_type": "nfs"}]}},
     "health.storage.mounts[0].fs_type: unknown key; known keys are path, fstype,"),
    ({"devices": {"tool_timeout_s": "fast"}},
     "health.devices.tool_timeout_s: expected float, got 'fast'"),
    ({"devices": {"expected_devices": True}},
     "health.devices.expected_devices: expected int, got True"),
    ({"devices": {"tool_timeout_s": 0}}, "health.devices.tool_timeout_s: must be > 0"),
    ({"fleet": {"warn_relative": 0.3}}, "need 0 < warn_relative <= exclude_relative < 1"),
    ({"fleet": {"min_nodes": 2}}, "health.fleet.min_nodes: must be >= 3"),
    ({"fleet": {"software_mismatch": "ignore"}},
     "health.fleet.software_mismatch: must be one of exclude, warn, got 'ignore'"),
    ({"compute": {"dtype": "fp8"}}, "health.compute.dtype: must be one of float32, bfloat16, float16, got 'fp8'"),
    ({"fleet": {"lower_is_better": ["compute.matmul_tflops"]}},
     "compute.matmul_tflops is in both higher_is_better and lower_is_better"),
    ({"storage": {"mounts": [{"path": "mnt/lustre"}]}},
     "health.storage.mounts[0].path: must be an absolute path"),
    ({"storage": "fast"}, "health.storage: expected a mapping of keys, got 'fast'"),
])
def test_bad_input_gets_one_line_naming_the_key(data, message):
    with pytest.raises(HealthConfigError) as caught:
        health_config_from_dict(data)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_integers_are_accepted_for_floats_and_none_for_optionals():
    config = health_config_from_dict({"compute": {"bandwidth_mb": 8},
                                      "data": {"local_path": None}})
    assert config.compute.bandwidth_mb == 8.0 and isinstance(config.compute.bandwidth_mb, float)
    assert health_config_from_dict(None) == HealthConfig()
