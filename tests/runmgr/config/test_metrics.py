"""The ``metrics`` group: where the driver serves Prometheus metrics; a
malformed address is one line naming the key and a working example."""

from __future__ import annotations

import pytest

from runmgr.config.compose import load_run_config
from runmgr.config.metrics import split_address
from runmgr.errors import ConfigError


@pytest.mark.parametrize("address, expected", [
    ("127.0.0.1:0", ("127.0.0.1", 0)), ("0.0.0.0:8000", ("0.0.0.0", 8000)), ("localhost:9100", ("localhost", 9100)),
    ("[::1]:8000", ("::1", 8000)),
])
def test_host_and_port_are_read(address, expected):
    assert split_address(address) == expected


def test_the_default_serves_on_a_free_port_of_this_machine_and_overrides_set_it():
    assert load_run_config("demo", []).metrics.address == "127.0.0.1:0"
    config = load_run_config("demo", ["metrics.address=0.0.0.0:8000", "metrics.enabled=false"])
    assert (config.metrics.address, config.metrics.enabled) == ("0.0.0.0:8000", False)


@pytest.mark.parametrize("address, says", [
    ("localhost", "expected host:port"), (":8000", "expected host:port"),
    ("127.0.0.1:99999", "not a number from 0 to 65535"), ("127.0.0.1:http", "not a number from 0 to 65535"),
    ("::1:8000", "IPv6 host in brackets"), ("a b:80", "not a host name"),
])
def test_a_malformed_address_is_refused_in_one_line(address, says):
    with pytest.raises(ConfigError) as refused:
        load_run_config("demo", [f"metrics.address={address}"])
    message = str(refused.value)
    assert says in message and "metrics.address" in message and "127.0.0.1:0" in message and "\n" not in message


def test_a_trailing_colon_is_no_address():
    # On the command line YAML reads `127.0.0.1:` as a mapping, and OmegaConf refuses it for the key.
    with pytest.raises(ValueError, match="expected host:port"):
        split_address("127.0.0.1:")
    with pytest.raises(ConfigError, match="metrics.address"):
        load_run_config("demo", ["metrics.address=127.0.0.1:"])
