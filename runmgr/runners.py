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
from runmgr.megatron.flavors import job_abilities
from runmgr.megatron.job import effective_args
from runmgr.policy.abilities import BUILTIN_ABILITIES, TrainerAbilities
from runmgr.stacks import dump_stacks, stacks_dir
from runmgr.watch import torchrun
from runmgr.workers.actor import WrapReporter
from runmgr.workers.agent_group import AgentWorkerGroup
from runmgr.workers.devicepoll import DevicePollSettings
from runmgr.workers.group import RayWorkerGroup
from runmgr.workers.inbox import KeptInbox
from runmgr.workers.megatron_group import MegatronWorkerGroup
from runmgr.workers.megatron_nodes import MegatronNodes
from runmgr.workers.ray_node_agents import RayNodeAgents
from runmgr.workers.warm_agents import WarmAgentGroup
from runmgr.workers.warm_rules import WARM_SETTLE_S
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
    data_parallel_sizes: tuple[int, ...]
    """Data-parallel sizes the trainer can run, largest first."""
    ranks_per_replica: int
    """Ranks of one data-parallel replica (tensor x pipeline parallel)."""
    dump_stacks: DumpStacks
    """Every rank's stack into ``<run dir>/stacks/<sub-run>/`` before a hung sub-run is killed."""
    close: Callable[[], None] = lambda: None
    """When the lineage ends: what outlives a sub-run (node agents kept for the next) is ended."""


def builtin_runner(config: RunConfig, trainer_config: TrainerConfig, device_kind: str,
                   admitted_node_ids: Optional[list[str]],
                   wrap_reporter: Callable[[], Optional[WrapReporter]] = lambda: None,
                   device_poll: Optional[DevicePollSettings] = None,
                   on_held: Optional[Callable[[frozenset[str]], None]] = None) -> Runner:
    """The built-in trainer's ranks: forked by one agent per node (runmgr/workers/node_agent.py)
    on CPU and accelerator nodes alike; with warm spares the warm part holds the agent group, the
    spares forked under the agents too, each with devices of its own on accelerators.
    ``wrap_reporter()`` is asked again for every sub-run (chaos's pauses that have not fired
    yet). ``device_poll``: how the agents read their nodes' devices (None: they do not);
    ``on_held``: told the Ray ids of the nodes each new placement's agents hold
    (:class:`RayNodeAgents`), so the device poll reads the admitted nodes no agent holds."""
    run_dir = config.run_dir()
    controller = config.controller
    if not ranks_under_agents(config, device_kind):
        return per_rank_runner(config, trainer_config, device_kind, admitted_node_ids, wrap_reporter)
    # The agents push once per poll interval: the driver hears a step as soon as the per-rank design did.
    agents = RayNodeAgents(config.cluster, device_kind, controller.start_timeout_s, admitted_node_ids,
                           push_interval_s=controller.poll_interval_s, lease_s=controller.worker_lease_s,
                           device_poll=device_poll, on_held=on_held)
    inbox = KeptInbox()
    groups: list[AgentWorkerGroup] = []

    def make_agent_group() -> WorkerGroup:
        agents.wrap_reporter = wrap_reporter()
        settle = {"settle_s": WARM_SETTLE_S} if controller.warm_spares else {}
        groups[:] = [AgentWorkerGroup(agents, config.cluster.num_workers, start_timeout_s=controller.start_timeout_s,
                                      inbox=inbox, **settle)]
        if controller.warm_spares:  # the warm part holds the agent group: spares forked under the agents
            return WarmAgentGroup(groups[0], agents, controller.warm_spares)
        return groups[0]

    def close() -> None:
        agents.close()
        inbox.close()

    def dump(subrun: str, workers: Sequence[WorkerInfo]) -> None:
        if groups:  # each node's agent dumps its own ranks (py-spy must run where the process is)
            groups[0].dump_stacks(stacks_dir(run_dir, subrun))

    return Runner(make_group=make_agent_group, abilities=BUILTIN_ABILITIES,
                  data_parallel_sizes=data_parallel_sizes(trainer_config, config.world_size),
                  ranks_per_replica=trainer_config.model_parallel_size, dump_stacks=dump, close=close)


