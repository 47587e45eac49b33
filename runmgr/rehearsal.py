"""``runmgr launch conf=NAME --rehearse``: the recipe of a big run at a size
this machine holds (OPT's Run 3 lost days to a tensor-parallel bug; its lesson
was "try it small first").

:func:`rehearsal_of` is pure: from the real run's config and the presets that
size its watcher, policy and chaos for a few hundred steps (:class:`Presets`,
read from conf/ by :func:`load_presets`) it makes the rehearsal's config and
the :class:`Mapping` that says, key by key, what was kept and what was scaled
and why. What a rehearsal keeps: the model family and its shape ratios, the
optimizer (AdamW betas, eps, weight decay, clipping, LR), the schedule's shape
(warmup as the same fraction of the run, the decay style), the precision and
its loss scaler, the thresholds and budgets of the watcher and the policy, the
kinds of parallelism (TP, PP, ZeRO-1, FSDP2) at small degrees. What it scales:
sizes, steps, batch, the step and time windows of the watcher and policy, the
cluster (a local Ray of dp x tp x pp workers and one spare node), the data
(the embedded byte corpus). The sizes are the ``rehearse`` section's.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from runmgr.config.chaos import ChaosConfig
from runmgr.config.compose import default_conf_dir, load_run_config, make_writable
from runmgr.config.policy import PolicyConfig
from runmgr.config.rehearse import RehearseConfig
from runmgr.config.schema import RunConfig
from runmgr.config.watcher import WatcherConfig
from runmgr.errors import ConfigError

REHEARSAL_SUFFIX = "-rehearsal"
"""The rehearsal's run name is the real one's with this suffix: its own run
directory, so its checkpoints never mix with the real run's."""

WINDOW_SUFFIXES = ("_steps", "_iters", "_s")
"""Watcher and policy fields counted in steps or seconds (named so): sized for the
rehearsal's few hundred sub-second steps by the presets. Every other field
(thresholds, ratios, budgets, actions) is the real run's."""
WINDOW_NAMES = ("window", "min_history", "history", "baseline_window", "recent_window")
"""Step-count fields whose names carry no unit."""


@dataclass(frozen=True)
class Presets:
    """The rehearsal's schedule of faults and the step/time windows of its watcher and policy."""

    chaos: ChaosConfig
    watcher: WatcherConfig
    policy: PolicyConfig


@dataclass(frozen=True)
class Row:
    """One key of the plan: its value in the real run and in the rehearsal, and why."""

    key: str
    real: Any
    rehearsal: Any
    reason: str

    @property
    def kept(self) -> bool:
        return self.real == self.rehearsal


@dataclass(frozen=True)
class Mapping:
    """How a rehearsal maps to the real plan, key by key."""

    of: str
    """The real run's name."""
    rows: tuple[Row, ...]

    @property
    def scaled(self) -> tuple[Row, ...]:
        return tuple(row for row in self.rows if not row.kept)

    @property
    def kept(self) -> tuple[Row, ...]:
        return tuple(row for row in self.rows if row.kept)

    def to_dict(self) -> dict:
        """Plain data for the logbook."""
        return {"of": self.of, "rows": [{"key": r.key, "real": _plain(r.real), "rehearsal": _plain(r.rehearsal),
                                         "reason": r.reason} for r in self.rows]}

    def summary(self) -> str:
        """One line for the logbook's chronicle."""
        return (f"rehearsal of {self.of}: {len(self.scaled)} settings scaled, {len(self.kept)} kept "
                f"(`runmgr logbook events` lists them)")


