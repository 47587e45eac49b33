"""The alerting rules are generated, accepted by Prometheus' own checker, and each alert fires on
the series it is for and stays quiet on a healthy run's: `promtool test rules` evaluates them as
Prometheus would, over series written here minute by minute (the Debian `prometheus` package
ships promtool; `make test` installs it). The end-to-end test (test_prometheus_e2e.py) shows a
real Prometheus sending the stall alert through a real Alertmanager for a real run."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from runmgr.metrics import alerts, names

INSTANCE = 'job="runmgr", instance="driver:9000"'
"""The target labels Prometheus adds to every series it scrapes from one driver."""


def promtool() -> str:
    binary = shutil.which("promtool") or "/usr/bin/promtool"
    if not Path(binary).is_file():
        pytest.fail("no promtool: `apt-get install -y prometheus` (`make test` installs it)")
    return binary


def series(metric: str, values: str, **labels: str) -> dict:
    extra = "".join(f', {key}="{value}"' for key, value in labels.items())
    return {"series": f"{metric}{{{INSTANCE}{extra}}}", "values": values}


@dataclass
class Case:
    """One run's series and what an alert does at ``at``: fire with this summary, or stay quiet (None)."""

    what: str
    alert: str
    input: list[dict]
    at: str
    summary: str | None
    extra: list[dict] = field(default_factory=list)


RUNNING = series(names.STATE.name, "1x60", runmgr_state="running")
STEPPING = [series(names.LAST_STEP_AT.name, "0+60x60"), series(names.STEP_TIME_MEDIAN.name, "1x60")]
"""A run that steps every minute with one-second steps: each evaluation sees a step just taken."""
STOPPED = [series(names.LAST_STEP_AT.name, "0+60x5 300x55"), series(names.STEP_TIME_MEDIAN.name, "1x60")]
"""A run of one-second steps that stepped until minute 5 and then no more."""

CASES = [
    Case("a held remedy waits", "RunmgrNeedsPerson",
         [series(names.STATE.name, "0 1x10", runmgr_state="awaiting_approval"),
          series(names.STATE.name, "1 0x10", runmgr_state="running")], "2m",
         "runmgr run at driver:9000 needs a person"),
    Case("a run ended failed", "RunmgrNeedsPerson",
         [series(names.STATE.name, "0 1x10", runmgr_state="failed")], "2m", "runmgr run at driver:9000 needs a person"),
    Case("a run that runs", "RunmgrNeedsPerson",
         [RUNNING, series(names.STATE.name, "0x60", runmgr_state="awaiting_approval")], "30m", None),
    Case("no step since minute 5", "RunmgrStalled", [RUNNING, *STOPPED], "12m",
         "runmgr run at driver:9000 has not stepped for 7m 0s"),
    Case("a stall shorter than the hold (a restart)", "RunmgrStalled", [RUNNING, *STOPPED], "10m", None),
    Case("a run stepping at its pace", "RunmgrStalled", [RUNNING, *STEPPING], "30m", None),
    Case("10 ms steps reported 30 s apart (the driver's poll, the scrape)", "RunmgrStalled",
         [RUNNING, series(names.LAST_STEP_AT.name, "-30+60x60"), series(names.STEP_TIME_MEDIAN.name, "0.01x60")],
         "30m", None),
    Case("a run that finished", "RunmgrStalled",
         [series(names.STATE.name, "1x60", runmgr_state="finished"), *STOPPED], "30m", None),
    Case("a run that waits for a person (the other alert says so)", "RunmgrStalled",
         [series(names.STATE.name, "1x60", runmgr_state="awaiting_approval"), *STOPPED], "30m", None),
    Case("no checkpoint for 12 minutes at 100 one-second steps each", "RunmgrCheckpointOld",
         [series(names.CHECKPOINT_AGE.name, "0+60x30"), series(names.CHECKPOINT_INTERVAL.name, "100x30"),
          series(names.STEP_TIME_MEDIAN.name, "1x30")], "12m",
         "runmgr run at driver:9000: the last checkpoint is 12m 0s old"),
    Case("a checkpoint every 3 minutes", "RunmgrCheckpointOld",
         [series(names.CHECKPOINT_AGE.name, "0 60 120 " * 10), series(names.CHECKPOINT_INTERVAL.name, "100x30"),
          series(names.STEP_TIME_MEDIAN.name, "1x30")], "25m", None),
    Case("ETTR 80% for 40 minutes", "RunmgrLowEttr", [series(names.ETTR.name, "0.8x40")], "40m",
         "runmgr run at driver:9000: ETTR 80%"),
    Case("ETTR 80% for 20 minutes", "RunmgrLowEttr", [series(names.ETTR.name, "0.8x40")], "20m", None),
    Case("ETTR 95%", "RunmgrLowEttr", [series(names.ETTR.name, "0.95x40")], "40m", None),
    Case("a restart every 10 minutes", "RunmgrRestartStorm",
         [series(names.SUBRUN.name, "_ " * (10 * i) + f"{i}x9", subrun=f"1.{i:02d}") for i in range(5)], "45m",
         "runmgr run at driver:9000: 4 new sub-runs within an hour"),
    Case("a restart every 70 minutes", "RunmgrRestartStorm",
         [series(names.SUBRUN.name, "_ " * (70 * i) + f"{i}x69", subrun=f"1.{i:02d}") for i in range(5)], "300m",
         None),
    Case("a checkpoint 40 minutes from S3", "RunmgrUploadLag",
         [series(names.UPLOAD_LAG.name, "0+60x40")], "40m",
         "runmgr run at driver:9000: a checkpoint has waited 40m 0s for S3"),
    Case("no S3 mirror (the lag is NaN)", "RunmgrUploadLag", [series(names.UPLOAD_LAG.name, " ".join(["NaN"] * 41))], "40m", None),
]


