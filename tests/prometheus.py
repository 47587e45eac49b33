"""A real Prometheus and a real Alertmanager on 127.0.0.1 for tests (Debian's `prometheus` and
`prometheus-alertmanager` packages; `make test` installs both): Prometheus scrapes the targets of
a file every second, evaluates the rules it is given every second, and sends their alerts to the
Alertmanager, which posts them to a webhook."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import IO, Iterator

import pytest

from runmgr.metrics import alerts
from runmgr.ports import rendezvous_port
from tests.webhook import Receiver


def free_port() -> int:
    """A free port that no other process's ``bind(0)`` can take before the server binds it
    (runmgr/ports.py: a port from the kernel's ephemeral range was seen taken in between)."""
    return rendezvous_port()


def binary(name: str, package: str) -> str:
    found = shutil.which(name) or f"/usr/bin/{name}"
    if not Path(found).is_file():
        pytest.fail(f"no {name} binary: `apt-get install -y {package}` (`make test` installs it)")
    return found


class Server:
    """A server process with a log in ``workdir``, ready once its ``/-/ready`` answers 200."""

    def __init__(self, name: str, argv: list[str], address: str, workdir: Path) -> None:
        self.name, self.address = name, address
        self.log_path = workdir / f"{name}.log"
        self.log: IO[str] = open(self.log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"{self.name} exited ({self.proc.returncode}):\n{self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        pytest.fail(f"{self.name} not ready after {timeout} s:\n{self.log_path.read_text()[-2000:]}")

    def get(self, path: str, **params: str) -> dict:
        url = f"http://{self.address}{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=10) as reply:
            return json.load(reply)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Alertmanager(Server):
    """Alertmanager posting every alert to ``webhook_url`` at once (no grouping wait), alone (no
    cluster: the default listens on 0.0.0.0:9094 for peers)."""

    def __init__(self, workdir: Path, webhook_url: str) -> None:
        config = workdir / "alertmanager.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "route": {"receiver": "hook", "group_by": ["alertname", "instance"],
                      "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "hook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
        }))
        address = f"127.0.0.1:{free_port()}"
        super().__init__("alertmanager", [
            binary("prometheus-alertmanager", "prometheus-alertmanager"), f"--config.file={config}",
            f"--storage.path={workdir / 'alertmanager'}", f"--web.listen-address={address}",
            "--cluster.listen-address="], address, workdir)


class Prometheus(Server):
    """A Prometheus server scraping the targets of a file every second; with ``rule_files``
    evaluated every second and their alerts sent to ``alertmanager``."""

    def __init__(self, workdir: Path, rule_files: tuple[Path, ...] = (),
                 alertmanager: Alertmanager | None = None) -> None:
        self.targets = workdir / "targets.json"
        self.targets.write_text("[]")
        config = workdir / "prometheus.yml"
        document: dict = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "runmgr", "file_sd_configs": [{"files": [str(self.targets)]}]}],
            "rule_files": [str(path) for path in rule_files],
        }
        if alertmanager is not None:
            document["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager.address]}]}]}
        config.write_text(json.dumps(document))  # JSON is YAML
        address = f"127.0.0.1:{free_port()}"
        super().__init__("prometheus", [
            binary("prometheus", "prometheus"), f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address={address}"], address, workdir)

    def scrape(self, address: str) -> None:
        self.targets.write_text(json.dumps([{"targets": [address]}]))

    def query(self, expr: str) -> list[dict]:
        answer = self.get("/api/v1/query", query=expr)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def alerts(self) -> list[dict]:
        """The alerts its rules hold now, pending and firing."""
        answer = self.get("/api/v1/alerts")
        assert answer["status"] == "success", answer
        return answer["data"]["alerts"]


def stall_notice(receiver: Receiver, instance: str, after: float, timeout: float = 120) -> dict:
    """The first RunmgrStalled alert for ``instance`` that Alertmanager posted as firing, of a stall
    that began after ``after`` (Unix time): the one of the pause the test holds, not of the restart."""
    def began(alert: dict) -> float:
        return datetime.fromisoformat(alert["startsAt"]).timestamp()

    deadline = time.time() + timeout
    while time.time() < deadline:
        for body in receiver.wait_for(len(receiver.bodies) + 1, timeout=max(0.0, deadline - time.time())):
            for alert in body["alerts"]:
                if (alert["labels"]["alertname"] == "RunmgrStalled" and alert["status"] == "firing"
                        and alert["labels"]["instance"] == instance and began(alert) > after):
                    return alert
    pytest.fail(f"no RunmgrStalled for {instance} after {after} within {timeout} s: {receiver.bodies}")


@contextmanager
def alerting(workdir: Path, webhook_url: str, thresholds: alerts.AlertThresholds) -> Iterator[Prometheus]:
    """Alertmanager posting to ``webhook_url``, and Prometheus evaluating runmgr's rules built with
    ``thresholds`` and sending their alerts to it: the Prometheus, until the block ends."""
    rules = workdir / "runmgr.rules.yml"
    rules.write_text(alerts.render(alerts.rule_groups(thresholds)))
    manager = Alertmanager(workdir, webhook_url)
    try:
        server = Prometheus(workdir, rule_files=(rules,), alertmanager=manager)
        try:
            yield server
        finally:
            server.close()
    finally:
        manager.close()
