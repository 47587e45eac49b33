"""``runmgr launch --dry-run``: the resolved plan of a run, and whether the
cluster in view can hold it and the built-in trainer execute it, without
starting anything. ``runmgr launch`` refuses a plan whose verdict is no.

Memory per device follows Megatron-LM's accounting (Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models"):
- static, per parameter: Megatron in mixed precision keeps a 2-byte weight, a
  4-byte main gradient and 12 bytes of optimizer state (fp32 master, Adam m
  and v), 18 B; the built-in trainer keeps fp32 weights (they are the masters:
  bf16/fp16 is autocast), fp32 gradients and Adam's m and v: 4 + 4 + 8 = 16 B,
  as Megatron does in fp32. Parameters are split evenly over tensor x pipeline
  parallel (each device's weights, gradients and optimizer state / (t x p));
  the distributed optimizer (ZeRO-1) divides the optimizer state by data
  parallel; FSDP2 divides all three by data parallel.
- activations per layer and micro-batch: s*b*h*(10 + 24/t + 5*a*s/(h*t))
  bytes with 16-bit activations (twice that in fp32) without recompute; with
  full recompute only each layer's s*b*h input is kept, plus one layer's full
  working set. A pipeline stage holds layers/p layers and, under 1F1B, up to p
  micro-batches in flight (the first stage the most). The last stage adds the
  logits and their gradient in fp32 for the loss (2 x 4*s*b*v/t bytes).
The tests check this against the bytes a CPU rank really holds
(tests/trainer/parallel/test_memory_estimate.py, docs/throughput.md).

A Megatron job with its own script or arguments is planned as its flags describe it
(runmgr/megatron/model.py): its model, with Megatron's own parameter count, batch,
parallel sizes (context parallel included) and precision; the plan says which values
came from the flags, which are Megatron's defaults and which the conf's.

The capacity is decided per node: a rank's bundle (a Megatron node's: ``nproc_per_node``
ranks' CPUs and devices) must fit on one node. The local Ray ``launch`` would start
(``cluster.address`` null) is known from the config, without starting Ray; a remote
cluster is read through a short connection by ``launch``, while ``--dry-run`` only checks
that its address answers and leaves the capacity unchecked.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from runmgr.cluster import check_reachable, local_node_cpus, local_ray_cpus
from runmgr.config.schema import ClusterConfig, RunConfig
from runmgr.errors import ClusterError
from runmgr.megatron.model import (
    FROM_CONF, FROM_DEFAULT, FROM_FLAGS, UNMODELLED_FLAGS, JobModel, read_job,
)
from runmgr.megatron.model import parameter_count as job_parameter_count
from runmgr.placement import (
    RAY_ACCELERATOR_RESOURCE, accelerator_resource, amounts, bundle_for, closest_node, local_accelerator_resources,
    node_bundle, resolve_device_kind,
)
from runmgr.policy.capacity import slots_of
from trainer.shapes import parameter_count

GIB = 1024**3


@dataclass(frozen=True)
class NodeView:
    """One node of the cluster in view."""

    name: str
    """How the plan names it: ``host ip (node id)`` for a Ray node, ``local node 1 of 3`` for a local one."""
    resources: dict[str, float]
    """Ray resource name (CPU, GPU, NPU) -> what the node advertises."""


@dataclass(frozen=True)
class ClusterView:
    """What the cluster in view offers."""

    source: str
    cpus: float
    memory_bytes: float
    accelerators: dict[str, float] = field(default_factory=dict)
    """Ray resource name (GPU, NPU) -> count."""
    nodes: tuple[NodeView, ...] = ()
    """Each node's resources: a rank's (or a Megatron node's) bundle must fit on one."""
    local: bool = False
    """The local Ray ``launch`` would start, known from the config (no Ray was started)."""
    checked: bool = True
    """False: the cluster was not asked (a remote one in ``--dry-run``): no verdict on its capacity."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device, by what holds them."""

    weights: float
    gradients: float
    optimizer: float
    activations: float

    @property
    def weights_grads_optimizer(self) -> float:
        """The static part: what the rank holds between steps."""
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self) -> float:
        return self.weights_grads_optimizer + self.activations


