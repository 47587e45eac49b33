"""The driver's /metrics endpoint: prometheus_client's HTTP server over the
run's own registry, on the configured address; an address it cannot take is
one line."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client.core import GaugeMetricFamily

from runmgr.config.metrics import MetricsConfig
from runmgr.errors import ConfigError
from runmgr.metrics.server import MetricsServer


class One:
    """A collector serving one gauge."""

    def __init__(self, value: float) -> None:
        self.value = value

    def collect(self):
        yield GaugeMetricFamily("runmgr_step", "step", value=self.value)


def fetch(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        return reply.read().decode()


def test_port_zero_takes_a_free_port_and_each_run_serves_its_own_registry():
    first, second = MetricsServer.start(MetricsConfig()), MetricsServer.start(MetricsConfig())
    try:
        first.registry.register(One(7))
        second.registry.register(One(9))
        assert first.address.startswith("127.0.0.1:") and not first.address.endswith(":0")
        assert first.address != second.address
        assert "runmgr_step 7.0" in fetch(first.address) and "runmgr_step 9.0" in fetch(second.address)
    finally:
        first.close()
        second.close()
    with pytest.raises(OSError):
        fetch(first.address)  # closed: the port is free again


def test_off_serves_nothing():
    assert MetricsServer.start(MetricsConfig(enabled=False)) is None


def test_a_port_in_use_is_one_line_naming_the_key_and_the_way_out():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(ConfigError) as refused:
            MetricsServer.start(MetricsConfig(address=address))
    message = str(refused.value)
    assert address in message and "in use" in message and "metrics.address=127.0.0.1:0" in message
    assert "\n" not in message


def test_an_address_of_another_machine_is_one_line():
    # 192.0.2.1 (TEST-NET-1, documentation only) is on no interface here: binding fails locally.
    with pytest.raises(ConfigError) as refused:
        MetricsServer.start(MetricsConfig(address="192.0.2.1:0"))
    assert "192.0.2.1:0" in str(refused.value) and "cannot listen there" in str(refused.value)
