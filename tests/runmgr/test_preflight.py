"""One pre-flight (runmgr/preflight.py): a launch composes its config once, whether
refused or accepted, and its checks run in one ordered list before torch and Ray
are imported; a refusal is one line and exit 2 from runmgr.cli.main."""

from __future__ import annotations

import pytest

import runmgr.preflight as preflight
from runmgr.cli import main


@pytest.fixture
def compositions(monkeypatch) -> list[list[str]]:
    """The overrides of every composition of a conf, in order."""
    seen: list[list[str]] = []
    compose = preflight.load_run_config

    def counted(conf, overrides, conf_dir=None):
        seen.append(list(overrides))
        return compose(conf, overrides, conf_dir)

    monkeypatch.setattr(preflight, "load_run_config", counted)
    return seen


def test_a_refused_launch_composes_its_config_once(compositions, tmp_path, capsys):
    code = main(["launch", "conf=demo", f"run.dir={tmp_path / 'run'}", "data.data_path=/nonexistent/corpus"])
    assert code == 2 and len(compositions) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("runmgr: error:") and "/nonexistent/corpus" in line
    assert not (tmp_path / "run").exists()


def test_an_accepted_dry_run_composes_its_config_once(compositions, tmp_path, capsys):
    assert main(["launch", "conf=demo", f"run.dir={tmp_path / 'run'}", "--dry-run"]) == 0
    assert len(compositions) == 1
    assert "world size" in capsys.readouterr().out.lower()


def test_a_webhook_whose_secret_is_not_set_refuses_the_launch_before_anything_is_written(tmp_path, capsys,
                                                                                       monkeypatch):
    monkeypatch.delenv("RUNMGR_UNSET_HOOK", raising=False)
    code = main(["launch", "conf=demo", f"run.dir={tmp_path / 'run'}", "notify.webhook=env:RUNMGR_UNSET_HOOK"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "the environment variable RUNMGR_UNSET_HOOK is not set" in line
    assert not (tmp_path / "run").exists()


def test_the_checks_run_in_order_and_a_dry_run_writes_nothing(tmp_path):
    assert [check.__name__ for check in preflight.CHECKS] == ["data_path", "webhooks", "run_directory", "kubernetes",
                                                               "s3_bucket"]
    request = preflight.LaunchRequest("demo", (f"run.dir={tmp_path / 'run'}", "kubernetes.replace_excluded_nodes=true"),
                                      dry_run=True)
    assert preflight.prepare_launch(request).config.kubernetes.replace_excluded_nodes  # a plan, not a refusal
    with pytest.raises(preflight.UserError, match="needs the run on a KubeRay cluster"):
        preflight.prepare_launch(preflight.LaunchRequest("demo", request.overrides))
