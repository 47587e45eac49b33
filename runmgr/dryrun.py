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
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from runmgr.cluster import local_ray_cpus
from runmgr.config.schema import ClusterConfig, RunConfig
from runmgr.placement import accelerator_resource, resolve_device_kind
from trainer.shapes import parameter_count

GIB = 1024**3


@dataclass(frozen=True)
class ClusterView:
    """What the cluster in view offers."""

    source: str
    cpus: float
    memory_bytes: float
    accelerators: dict[str, float] = field(default_factory=dict)
    """Ray resource name (GPU, NPU) -> count."""


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
    parameters: int
    memory: MemoryEstimate
    device_kind: str
    cluster: ClusterView
    shortfalls: tuple[str, ...]
    """What the cluster in view lacks, one line each."""
    unsupported: str | None = None
    """The settings the built-in trainer cannot execute (TrainerConfig.unsupported)."""

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


def memory_per_device(config: RunConfig, parameters: int) -> MemoryEstimate:
    m, par, t = config.model, config.parallel, config.training
    tp, pp = par.tensor_model_parallel_size, par.pipeline_model_parallel_size
    dp = max(1, config.world_size // (tp * pp))
    weight, gradient, optimizer = static_bytes_per_parameter(config)
    shard = parameters / (tp * pp)
    weights, gradients, states = shard * weight, shard * gradient, shard * optimizer
    if par.use_torch_fsdp2:
        weights, gradients, states = weights / dp, gradients / dp, states / dp
    elif par.use_distributed_optimizer:
        states = states / dp
    return MemoryEstimate(weights, gradients, states, activation_bytes(config, dp))


def activation_bytes(config: RunConfig, dp: int) -> float:
    """Activations of the busiest pipeline stage (the first: 1F1B keeps the most micro-batches
    in flight there), plus the loss's logits (the last stage's; counted on the same device when
    there is one stage, else the larger of the two)."""
    m, par, t = config.model, config.parallel, config.training
    tp, pp = par.tensor_model_parallel_size, par.pipeline_model_parallel_size
    width = 1.0 if config.precision.bf16 or config.precision.fp16 else 2.0  # Korthikanti counts 2-byte values
    s, b, h, a = m.seq_length, t.micro_batch_size, m.hidden_size, m.num_attention_heads
    full_layer = width * s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp))
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


def inspect_cluster(cluster: ClusterConfig) -> ClusterView:
    """The resources of the cluster the run would use: the Ray this process is
    already connected to; else the cluster at ``cluster.address`` (a short
    connection); else the local Ray ``launch`` would start on this machine,
    known without starting it (the CPUs it advertises, this machine's memory
    and accelerators)."""
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        return _ray_view(sys.modules["ray"].cluster_resources(), "the Ray this process is connected to")
    if cluster.address:
        import ray

        from runmgr import cluster as ray_cluster

        local = ray_cluster.connect(cluster)
        try:
            res = ray.cluster_resources()
        finally:
            ray_cluster.disconnect(local)
        return _ray_view(res, f"Ray cluster at {cluster.address}")
    from trainer.device import local_accelerators

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    accels = {accelerator_resource(kind) or kind: n for kind, n in local_accelerators().items() if n}
    cores = os.cpu_count() or 1
    return ClusterView(f"a local Ray on this machine ({cores} cores; cluster.address is null)",
                       float(local_ray_cpus(cluster)), float(memory), accels)


def _ray_view(resources: dict, source: str) -> ClusterView:
    accels = {k: v for k, v in resources.items() if k in ("GPU", "NPU")}
    return ClusterView(source, resources.get("CPU", 0), resources.get("memory", 0), accels)


def build_plan(config: RunConfig, view: ClusterView) -> RunPlan:
    world = config.world_size
    par, t = config.parallel, config.training
    dp = world // (par.tensor_model_parallel_size * par.pipeline_model_parallel_size)
    params = parameter_count(config.model)
    memory = memory_per_device(config, params)
    device_kind = resolve_device_kind(config.device, view.accelerators)
    return RunPlan(config, world, dp, config.trainer_config().accumulation_steps(world),
                   t.global_batch_size * config.model.seq_length, params, memory, device_kind, view,
                   tuple(shortfalls(config, view, device_kind, memory)), config.unsupported())


def shortfalls(config: RunConfig, view: ClusterView, device_kind: str, memory: MemoryEstimate) -> list[str]:
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
    elif memory.total * c.num_workers > view.memory_bytes:
        out.append(f"needs {memory.total * c.num_workers / GIB:,.1f} GiB of memory for {c.num_workers} workers, "
                   f"the cluster has {view.memory_bytes / GIB:,.1f} GiB")
    return out


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
    c, m, par, t, p = plan.config, plan.config.model, plan.config.parallel, plan.config.training, plan.config.precision
    precision = "bf16" if p.bf16 else (f"fp16 (dynamic loss scale from {p.initial_loss_scale:g}, floor {p.min_loss_scale:g})" if p.fp16 else "fp32")
    sharding = ("FSDP2: weights, grads, optimizer sharded over DP" if par.use_torch_fsdp2
                else "distributed optimizer over DP" if par.use_distributed_optimizer else "replicated over DP")
    recompute = "full recompute" if m.recompute_granularity == "full" else "no recompute"
    lines = [
        f"Plan for {c.run.name} (sub-runs {c.run.number}.00, {c.run.number}.01, ... in {c.run_dir()})",
        f"  model         {m.family}, {m.num_layers} layers, hidden {m.hidden_size}, {m.num_attention_heads} heads "
        f"({m.num_query_groups or m.num_attention_heads} kv groups), ffn {m.ffn_hidden_size}, seq {m.seq_length}",
        f"  parameters    {plan.parameters:,} ({_count(plan.parameters)})",
        f"  parallelism   world size {plan.world_size:,} = TP {par.tensor_model_parallel_size} x PP "
        f"{par.pipeline_model_parallel_size} x DP {plan.data_parallel:,} ({sharding})",
        f"  batch         micro {t.micro_batch_size} x DP {plan.data_parallel:,} x accumulation {plan.accumulation} "
        f"= global {t.global_batch_size:,} sequences = {plan.tokens_per_step:,} tokens per step",
        f"  training      {t.train_iters:,} steps = {_count(t.train_iters * plan.tokens_per_step)} tokens; {precision}; "
        f"lr {c.optim.lr:g} -> {c.optim.min_lr:g} ({c.optim.lr_decay_style})",
        f"  memory/device {_bytes(plan.memory.total)} per {plan.device_kind} device = "
        f"weights {_bytes(plan.memory.weights)} + grads {_bytes(plan.memory.gradients)} + optimizer "
        f"{_bytes(plan.memory.optimizer)} ({_sharded(par, plan.data_parallel)}) + activations "
        f"{_bytes(plan.memory.activations)} ({recompute}, {_in_flight(plan)})",
        f"  cluster       {plan.cluster.source}: {plan.cluster.cpus:g} CPUs, {_bytes(plan.cluster.memory_bytes)}, "
        + (", ".join(f"{n:g} {k}" for k, n in plan.cluster.accelerators.items()) or "no GPU/NPU"),
    ]
    if plan.fits:
        lines.append("  verdict       fits: the cluster in view can hold this run")
    else:
        lines.append("  verdict       CANNOT run on the cluster in view: " + "; ".join(plan.shortfalls))
    if plan.unsupported:
        lines.append(f"                and CANNOT be executed: {plan.unsupported}")
    return "\n".join(lines)


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
