"""Rendezvous settings of a rank."""

from __future__ import annotations

import os

from trainer.distributed import DistEnv, _gloo_on_loopback


def test_dist_env_reads_torchrun_variables():
    env = DistEnv.from_environ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.2",
                                "MASTER_PORT": "29511"})
    assert env == DistEnv(rank=3, world_size=4, local_rank=1, master_addr="10.0.0.2", master_port=29511)


def test_dist_env_defaults_to_one_process():
    assert DistEnv.from_environ({}) == DistEnv(rank=0, world_size=1, local_rank=0)


def test_gloo_is_bound_to_loopback_only_for_a_local_rendezvous(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    with _gloo_on_loopback(DistEnv(master_addr="127.0.0.1"), "gloo"):
        assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"
    assert "GLOO_SOCKET_IFNAME" not in os.environ  # an actor may join a multi-node group next
    with _gloo_on_loopback(DistEnv(master_addr="10.0.0.2"), "gloo"):
        assert "GLOO_SOCKET_IFNAME" not in os.environ
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth1")
    with _gloo_on_loopback(DistEnv(master_addr="localhost"), "gloo"):
        assert os.environ["GLOO_SOCKET_IFNAME"] == "eth1"  # the operator's choice wins