def per_rank_runner(config: RunConfig, trainer_config: TrainerConfig, device_kind: str,
                    admitted_node_ids: Optional[list[str]], wrap_reporter: Callable[[], Optional[WrapReporter]]) -> Runner:
    """One Ray actor per rank (runmgr/workers/group.py), cold restarts only: the design before
    the agents, kept for the benches that measure both (bench/launch_cpu.py, bench/scale.py).
    Warm spares run under the agents only (a ValueError here)."""
    controller = config.controller
    if controller.warm_spares:
        raise ValueError("warm spares run under node agents only: the per-rank design restarts cold")
    args = (config.cluster, device_kind, controller.start_timeout_s, controller.worker_lease_s)
    return Runner(make_group=lambda: RayWorkerGroup(*args, admitted_node_ids=admitted_node_ids,
                                                    wrap_reporter=wrap_reporter()),
                  abilities=BUILTIN_ABILITIES, data_parallel_sizes=data_parallel_sizes(trainer_config, config.world_size),
                  ranks_per_replica=trainer_config.model_parallel_size,
                  dump_stacks=lambda subrun, workers: dump_stacks(config.run_dir(), subrun, workers))


def ranks_under_agents(config: RunConfig, device_kind: str) -> bool:
    """Whether the built-in trainer's ranks are forked by node agents: always, warm or not, on
    any ``device_kind`` (an agent holds its node's ranks' and spares' devices and hands each
    forked process its own slice: runmgr/agents/device_slices.py). Kept as the one switch the
    benches turn off to run the cold per-rank design beside it (bench/launch_cpu.py)."""
    return True


def data_parallel_sizes(trainer_config: TrainerConfig, world_size: int) -> tuple[int, ...]:
    """The data-parallel sizes up to the configured one at which the trainer runs, largest
    first: the global batch divides by micro batch x size (gradient accumulation keeps it),
    each replica ``tensor x pipeline`` ranks."""
    configured = trainer_config.data_parallel_size(world_size)
    return tuple(size for size in range(configured, 0, -1)
                 if not trainer_config.problems(trainer_config.world_size_of(size)))


def megatron_runner(config: RunConfig, device_kind: str, admitted_node_ids: Optional[list[str]],
                    device_poll: Optional[DevicePollSettings] = None,
                    on_held: Optional[Callable[[frozenset[str]], None]] = None) -> Runner:
    """One Ray actor per node running the node's torchrun of the user's script, with
    the plan's remedies as the flavor's flags. Data parallel keeps its size: the
    job's arguments fix how it splits over the nodes. ``device_poll``: how the node actors
    read their nodes' devices (None: they do not); ``on_held``: told the Ray ids of the nodes
    each new placement's node actors hold (:class:`MegatronNodes`), as the agents tell it."""
    job, args = config.megatron, effective_args(config)

    layout = config.trainer_config()
    job_data_parallel = layout.data_parallel_size(config.world_size)
    threads_per_rank = max(1, int(config.cluster.cpus_per_worker))  # Ray's rule for one actor's threads

    def make_commands(plan: ResumePlan, master_addr: str, master_port: int, nnodes: int) -> list[NodeCommand]:
        flags = script_args(args, plan, job.flavor, checkpoint_step(plan.start_checkpoint),
                            data_parallel_size=job_data_parallel)
        return [node_command(job, flags, nnodes, rank, master_addr, master_port, device_kind,
                             threads_per_rank=threads_per_rank)
                for rank in range(nnodes)]

    seq_length = flag_value(args, "--seq-length")
    groups: list[MegatronWorkerGroup] = []
    controller = config.controller
    nodes = MegatronNodes(config.cluster, device_kind, job.nproc_per_node, controller.start_timeout_s,
                          controller.worker_lease_s, admitted_node_ids,
                          device_poll=device_poll, on_held=on_held)  # kept across the lineage's sub-runs

    def make_group() -> MegatronWorkerGroup:
        groups[:] = [MegatronWorkerGroup(
            config.cluster, device_kind, job.nproc_per_node, make_commands, torchrun,
            controller.start_timeout_s, controller.worker_lease_s,
            checkpoint_dir=config.checkpoint_dir().resolve(),
            seq_length=int(seq_length) if seq_length is not None else None, admitted_node_ids=admitted_node_ids,
            nodes=nodes)]
        return groups[0]

    def dump(subrun: str, workers: Sequence[WorkerInfo]) -> None:
        if groups:  # the nodes dump their own ranks (py-spy must run where the process is)
            groups[0].dump_stacks(stacks_dir(config.run_dir(), subrun))

    return Runner(make_group=make_group, abilities=job_abilities(job.flavor, args),
                  data_parallel_sizes=(job_data_parallel,),
                  ranks_per_replica=layout.model_parallel_size, dump_stacks=dump, close=nodes.close)

