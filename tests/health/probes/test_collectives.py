"""All-reduce bandwidth measured for real: two processes in a gloo group."""

import os

import pytest

from health.probes.collectives import bus_bandwidth_gbps
from runmgr.ports import rendezvous_port
from tests import cli

MEMBER = """
import sys, torch, torch.distributed as dist
from health.probes.collectives import allreduce_busbw_gbps
torch.set_num_threads(1)
dist.init_process_group("gloo", rank=int(sys.argv[1]), world_size=2)
print(allreduce_busbw_gbps(megabytes=1.0, iterations=2))
dist.destroy_process_group()
"""


def free_port() -> int:
    """A free port that no other process's ``bind(0)`` can take before the server binds it
    (runmgr/ports.py: a port from the kernel's ephemeral range was seen taken in between)."""
    return rendezvous_port()


def test_bus_bandwidth_follows_the_ring_convention():
    assert bus_bandwidth_gbps(1_000_000_000, 1.0, 2) == pytest.approx(1.0)
    assert bus_bandwidth_gbps(1_000_000_000, 1.0, 4) == pytest.approx(1.5)
    assert bus_bandwidth_gbps(1_000_000_000, 1.0, 1) == 0.0


def test_two_gloo_members_measure_the_same_positive_bandwidth(tmp_path):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    script = tmp_path / "member.py"
    script.write_text(MEMBER)
    # Two processes of their own, forked from the session's CLI fork server (tests/cli.py), which
    # imported torch once: not two new Pythons importing it.
    members = [cli.start_script(script, [str(rank)], cwd=tmp_path, env=env, stdout=tmp_path / f"{rank}.out",
                                stderr=tmp_path / f"{rank}.err") for rank in range(2)]
    codes = [m.wait(120) for m in members]
    outputs = [((tmp_path / f"{rank}.out").read_text(), (tmp_path / f"{rank}.err").read_text()) for rank in range(2)]
    assert codes == [0, 0], [err for _, err in outputs]
    figures = [float(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert figures[0] > 0 and figures[0] == figures[1]  # one agreed figure per group
