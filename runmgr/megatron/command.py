"""The command line of one node of a Megatron job: torchrun with the node's rank,
the sub-run's rendezvous, the script and its arguments, and the environment
runmgr adds (the device layer's, then the user's ``megatron.env``).

The logbook keeps :meth:`NodeCommand.masked` of every node, so a person can run
a sub-run again by hand; names and flags that look secret are masked there.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

from runmgr.config.argv import is_flag
from runmgr.config.megatron import MegatronConfig
from runmgr.placement import device_env

MASK = "***"
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
_SECRET_FLAG = re.compile(r"--[\w-]*(?:key|token|secret|password)", re.IGNORECASE)


@dataclass(frozen=True)
class NodeCommand:
    """What runs on one node: torchrun's argv and the environment runmgr sets on top of the actor's."""

    node_rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    """Only what runmgr sets (the device layer's, then megatron.env); the rest is inherited."""

    def masked(self) -> dict:
        """``{"node_rank", "argv", "env"}`` as plain data, with secret values replaced by ``***``:
        environment names holding KEY/TOKEN/SECRET/PASSWORD/CREDENTIAL and the values of
        ``--*key``/``--*token``/``--*secret``/``--*password`` arguments."""
        env = {name: MASK if _SECRET_NAME.search(name) else value for name, value in self.env.items()}
        return {"node_rank": self.node_rank, "argv": _masked_argv(self.argv), "env": env}


def _masked_argv(argv: Sequence[str]) -> list[str]:
    out: list[str] = []
    hiding = False
    for token in argv:
        if is_flag(token):
            name, sep, _ = token.partition("=")
            secret = _SECRET_FLAG.fullmatch(name) is not None
            out.append(f"{name}={MASK}" if secret and sep else token)
            hiding = secret and not sep
        else:
            out.append(MASK if hiding else token)
    return out


def node_command(job: MegatronConfig, args: Sequence[str], nnodes: int, node_rank: int, master_addr: str,
                 master_port: int, device_kind: str, python: str = sys.executable,
                 threads_per_rank: Optional[int] = None) -> NodeCommand:
    """torchrun on node ``node_rank`` of ``nnodes`` for the script of ``job`` with ``args``
    (the sub-run's: see runmgr.megatron.flags.script_args). No restarts by torchrun:
    runmgr's policy decides what a failure leads to.

    ``threads_per_rank``: each rank's ``OMP_NUM_THREADS`` (its share of the node's CPUs), unless
    ``megatron.env`` sets it. Ray gives the node's actor the whole node's CPU count there, and
    torchrun keeps a value it finds: every rank would run that many threads, the node's CPUs
    oversubscribed ``nproc_per_node`` times over."""
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"node rank {node_rank} is not within the job's {nnodes} node(s)")
    module = job.module()
    target = ["-m", module] if module else [job.script] if job.script is not None else ["-m", "trainer"]
    argv = (python, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--node-rank", str(node_rank),
            "--nproc-per-node", str(job.nproc_per_node), "--master-addr", master_addr,
            "--master-port", str(master_port), "--max-restarts", "0", *target, *args)
    threads = {} if threads_per_rank is None else {"OMP_NUM_THREADS": str(threads_per_rank)}
    env = {**device_env(device_kind, job.flavor), **threads, **job.env}
    return NodeCommand(node_rank=node_rank, argv=argv, env=env)
