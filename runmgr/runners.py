"""What the driver does differently for the built-in trainer and for a Megatron job.

Everything else (the controller, the watcher, the policy, the observers) is the
same for both: a :class:`Runner` says how a sub-run's ranks are started, which
remedies the trainer can carry out, at which data-parallel sizes it can run and
how its stacks are dumped before a hung sub-run is killed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from runmgr.config.argv import flag_value
from runmgr.config.schema import RunConfig
from runmgr.controller.group import WorkerGroup, WorkerInfo
from runmgr.megatron.command import NodeCommand, node_command
from runmgr.megatron.flags import checkpoint_step, script_args
from runmgr.megatron.flavors import abilities_of
from runmgr.megatron.job import effective_args
from runmgr.policy.abilities import BUILTIN_ABILITIES, TrainerAbilities
from runmgr.stacks import dump_stacks, stacks_dir
from runmgr.watch import torchrun
from runmgr.workers.actor import WrapReporter
from runmgr.workers.group import RayWorkerGroup
from runmgr.workers.megatron_group import MegatronWorkerGroup
from trainer.config import TrainerConfig
from trainer.plan import ResumePlan

DumpStacks = Callable[[str, Sequence[WorkerInfo]], None]


@dataclass(frozen=True)
class Runner:
    """How the sub-runs of one lineage are run."""

    make_group: Callable[[], WorkerGroup]
    """An empty group for the next sub-run."""
    abilities: TrainerAbilities
    """The remedies the trainer can carry out (the policy chooses only those)."""
    world_sizes: tuple[int, ...]
    """Data-parallel sizes the trainer can run, largest first."""
    dump_stacks: DumpStacks
    """Every rank's stack into ``<run dir>/stacks/<sub-run>/`` before a hung sub-run is killed."""


def builtin_runner(config: RunConfig, trainer_config: TrainerConfig, device_kind: str,
                   admitted_node_ids: Optional[list[str]],
                   wrap_reporter: Callable[[], Optional[WrapReporter]] = lambda: None) -> Runner:
    """One Ray actor per rank running ``trainer.train`` (the built-in trainer). ``wrap_reporter()``
    is asked again for every sub-run (chaos's pauses that have not fired yet)."""
    run_dir = config.run_dir()
    return Runner(
        make_group=lambda: RayWorkerGroup(
            config.cluster, device_kind, config.controller.start_timeout_s, config.controller.worker_lease_s,
            admitted_node_ids=admitted_node_ids, wrap_reporter=wrap_reporter()),
        abilities=BUILTIN_ABILITIES,
        world_sizes=tuple(size for size in range(config.world_size, 0, -1) if not trainer_config.problems(size)),
        dump_stacks=lambda subrun, workers: dump_stacks(run_dir, subrun, workers),
    )


def megatron_runner(config: RunConfig, device_kind: str, admitted_node_ids: Optional[list[str]]) -> Runner:
    """One Ray actor per node running the node's torchrun of the user's script, with
    the plan's remedies as the flavor's flags. Data parallel keeps its size: the
    job's arguments fix how it splits over the nodes."""
    job, args = config.megatron, effective_args(config)

    def make_commands(plan: ResumePlan, master_addr: str, master_port: int, nnodes: int) -> list[NodeCommand]:
        world = plan.data_parallel_size or config.world_size
        flags = script_args(args, plan, job.flavor, checkpoint_step(plan.start_checkpoint), world_size=world)
        return [node_command(job, flags, nnodes, rank, master_addr, master_port, device_kind)
                for rank in range(nnodes)]

    seq_length = flag_value(args, "--seq-length")
    groups: list[MegatronWorkerGroup] = []

    def make_group() -> MegatronWorkerGroup:
        groups[:] = [MegatronWorkerGroup(
            config.cluster, device_kind, job.nproc_per_node, make_commands, torchrun,
            config.controller.start_timeout_s, config.controller.worker_lease_s,
            checkpoint_dir=config.checkpoint_dir().resolve(),
            seq_length=int(seq_length) if seq_length is not None else None, admitted_node_ids=admitted_node_ids)]
        return groups[0]

    def dump(subrun: str, workers: Sequence[WorkerInfo]) -> None:
        if groups:  # the nodes dump their own ranks (py-spy must run where the process is)
            groups[0].dump_stacks(stacks_dir(config.run_dir(), subrun))

    return Runner(make_group=make_group, abilities=abilities_of(job.flavor), world_sizes=(config.world_size,),
                  dump_stacks=dump)