def unit_tests(rules_file: Path, cases: list[Case]) -> dict:
    """promtool's unit-test file: one test group per case."""
    description = {rule["alert"]: rule["annotations"]["description"] for rule in alerts.rules()}
    labels = {rule["alert"]: rule["labels"] for rule in alerts.rules()}

    def expected(case: Case) -> list[dict]:
        if case.summary is None:
            return []
        return [{"exp_labels": {**labels[case.alert], "job": "runmgr", "instance": "driver:9000"},
                 "exp_annotations": {"summary": case.summary, "description": description[case.alert]}}]

    return {"rule_files": [str(rules_file)], "evaluation_interval": "1m",
            "tests": [{"name": case.what, "interval": "1m", "input_series": case.input,
                       "alert_rule_test": [{"eval_time": case.at, "alertname": case.alert,
                                            "exp_alerts": expected(case)}]} for case in cases]}


def run_promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120)


def test_the_committed_rules_are_what_the_builder_makes_now():
    assert alerts.main(["--check"]) == 0, "run `python -m runmgr.metrics.alerts` and commit the files"
    assert yaml.safe_load(alerts.RULES_PATH.read_text()) == alerts.rule_groups()
    assert yaml.safe_load(alerts.PROMETHEUS_RULE_PATH.read_text())["spec"] == alerts.rule_groups()


def test_check_says_when_a_committed_file_is_out_of_date(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "runmgr.rules.yml"
    stale.write_text("groups: []\n")
    monkeypatch.setattr(alerts, "RULES_PATH", stale)
    monkeypatch.setattr(alerts, "PROMETHEUS_RULE_PATH", tmp_path / "prometheusrule.yaml")
    assert alerts.main(["--check"]) == 1
    assert "out of date" in capsys.readouterr().err
    assert alerts.main([]) == 0 and alerts.main(["--check"]) == 0
    assert stale.read_text().startswith(alerts.HEADER)


def test_every_alert_reads_only_metrics_the_exporter_serves():
    served = {spec.name for spec in names.ALL}
    for rule in alerts.rules():
        used = set(re.findall(r"\brunmgr_[a-z_]+\b", rule["expr"]))
        assert used and used <= served | {names.STATE.name}, (rule["alert"], used - served)


def test_promtool_accepts_the_rules_file_and_the_prometheus_rule_s_groups(tmp_path):
    spec = tmp_path / "spec.yml"
    spec.write_text(yaml.safe_dump(yaml.safe_load(alerts.PROMETHEUS_RULE_PATH.read_text())["spec"]))
    for path in (alerts.RULES_PATH, spec):
        checked = run_promtool("check", "rules", str(path))
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert f"SUCCESS: {len(alerts.rules())} rules found" in checked.stdout


def test_each_alert_fires_on_its_series_and_not_on_a_healthy_run_s(tmp_path):
    assert {case.alert for case in CASES} == {rule["alert"] for rule in alerts.rules()}
    assert {case.alert for case in CASES if case.summary is None} == {case.alert for case in CASES}
    unit = tmp_path / "alerts_test.yml"
    unit.write_text(yaml.safe_dump(unit_tests(alerts.RULES_PATH, CASES), sort_keys=False))
    tested = run_promtool("test", "rules", str(unit))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_unit_tests_can_fail_a_rule_that_does_not_fire(tmp_path):
    """The same harness says FAILED when an alert the rules cannot raise is expected: a quiet rule
    would not pass for a firing one."""
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(alerts.rule_groups(alerts.AlertThresholds(stall_step_times=1e9))))
    unit = tmp_path / "alerts_test.yml"
    unit.write_text(yaml.safe_dump(unit_tests(rules, [case for case in CASES if case.what == "no step since minute 5"]), sort_keys=False))
    tested = run_promtool("test", "rules", str(unit))
    assert tested.returncode != 0 and "FAILED" in tested.stdout + tested.stderr
