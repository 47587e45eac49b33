"""The rendezvous port (runmgr/ports.py): drawn where no other process's outgoing connection
or ``bind(0)`` can take it between the pick and the rank's bind."""

from __future__ import annotations

import random
import socket

from runmgr.ports import RAY_WORKER_PORT_MAX, ephemeral_range, rendezvous_port


def test_the_port_lies_between_ray_s_worker_ports_and_the_kernel_s_ephemeral_range():
    first, _ = ephemeral_range()
    ports = {rendezvous_port() for _ in range(20)}
    assert all(RAY_WORKER_PORT_MAX < port < first for port in ports), ports
    assert len(ports) > 1  # drawn at random: two drivers on one node rarely share one


def test_a_thousand_other_sockets_asking_for_any_port_never_get_the_rendezvous_port():
    # What broke a rank's store (EADDRINUSE): between the pick and the bind, the busy node's
    # other processes bind and connect, each given a port from the ephemeral range.
    port = rendezvous_port()
    held = []
    try:
        for _ in range(1000):
            sock = socket.socket()
            sock.bind(("", 0))
            held.append(sock)
        assert port not in {sock.getsockname()[1] for sock in held}
        with socket.socket() as store:  # the rank's store still binds it
            store.bind(("", port))
    finally:
        for sock in held:
            sock.close()


def test_a_port_already_listened_on_is_not_drawn():
    first_draw = random.Random(7).randint(RAY_WORKER_PORT_MAX + 1, ephemeral_range()[0] - 1)
    with socket.socket() as taken:
        taken.bind(("", first_draw))
        taken.listen()
        assert rendezvous_port(random.Random(7)) != first_draw


def test_with_no_gap_below_the_ephemeral_range_any_free_port_is_used():
    port = rendezvous_port(ephemeral=(RAY_WORKER_PORT_MAX + 10, 60999))
    first, last = ephemeral_range()
    assert first <= port <= last  # the kernel's pick
    with socket.socket() as store:
        store.bind(("", port))