@dataclass(frozen=True)
class RunPlan:
    """The resolved shape of a run."""

    config: RunConfig
    world_size: int
    data_parallel: int
    accumulation: int
    tokens_per_step: int
    parameters: int | None
    """None: the job's flags add parameters runmgr does not count (:data:`UNMODELLED_FLAGS`)."""
    memory: MemoryEstimate | None
    device_kind: str
    cluster: ClusterView
    shortfalls: tuple[str, ...]
    """What the cluster in view lacks, one line each."""
    unsupported: str | None = None
    """The settings the built-in trainer cannot execute (TrainerConfig.unsupported)."""
    job: JobModel | None = None
    """A Megatron job with its own script or arguments, as its flags describe it."""

    @property
    def fits(self) -> bool:
        """The cluster in view can hold the run."""
        return not self.shortfalls

    @property
    def runnable(self) -> bool:
        """It fits and the built-in trainer can execute it: launch may start it."""
        return self.fits and not self.unsupported


def static_bytes_per_parameter(config: RunConfig) -> tuple[float, float, float]:
    """Bytes of (weight, gradient, optimizer state) per parameter: Megatron's in mixed
    precision (2, 4, 12: bf16 weight, fp32 main grad, fp32 master + Adam m, v); the
    built-in trainer's and fp32 Megatron's (4, 4, 8: the fp32 weight is the master)."""
    low_precision = config.precision.bf16 or config.precision.fp16
    return (2.0, 4.0, 12.0) if config.drives_megatron and low_precision else (4.0, 4.0, 8.0)