def _plain(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


class _Rows:
    """Collects rows as the rehearsal's config is built."""

    def __init__(self) -> None:
        self.rows: list[Row] = []

    def add(self, key: str, real: Any, rehearsal: Any, reason: str) -> Any:
        self.rows.append(Row(key, real, rehearsal, reason))
        return rehearsal

    def keep(self, key: str, value: Any, reason: str = "the recipe's") -> Any:
        return self.add(key, value, value, reason)


def rehearsal_of(config: RunConfig, presets: Presets):
    """(the rehearsal's RunConfig, its :class:`Mapping`) for the real run ``config``; raises
    ConfigError with one line for a setting the rehearsal cannot honour."""
    r = config.rehearse
    problems = r.problems()
    if problems:
        raise ConfigError(problems[0])
    if config.drives_megatron:
        raise ConfigError("a rehearsal runs the built-in trainer on this machine: trainer.kind=megatron cannot be "
                          "rehearsed; rehearse the recipe with trainer.kind=builtin")
    rows = _Rows()
    par = _parallel(config, rows)
    model = _model(config, par, rows)
    optim = _optim(config, rows)
    precision = _precision(config, rows)
    training = _training(config, par, rows)
    rehearsal = replace(
        config, model=model, optim=optim, precision=precision, training=training,
        parallel=par.config, data=_data(config, rows), checkpoint=_checkpoint(config, rows),
        device=rows.add("device", str(config.device), "cpu", "this machine's CPU ranks (gloo)"),
        run=_run(config, rows), cluster=_cluster(config, par, rows),
        watcher=_windows(config.watcher, presets.watcher, "watcher", rows),
        policy=_windows(config.policy, presets.policy, "policy", rows),
        health=_health(config, par, rows), chaos=_chaos(config, presets, rows),
        rehearse=replace(r, of=config.run.name),
    )
    rows.keep("lint.ignore", ", ".join(str(rule) for rule in config.lint.ignore) or None)
    rehearsal_problems = rehearsal.problems()
    if rehearsal_problems:
        raise ConfigError(f"the rehearsal of {config.run.name} cannot run: {rehearsal_problems[0]}")
    return rehearsal, Mapping(config.run.name, tuple(rows.rows))


@dataclass(frozen=True)
class _Parallel:
    config: Any
    tp: int
    pp: int
    dp: int


def _parallel(config: RunConfig, rows: _Rows) -> _Parallel:
    par, r = config.parallel, config.rehearse
    tp = min(par.tensor_model_parallel_size, r.max_tensor_parallel)
    pp = min(par.pipeline_model_parallel_size, r.max_pipeline_parallel)
    real_dp = config.data_parallel_size(config.world_size)
    dp = max(1, min(real_dp, r.max_workers // (tp * pp)))
    why = f"the same kind at a degree this machine holds (rehearse.max_workers={r.max_workers})"
    rows.add("parallel.tensor_model_parallel_size", par.tensor_model_parallel_size, tp,
             why if tp != par.tensor_model_parallel_size else "the recipe's")
    rows.add("parallel.pipeline_model_parallel_size", par.pipeline_model_parallel_size, pp,
             why if pp != par.pipeline_model_parallel_size else "the recipe's")
    sharded = par.use_distributed_optimizer or par.use_torch_fsdp2
    rows.add("data-parallel size", real_dp, dp, f"the workers left after TP x PP = {tp * pp}"
             + ("; the optimizer is sharded over them" if sharded and dp > 1 else ""))
    # At DP 1 a sharded optimizer has one shard, the whole state: the same updates as without it,
    # so the rehearsal runs without (the built-in trainer shards within pipeline stages not yet).
    zero1 = _sharding_at(rows, "parallel.use_distributed_optimizer", par.use_distributed_optimizer, dp)
    fsdp2 = _sharding_at(rows, "parallel.use_torch_fsdp2", par.use_torch_fsdp2, dp)
    rows.keep("parallel.dist_timeout_s", par.dist_timeout_s)
    small = replace(par, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                    use_distributed_optimizer=zero1, use_torch_fsdp2=fsdp2)
    return _Parallel(small, tp, pp, dp)


def _sharding_at(rows: _Rows, key: str, real: bool, dp: int) -> bool:
    """A sharded optimizer's setting in a rehearsal of data-parallel size ``dp``."""
    if real and dp == 1:
        return rows.add(key, True, False, "data parallel 1 in the rehearsal: one shard would hold the whole state, "
                                          "the same updates as an unsharded optimizer")
    return rows.keep(key, real)


def _model(config: RunConfig, par: _Parallel, rows: _Rows):
    m, r = config.model, config.rehearse
    rows.keep("model.family", str(m.family))
    layers = max(par.pp, r.num_layers - r.num_layers % par.pp)
    rows.add("model.num_layers", m.num_layers, layers, f"rehearsal size ({layers // par.pp} per pipeline stage)")
    rows.add("model.hidden_size", m.hidden_size, r.hidden_size, "rehearsal size")
    heads = r.num_attention_heads
    if heads % par.tp or r.hidden_size % heads:
        raise ConfigError(f"rehearse.num_attention_heads ({heads}) must be divisible by the rehearsal's tensor-parallel "
                          f"degree ({par.tp}) and divide rehearse.hidden_size ({r.hidden_size}), as the real run's "
                          f"{m.num_attention_heads} heads divide by TP {config.parallel.tensor_model_parallel_size}")
    rows.add("model.num_attention_heads", m.num_attention_heads, heads,
             f"rehearsal size, divisible by TP {par.tp} as the real run's are by TP "
             f"{config.parallel.tensor_model_parallel_size}")
    groups = _query_groups(m, heads, par.tp)
    if groups is None:
        rows.keep("model.num_query_groups", None, "one key/value head per query head, as the recipe")
    else:
        rows.add("model.num_query_groups", m.num_query_groups, groups,
                 f"grouped-query attention kept: {heads // groups} query heads per group (the real run: "
                 f"{m.num_attention_heads // m.num_query_groups}), groups divisible by TP {par.tp}")
    ffn = _multiple(round(r.hidden_size * m.ffn_hidden_size / m.hidden_size), par.tp)
    rows.add("model.ffn_hidden_size", m.ffn_hidden_size, ffn,
             f"the real ffn/hidden ratio {m.ffn_hidden_size / m.hidden_size:g} at hidden {r.hidden_size}")
    rows.add("model.seq_length", m.seq_length, r.seq_length, "rehearsal size")
    positions = r.seq_length * m.max_position_embeddings // m.seq_length
    rows.add("model.max_position_embeddings", m.max_position_embeddings, positions, "the real positions/seq ratio")
    if r.vocab_size % par.tp:
        raise ConfigError(f"rehearse.vocab_size ({r.vocab_size}) must be divisible by the rehearsal's tensor-parallel "
                          f"degree ({par.tp}): the embedding and output are split by vocabulary")
    rows.add("model.vocab_size", m.vocab_size, r.vocab_size, "the embedded byte corpus's vocabulary")
    for key in ("norm_epsilon", "hidden_dropout", "attention_dropout", "init_method_std",
                "untie_embeddings_and_output_weights", "rotary_base"):
        rows.keep(f"model.{key}", getattr(m, key))
    rows.keep("model.recompute_granularity", None if m.recompute_granularity is None else str(m.recompute_granularity))
    return replace(m, num_layers=layers, hidden_size=r.hidden_size, num_attention_heads=heads,
                   num_query_groups=groups, ffn_hidden_size=ffn, seq_length=r.seq_length,
                   max_position_embeddings=positions, vocab_size=r.vocab_size)


def _query_groups(m, heads: int, tp: int) -> Optional[int]:
    """The real run's query heads per group where the rehearsal's heads allow it, else as
    many groups as TP needs (at least one whole group per tensor-parallel rank)."""
    if m.num_query_groups is None:
        return None
    per_group = m.num_attention_heads // m.num_query_groups
    groups = max(tp, heads // per_group)
    while heads % groups:
        groups += 1
    return groups


def _multiple(value: int, of: int) -> int:
    return max(of, value - value % of)


def _optim(config: RunConfig, rows: _Rows):
    o, t, r = config.optim, config.training, config.rehearse
    for key in ("lr", "min_lr", "adam_beta1", "adam_beta2", "adam_eps", "weight_decay", "decay_1d_weights",
                "clip_grad"):
        rows.keep(f"optim.{key}", getattr(o, key))
    rows.keep("optim.lr_decay_style", str(o.lr_decay_style))
    real_decay = o.lr_decay_iters or t.train_iters
    decay = None if o.lr_decay_iters is None else max(1, round(o.lr_decay_iters * r.train_iters / t.train_iters))
    if o.lr_decay_iters is not None:
        rows.add("optim.lr_decay_iters", o.lr_decay_iters, decay, "the same fraction of the rehearsal's steps")
    if o.lr_warmup_fraction is not None:
        rows.keep("optim.lr_warmup_fraction", o.lr_warmup_fraction, "a fraction of the decay: the same shape")
        return replace(o, lr_decay_iters=decay)
    warmup = 0 if o.lr_warmup_iters == 0 else max(1, round(o.lr_warmup_iters * (decay or r.train_iters) / real_decay))
    rows.add("optim.lr_warmup_iters", o.lr_warmup_iters, warmup,
             f"the same fraction of the steps ({o.lr_warmup_iters}/{real_decay} = {o.lr_warmup_iters / real_decay:.2%})")
    return replace(o, lr_warmup_iters=warmup, lr_decay_iters=decay)


def _precision(config: RunConfig, rows: _Rows):
    p = config.precision
    # torch's CPU autocast computes in float16 (checked on torch 2.13), so the scaler is exercised too.
    why = "fp16 autocast and its dynamic loss scaler run on CPU" if p.fp16 else "the recipe's"
    for f in fields(p):
        rows.keep(f"precision.{f.name}", getattr(p, f.name), why)
    return p


def _training(config: RunConfig, par: _Parallel, rows: _Rows):
    t, r = config.training, config.rehearse
    rows.add("training.train_iters", t.train_iters, r.train_iters, "a few hundred steps (rehearse.train_iters)")
    rows.add("training.micro_batch_size", t.micro_batch_size, r.micro_batch_size, "rehearsal size")
    if r.global_batch_size % (r.micro_batch_size * par.dp):
        raise ConfigError(f"rehearse.global_batch_size ({r.global_batch_size}) must be a multiple of "
                          f"rehearse.micro_batch_size x the rehearsal's data-parallel size "
                          f"({r.micro_batch_size} x {par.dp})")
    rows.add("training.global_batch_size", t.global_batch_size, r.global_batch_size,
             f"rehearsal size ({r.global_batch_size // (r.micro_batch_size * par.dp)} micro-batches per rank per step)")
    for key in ("seed", "deterministic", "log_interval", "local_norms_interval"):
        rows.keep(f"training.{key}", getattr(t, key))
    return replace(t, train_iters=r.train_iters, micro_batch_size=r.micro_batch_size,
                   global_batch_size=r.global_batch_size)


def _data(config: RunConfig, rows: _Rows):
    d = config.data
    rows.add("data.data_path", d.data_path, None,
             "the embedded byte corpus (the rehearsal's vocabulary is its 256 bytes)" if d.data_path
             else "the recipe's: the embedded byte corpus")
    return replace(d, data_path=None)


def _checkpoint(config: RunConfig, rows: _Rows):
    c, r = config.checkpoint, config.rehearse
    rows.add("checkpoint.save_interval", c.save_interval, r.save_interval,
             "rollbacks need checkpoints within the rehearsal's steps (rehearse.save_interval)")
    rows.add("checkpoint.save", c.save, None, "the rehearsal's own run directory")
    rows.keep("checkpoint.keep_last", c.keep_last)
    rows.keep("checkpoint.async_save", c.async_save)
    s3 = c.s3
    rows.add("checkpoint.s3.bucket", s3.bucket, None, "a rehearsal's checkpoints stay on this machine")
    return replace(c, save_interval=r.save_interval, save=None, s3=replace(s3, bucket=None))


def _run(config: RunConfig, rows: _Rows):
    name = config.run.name + REHEARSAL_SUFFIX
    rows.add("run.name", config.run.name, name, "its own run directory: never the real run's checkpoints")
    # A run.dir given is honoured: the rehearsal's goes beside it, never into it.
    where = f"{config.run.dir.rstrip('/')}{REHEARSAL_SUFFIX}" if config.run.dir else None
    rows.add("run.dir", config.run.dir, where, "beside the real run's directory" if where else f"runs/{name}")
    rows.keep("run.number", config.run.number, "sub-runs are numbered as the real run's")
    return replace(config.run, name=name, dir=where)


def _cluster(config: RunConfig, par: _Parallel, rows: _Rows):
    c = config.cluster
    world = par.dp * par.tp * par.pp
    rows.add("cluster.address", c.address, None, "a local Ray on this machine")
    rows.add("cluster.num_workers", c.num_workers, world, f"DP {par.dp} x TP {par.tp} x PP {par.pp}")
    rows.add("cluster.local_nodes", c.local_nodes, world + 1, "one Ray node per rank and a spare one that an "
             "excluded node's rank moves to")
    rows.add("cluster.cpus_per_worker", c.cpus_per_worker, 1.0, "one CPU per rank")
    rows.add("cluster.devices_per_worker", c.devices_per_worker, 0, "no accelerator")
    return replace(c, address=None, num_workers=world, local_nodes=world + 1, cpus_per_worker=1.0,
                   devices_per_worker=0, local_num_cpus=None)


def _health(config: RunConfig, par: _Parallel, rows: _Rows):
    h, r = config.health, config.rehearse
    rows.add("health.poll_interval_s", h.poll_interval_s, r.poll_interval_s,
             "a device fault must be seen within a few of the rehearsal's steps (rehearse.poll_interval_s)")
    # One more node than the rehearsal's local Ray has: the fleet comparison never applies.
    nodes = par.dp * par.tp * par.pp + 1
    min_nodes = rows.add("health.fleet.min_nodes", h.fleet.min_nodes, nodes + 1,
                         f"the rehearsal's {nodes} nodes share this machine's cores: their speeds measure its load, "
                         f"not their hardware (a busy machine would exclude the spare); every other probe is kept")
    return replace(h, poll_interval_s=r.poll_interval_s, fleet=replace(h.fleet, min_nodes=min_nodes))


def _chaos(config: RunConfig, presets: Presets, rows: _Rows):
    kinds = ", ".join(f"{f.kind}@{f.at_step}" for f in presets.chaos.faults) or "none"
    rows.add("chaos", f"{len(config.chaos.faults)} faults", f"{len(presets.chaos.faults)} faults ({kinds})",
             f"the schedule rehearse.chaos={config.rehearse.chaos}")
    return presets.chaos


def _windows(real, preset, prefix: str, rows: _Rows):
    """``real`` with its step and time windows taken from ``preset`` (each named in a row);
    thresholds, budgets and actions stay ``real``'s."""
    changes = {}
    for f in fields(real):
        key, mine, theirs = f"{prefix}.{f.name}", getattr(real, f.name), getattr(preset, f.name)
        if is_dataclass(mine) and not isinstance(mine, type):
            changes[f.name] = _windows(mine, theirs, key, rows)
        elif _is_window(f.name, prefix) and mine != theirs:
            changes[f.name] = rows.add(key, mine, theirs, f"a window in steps or seconds: the preset "
                                                          f"rehearse.{prefix.split('.')[0]}'s")
    return replace(real, **changes) if changes else real


def _is_window(name: str, prefix: str) -> bool:
    return name in WINDOW_NAMES or name.endswith(WINDOW_SUFFIXES) or prefix.startswith("watcher.hang.")


def load_presets(conf_dir: Path, rehearse: RehearseConfig) -> Presets:
    """The presets the ``rehearse`` section names, from conf/chaos, conf/watcher and conf/policy."""
    def load(group: str, name: str, schema: type):
        path = conf_dir / group / f"{name}.yaml"
        if not path.is_file():
            names = ", ".join(sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))) or "none"
            raise ConfigError(f"rehearse.{group}={name}: no conf/{group}/{name}.yaml (available: {names})")
        base = OmegaConf.structured(schema)
        make_writable(base)  # frozen dataclasses make read-only nodes
        try:
            return OmegaConf.to_object(OmegaConf.merge(base, OmegaConf.load(path)))
        except OmegaConfBaseException as error:
            raise ConfigError(f"{path}: {str(error).splitlines()[0]}") from None

    return Presets(load("chaos", rehearse.chaos, ChaosConfig), load("watcher", rehearse.watcher, WatcherConfig),
                   load("policy", rehearse.policy, PolicyConfig))


def render_mapping(mapping: Mapping) -> str:
    """What ``--rehearse --dry-run`` prints above the rehearsal's plan."""
    width = max(len(row.key) for row in mapping.rows)
    lines = [f"Rehearsal of {mapping.of}: the recipe at a size this machine holds "
             f"(runmgr/rehearsal.py; sizes in the rehearse section)", "  scaled:"]
    for row in mapping.scaled:
        lines.append(f"    {row.key:<{width}}  {_text(row.real)} -> {_text(row.rehearsal)}  ({row.reason})")
    lines.append("  kept:")
    for row in mapping.kept:
        note = "" if row.reason == "the recipe's" else f"  ({row.reason})"
        lines.append(f"    {row.key:<{width}}  {_text(row.real)}{note}")
    return "\n".join(lines)


def _text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def load_rehearsal(conf_name: str, overrides: list[str], conf_dir: Optional[Path] = None):
    """(the rehearsal's RunConfig, its Mapping) of ``conf/NAME.yaml`` with ``overrides``:
    the real run is composed and checked first, then made small."""
    conf_dir = (conf_dir or default_conf_dir()).resolve()
    real = load_run_config(conf_name, overrides, conf_dir)
    return rehearsal_of(real, load_presets(conf_dir, real.rehearse))


def refuse_rehearse_settings(overrides: list[str]) -> None:
    """``rehearse.*`` sizes a rehearsal: set on a plain launch it would do nothing, so it is refused."""
    stray = [item.split("=", 1)[0] for item in overrides if item.split("=", 1)[0].split(".")[0] == "rehearse"]
    if stray:
        raise ConfigError(f"{stray[0]} sizes a rehearsal and this launch is none: add --rehearse "
                          f"(`runmgr launch conf=NAME --rehearse {stray[0]}=...`) or drop it")