def memory_per_device(config: RunConfig, parameters: int, context_parallel: int = 1,
                      selective_recompute: bool = False) -> MemoryEstimate:
    """Bytes per device; ``context_parallel`` ranks split each sequence (a replica is TP x PP x CP
    ranks), ``selective_recompute``: Megatron's selective recompute of the attention's core."""
    par = config.parallel
    tp, pp = par.tensor_model_parallel_size, par.pipeline_model_parallel_size
    dp = max(1, config.world_size // (tp * pp * context_parallel))
    weight, gradient, optimizer = static_bytes_per_parameter(config)
    shard = parameters / (tp * pp)
    weights, gradients, states = shard * weight, shard * gradient, shard * optimizer
    if par.use_torch_fsdp2:
        weights, gradients, states = weights / dp, gradients / dp, states / dp
    elif par.use_distributed_optimizer:
        states = states / dp
    return MemoryEstimate(weights, gradients, states,
                          activation_bytes(config, dp, context_parallel, selective_recompute))


def activation_bytes(config: RunConfig, dp: int, context_parallel: int = 1, selective_recompute: bool = False) -> float:
    """Activations of the busiest pipeline stage (the first: 1F1B keeps the most micro-batches
    in flight there), plus the loss's logits (the last stage's; counted on the same device when
    there is one stage, else the larger of the two). Context parallel gives each device
    1/cp of every sequence; selective recompute drops the attention's core (the 5as/h term)."""
    m, par, t = config.model, config.parallel, config.training
    tp, pp = par.tensor_model_parallel_size, par.pipeline_model_parallel_size
    width = 1.0 if config.precision.bf16 or config.precision.fp16 else 2.0  # Korthikanti counts 2-byte values
    s, b, h, a = m.seq_length / context_parallel, t.micro_batch_size, m.hidden_size, m.num_attention_heads
    core = 0.0 if selective_recompute else 5 * a * m.seq_length / (h * tp)
    full_layer = width * s * b * h * (10 + 24 / tp + core)
    layers_per_stage = m.num_layers / pp

    def held(in_flight: int) -> float:
        """A stage's activations with ``in_flight`` micro-batches between their forward and backward."""
        if m.recompute_granularity == "full":  # each layer's input, and one layer's working set
            return layers_per_stage * in_flight * 2 * width * s * b * h + full_layer
        return layers_per_stage * in_flight * full_layer

    logits = 2 * 4.0 * s * b * m.vocab_size / tp
    if pp == 1:
        return held(1) + logits
    first = held(min(pp, max(1, t.global_batch_size // (b * dp))))  # 1F1B: up to pp micro-batches
    return max(first, held(1) + logits)  # the last stage runs each micro-batch's backward at once


def inspect_cluster(cluster: ClusterConfig, connect: bool = True) -> ClusterView:
    """The resources of the cluster the run would use: the Ray this process is
    already connected to; else the cluster at ``cluster.address`` (a short
    connection; with ``connect`` false only whether its address answers, and the
    capacity is left unchecked); else the local Ray ``launch`` would start on this
    machine, known from the config without starting it (its nodes and the CPUs each
    advertises, this machine's memory and accelerators)."""
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        ray = sys.modules["ray"]
        return _ray_view(ray.cluster_resources(), ray.nodes(), "the Ray this process is connected to")
    if cluster.address and not connect:
        return _unchecked_view(cluster.address)
    if cluster.address:
        import ray

        from runmgr import cluster as ray_cluster

        local = ray_cluster.connect(cluster)
        try:
            resources, nodes = ray.cluster_resources(), ray.nodes()
        finally:
            ray_cluster.disconnect(local)
        return _ray_view(resources, nodes, f"Ray cluster at {cluster.address}")
    return _local_view(cluster)


def _local_view(cluster: ClusterConfig) -> ClusterView:
    """The local Ray of ``cluster`` (address null), from the config: ``cluster.local_nodes``
    nodes of one rank's CPUs each (runmgr/cluster.py), or one node of them all; each node
    sees this machine's accelerators."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    accels = local_accelerator_resources()
    cores = os.cpu_count() or 1
    count = cluster.local_nodes
    if count > 1:
        per_node = float(local_node_cpus(cluster))
        nodes = tuple(NodeView(f"local node {index + 1} of {count}", {"CPU": per_node, **accels})
                      for index in range(count))
        shape = f"{count} nodes of {per_node:g} CPU{'s' if per_node != 1 else ''} (cluster.local_nodes={count})"
    else:
        nodes = (NodeView("the local node", {"CPU": float(local_ray_cpus(cluster)), **accels}),)
        shape = "one node"
    return ClusterView(f"a local Ray of {shape} on this machine ({cores} cores; cluster.address is null), "
                       f"decided from the config without starting Ray", sum(n.resources["CPU"] for n in nodes),
                       float(memory), accels, nodes, local=True)


def _unchecked_view(address: str) -> ClusterView:
    """A remote cluster that ``--dry-run`` does not connect to: whether its address answers."""
    if address == "auto":
        answer = "cluster.address=auto (the Ray this machine joined) was not asked"
    else:
        try:
            check_reachable(address)
            answer = "its address answers"
        except ClusterError as error:
            answer = f"NOT reachable: {error}"
    return ClusterView(f"Ray cluster at {address}: {answer}", 0.0, 0.0, checked=False)


def node_label(row: Mapping) -> str:
    """How a plan or a placement message names a row of ``ray.nodes()``: ``host ip (node id)``."""
    return f"{row.get('NodeManagerHostname', '')} {row.get('NodeManagerAddress', '')} ({str(row['NodeID'])[:12]})".strip()


def _ray_view(resources: dict, table: list, source: str) -> ClusterView:
    """A connected cluster: its totals, and each alive node (``ray.nodes()``) by host, ip and id."""
    accels = {k: v for k, v in resources.items() if k in RAY_ACCELERATOR_RESOURCE.values()}
    nodes = tuple(NodeView(node_label(row), dict(row.get("Resources", {}))) for row in table if row.get("Alive"))
    return ClusterView(source, resources.get("CPU", 0), resources.get("memory", 0), accels, nodes)


def placement_unit(config: RunConfig, device_kind: str) -> tuple[dict[str, float], int, str]:
    """What must fit on one node, how many of them, and how a message names one: a rank's
    bundle for the built-in trainer (its warm spares take one each too: the first sub-run places
    them with the ranks); a Megatron node's (``nproc_per_node`` ranks under one torchrun) for a
    Megatron job."""
    c = config.cluster
    if config.drives_megatron:
        ranks = config.megatron.nproc_per_node
        return (node_bundle(device_kind, c.cpus_per_worker, c.devices_per_worker, ranks), c.num_workers // ranks,
                f"node of megatron.nproc_per_node={ranks} ranks")
    return (bundle_for(device_kind, c.cpus_per_worker, c.devices_per_worker),
            c.num_workers + config.controller.warm_spares, "rank")


def build_plan(config: RunConfig, view: ClusterView) -> RunPlan:
    world = config.world_size
    job = read_job(config) if config.job_describes_itself else None
    plan_config = job.config if job is not None else config
    par, t = plan_config.parallel, plan_config.training
    cp = job.architecture.context_parallel if job is not None else 1
    dp = world // (par.tensor_model_parallel_size * par.pipeline_model_parallel_size * cp)
    params, memory = _size(plan_config, job, dp)
    device_kind = resolve_device_kind(plan_config.device, view.accelerators)
    unsupported = None if job is not None else plan_config.unsupported()
    return RunPlan(plan_config, world, dp, t.global_batch_size // (t.micro_batch_size * dp),
                   t.global_batch_size * plan_config.model.seq_length, params, memory, device_kind, view,
                   tuple(shortfalls(plan_config, view, device_kind, memory)), unsupported, job)


def _size(config: RunConfig, job: JobModel | None, dp: int) -> tuple[int | None, MemoryEstimate | None]:
    """The parameter count and the memory per device; (None, None) for a job whose flags add
    parameters runmgr does not count."""
    if job is None:
        params = parameter_count(config.model)
        return params, memory_per_device(config, params)
    if job.architecture.unmodelled:
        return None, None
    params = job_parameter_count(config.model, job.architecture)
    return params, memory_per_device(config, params, job.architecture.context_parallel,
                                     job.architecture.recompute == "selective")


def shortfalls(config: RunConfig, view: ClusterView, device_kind: str, memory: MemoryEstimate | None) -> list[str]:
    if not view.checked:
        return []
    c = config.cluster
    out = []
    need_cpus = c.num_workers * c.cpus_per_worker
    if need_cpus > view.cpus:
        out.append(f"needs {need_cpus:g} CPUs for {c.num_workers} workers, the cluster has {view.cpus:g}")
    resource = accelerator_resource(device_kind)
    if resource:
        need = c.num_workers * max(1, c.devices_per_worker)
        have = view.accelerators.get(resource, 0)
        if need > have:
            out.append(f"needs {need:,} {resource}s ({c.num_workers:,} workers x {max(1, c.devices_per_worker)} {device_kind} device), "
                       f"the cluster has {have:g}")
    elif memory is not None and memory.total * c.num_workers > view.memory_bytes:
        out.append(f"needs {memory.total * c.num_workers / GIB:,.1f} GiB of memory for {c.num_workers} workers, "
                   f"the cluster has {view.memory_bytes / GIB:,.1f} GiB")
    if not out:  # enough in all: is it where the bundles need it, each on one node?
        node_line = node_shortfall(config, {n.name: n.resources for n in view.nodes}, device_kind, view.local)
        out += [node_line] if node_line else []
    return out


def node_shortfall(config: RunConfig, nodes: dict[str, dict[str, float]], device_kind: str,
                   local: bool = False) -> str | None:
    """One line when the ``nodes`` (name -> resources) cannot place the run's bundles, each on
    one node: naming the node that comes closest, what it has against what is needed, and what
    to change; None when they can (or no node is known). ``local``: the local Ray of the config."""
    if not nodes:
        return None
    bundle, count, what = placement_unit(config, device_kind)
    slots = slots_of(nodes, bundle)
    held = sum(min(n, count) for n in slots.values())
    if held >= count:
        return None
    needs = amounts(bundle, bundle)
    if held:
        spares = 0 if config.drives_megatron else config.controller.warm_spares
        whole = f"ranks and warm spares ({config.cluster.num_workers} + {spares})" if spares else \
            f"{what.split(' of ')[0]}s"
        return (f"the nodes hold {held} of the {count} {whole} the run needs ({needs} each, on one "
                f"node); {_advice(config, bundle, nodes, local)}")
    closest = closest_node(bundle, nodes)
    return (f"no node can hold one {what} ({needs} on one node{_per_rank(config)}): the closest, {closest}, has "
            f"{amounts(nodes[closest], bundle)}; {_advice(config, bundle, nodes, local)}")


def _per_rank(config: RunConfig) -> str:
    """How a Megatron node's bundle is made of its ranks'."""
    if not config.drives_megatron:
        return ""
    c = config.cluster
    parts = [f"cluster.cpus_per_worker {c.cpus_per_worker:g}"]
    if c.devices_per_worker:
        parts.append(f"cluster.devices_per_worker {c.devices_per_worker}")
    return f" = {config.megatron.nproc_per_node} x " + " and ".join(parts)


def _advice(config: RunConfig, bundle: dict[str, float], nodes: dict[str, dict[str, float]], local: bool) -> str:
    """What to change so that the bundles fit: a Megatron node of as many ranks as the closest
    node holds, one local node, less reserved per rank, or (a real cluster) bigger nodes."""
    c = config.cluster
    options = []
    if config.drives_megatron:
        ranks = config.megatron.nproc_per_node
        per_rank = {key: amount / ranks for key, amount in bundle.items()}
        held = slots_of({"closest": nodes[closest_node(bundle, nodes)]}, per_rank)["closest"]
        fitting = [n for n in range(min(held, c.num_workers), 0, -1) if c.num_workers % n == 0]
        if fitting and fitting[0] != ranks:
            options.append(f"set megatron.nproc_per_node={fitting[0]}")
    if local and c.local_nodes > 1:
        options.append("set cluster.local_nodes=1 (one local node advertises every rank's CPUs)")
    options.append("lower cluster.cpus_per_worker / cluster.devices_per_worker")
    if not config.drives_megatron and config.controller.warm_spares:
        options.append("fewer controller.warm_spares")
    if not local:
        options.append(f"add nodes that have {amounts(bundle, bundle)}")
    return ", or ".join(options)


def _bytes(n: float) -> str:
    for unit, size in (("TiB", 1024**4), ("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:.0f} B"


def _count(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:g}"


def render_plan(plan: RunPlan) -> str:
    c, par, t = plan.config, plan.config.parallel, plan.config.training
    sharding = ("FSDP2: weights, grads, optimizer sharded over DP" if par.use_torch_fsdp2
                else "distributed optimizer over DP" if par.use_distributed_optimizer else "replicated over DP")
    cp = plan.job.architecture.context_parallel if plan.job is not None else 1
    lines = [
        f"Plan for {c.run.name} (sub-runs {c.run.number}.00, {c.run.number}.01, ... in {c.run_dir()})",
        *([_job_line(plan.job)] if plan.job is not None else []),
        f"  model         {_model_text(plan)}",
        f"  parameters    {_parameters_text(plan)}",
        f"  parallelism   world size {plan.world_size:,} = TP {par.tensor_model_parallel_size} x PP "
        f"{par.pipeline_model_parallel_size}{f' x CP {cp}' if cp > 1 else ''} x DP {plan.data_parallel:,} ({sharding})",
        f"  batch         micro {t.micro_batch_size} x DP {plan.data_parallel:,} x accumulation {plan.accumulation} "
        f"= global {t.global_batch_size:,} sequences = {plan.tokens_per_step:,} tokens per step",
        f"  training      {t.train_iters:,} steps = {_count(t.train_iters * plan.tokens_per_step)} tokens; "
        f"{_precision_text(c)}; lr {c.optim.lr:g} -> {c.optim.min_lr:g} ({_decay_style(plan)})",
        f"  memory/device {_memory_text(plan)}",
        f"  cluster       {_cluster_text(plan.cluster)}",
        f"  verdict       {_verdict_text(plan)}",
    ]
    if plan.unsupported:
        lines.append(f"                and CANNOT be executed: {plan.unsupported}")
    if plan.job is not None:
        lines += _sources_lines(plan.job)
    return "\n".join(lines)


def _job_line(job: JobModel) -> str:
    mj = job.config.megatron
    return (f"  job           {mj.flavor} job {mj.script or '-m trainer'}: its model, batch, layout, precision "
            f"and LR as megatron.args say (the sources at the end)")


def _model_text(plan: RunPlan) -> str:
    m = plan.config.model
    groups = m.num_query_groups or m.num_attention_heads
    if plan.job is None:
        return (f"{m.family}, {m.num_layers} layers, hidden {m.hidden_size}, {m.num_attention_heads} heads "
                f"({groups} kv groups), ffn {m.ffn_hidden_size}, seq {m.seq_length}")
    a = plan.job.architecture
    return (f"{m.num_layers} layers, hidden {m.hidden_size}, {m.num_attention_heads} heads ({groups} kv groups of "
            f"{a.kv_channels}), ffn {m.ffn_hidden_size}, seq {m.seq_length} (max positions "
            f"{m.max_position_embeddings}), vocab {m.vocab_size}; {a.normalization}, "
            f"{'SwiGLU' if a.swiglu else 'GeGLU' if a.quick_geglu else 'ungated'} MLP, {a.position_embedding} "
            f"positions, {'linear biases' if a.bias_linear else 'no linear biases'}"
            f"{', qkv bias' if a.qkv_bias and not a.bias_linear else ''}{', qk norm' if a.qk_layernorm else ''}, "
            f"{'untied' if m.untie_embeddings_and_output_weights else 'tied'} output")


def _parameters_text(plan: RunPlan) -> str:
    if plan.parameters is not None:
        return f"{plan.parameters:,} ({_count(plan.parameters)})"
    assert plan.job is not None
    flags = ", ".join(f"{flag} ({UNMODELLED_FLAGS[flag]})" for flag in plan.job.architecture.unmodelled)
    return f"not counted: {flags} adds parameters runmgr's arithmetic does not model"


def _precision_text(config: RunConfig) -> str:
    p = config.precision
    if p.bf16:
        return "bf16"
    if p.fp16:
        return f"fp16 (dynamic loss scale from {p.initial_loss_scale:g}, floor {p.min_loss_scale:g})"
    return "fp32"


def _decay_style(plan: RunPlan) -> str:
    return plan.job.architecture.lr_decay_style if plan.job is not None else str(plan.config.optim.lr_decay_style)


def _memory_text(plan: RunPlan) -> str:
    memory = plan.memory
    if memory is None:
        return "not estimated (the parameters are not counted)"
    recompute = plan.job.architecture.recompute if plan.job is not None else plan.config.model.recompute_granularity
    return (f"{_bytes(memory.total)} per {plan.device_kind} device = weights {_bytes(memory.weights)} + grads "
            f"{_bytes(memory.gradients)} + optimizer {_bytes(memory.optimizer)} "
            f"({_sharded(plan.config.parallel, plan.data_parallel)}) + activations {_bytes(memory.activations)} "
            f"({f'{recompute} recompute' if recompute else 'no recompute'}, {_in_flight(plan)})")


def _cluster_text(view: ClusterView) -> str:
    if not view.checked:
        return (f"{view.source}; its capacity is not checked: --dry-run does not connect to a remote cluster "
                f"(`runmgr launch` reads its nodes before it places anything)")
    nodes = f"{len(view.nodes)} nodes, " if view.nodes and not view.local else ""
    return (f"{view.source}: {nodes}{view.cpus:g} CPUs, {_bytes(view.memory_bytes)}, "
            + (", ".join(f"{n:g} {k}" for k, n in view.accelerators.items()) or "no GPU/NPU"))


def _verdict_text(plan: RunPlan) -> str:
    if not plan.cluster.checked:
        return "capacity not checked (a remote cluster; see the cluster line)"
    if plan.fits:
        return "fits: the cluster in view can hold this run"
    return "CANNOT run on the cluster in view: " + "; ".join(plan.shortfalls)


def _sources_lines(job: JobModel) -> list[str]:
    """Which value came from where: the job's flags, Megatron-LM's defaults, this conf."""
    def said(reading) -> str:
        value = reading.value if not isinstance(reading.value, float) else f"{reading.value:g}"
        if reading.source == FROM_FLAGS:
            return f"{reading.key}={value} ({reading.note or reading.flag})"
        return f"{reading.key}={value} (no {reading.flag}{'; ' + reading.note if reading.note else ''})"

    labels = ((FROM_FLAGS, "from flags   "), (FROM_DEFAULT, "defaults     "), (FROM_CONF, "from conf    "))
    intro = {FROM_FLAGS: "", FROM_DEFAULT: "Megatron-LM's, for flags the job leaves out: ",
             FROM_CONF: "neither the flags nor a Megatron default say it: "}
    def in_order(source: str) -> list:  # the config's keys first, then the architecture's
        return sorted(job.from_source(source), key=lambda reading: "." not in reading.key)

    return [f"  {label} {intro[source]}" + ", ".join(said(r) for r in in_order(source))
            for source, label in labels if job.from_source(source)]


def _sharded(par, dp: int) -> str:
    """How the static bytes are split, in a few words."""
    split = [f"/ TP {par.tensor_model_parallel_size}"] if par.tensor_model_parallel_size > 1 else []
    split += [f"/ PP {par.pipeline_model_parallel_size}"] if par.pipeline_model_parallel_size > 1 else []
    if par.use_torch_fsdp2:
        split.append(f"all three / DP {dp} (FSDP2)")
    elif par.use_distributed_optimizer:
        split.append(f"optimizer / DP {dp} (ZeRO-1)")
    return ", ".join(split) or "replicated"


def _in_flight(plan: RunPlan) -> str:
    """How many micro-batches the busiest stage holds."""
    pp = plan.config.parallel.pipeline_model_parallel_size
    if pp == 1:
        return "one micro-batch"
    return (f"{plan.config.model.num_layers // pp} layers per stage, up to "
            f"{min(pp, plan.accumulation)} micro-batches in flight on the first (1F1B)")


def refusal(plan: RunPlan, dry_run_command: str) -> str | None:
    """Why ``launch`` must not start this plan, as one line that ends with
    how to see the plan; None when it is runnable."""
    if plan.runnable:
        return None
    reasons = [plan.unsupported] if plan.unsupported else []
    if plan.shortfalls:
        reasons.insert(0, f"{plan.config.run.name} cannot run on the cluster in view, {plan.cluster.source}: "
                          + "; ".join(plan.shortfalls))
    return "; and ".join(reasons) + f"; `{dry_run_command}` shows the plan"
