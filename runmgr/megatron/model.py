"""What a Megatron job's own flags say it trains: its model, batch, layout, precision and LR.

A user's job (``megatron.script`` or ``megatron.args`` set) builds the model its flags
describe, with Megatron-LM's defaults (megatron/training/arguments.py) for the flags it
leaves out; this conf's sections count only where the flags say nothing and Megatron has
no default (a size the arguments lack, the tokenizer's vocabulary). :func:`read_job`
gives the config the job really runs, the architecture the config's sections cannot hold
(normalization, gated MLP, biases, position embedding, ...), and where each value came
from, so that ``runmgr launch --dry-run`` says which is which. A value runmgr must read but
cannot parse, or a layout Megatron would stop at, is one line (:class:`ConfigError`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence

from trainer.config import LrDecayStyle, ModelConfig, OptimConfig, ParallelConfig, RecomputeGranularity

from runmgr.config.argv import flag_value, flag_values, has_flag
from runmgr.config.schema import RunConfig
from runmgr.errors import ConfigError

FROM_FLAGS = "flags"
"""The job passes the flag."""
FROM_DEFAULT = "default"
"""The job leaves the flag out: Megatron-LM's default."""
FROM_CONF = "conf"
"""Neither the flags nor a Megatron default say it: this conf's value."""

NORMALIZATIONS = ("LayerNorm", "RMSNorm")
"""``--normalization`` values whose parameters runmgr counts."""
POSITION_EMBEDDINGS = ("learned_absolute", "rope", "yarn", "mrope", "relative", "none")
"""``--position-embedding-type`` values (Megatron-LM's choices)."""
RECOMPUTE = ("full", "selective")
"""``--recompute-granularity`` values (Megatron-LM's choices)."""
UNMODELLED_FLAGS: dict[str, str] = {
    "--num-experts": "mixture of experts",
    "--multi-latent-attention": "multi-latent attention",
    "--mtp-num-layers": "multi-token prediction layers",
    "--hybrid-override-pattern": "hybrid (Mamba) layers",
}
"""Flags that add parameters runmgr's arithmetic does not count: with one, the plan gives no
parameter count or memory, and says why."""
BUILTIN_MODULE = "trainer"
"""``megatron.script: -m trainer``: the built-in trainer's dialect, which pads no vocabulary."""


@dataclass(frozen=True)
class Reading:
    """One value runmgr read for a job, and where it came from."""

    key: str
    """The config key it sets (``model.hidden_size``), or the architecture's name (``normalization``)."""
    value: object
    """The value as the job runs it."""
    source: str
    """:data:`FROM_FLAGS`, :data:`FROM_DEFAULT` or :data:`FROM_CONF`."""
    flag: str
    """The Megatron flag that gives it."""
    note: str = ""
    """How it was derived, when it is not the flag's value as written (a padded vocabulary)."""


@dataclass(frozen=True)
class Architecture:
    """What the job builds beyond the config's model section (Megatron's flags for it)."""

    normalization: str = "LayerNorm"
    """``--normalization``: ``LayerNorm`` (a weight and a bias) or ``RMSNorm`` (a weight)."""
    swiglu: bool = False
    """``--swiglu``: a gated MLP, two input projections of ffn_hidden_size each."""
    quick_geglu: bool = False
    """``--quick-geglu``: gated too (its default ffn size is still 4 x hidden)."""
    position_embedding: str = "learned_absolute"
    """``--position-embedding-type``: ``learned_absolute`` holds max_position_embeddings x hidden weights."""
    relative_buckets: int = 32
    """``--relative-attention-num-buckets``: the buckets of a ``relative`` position embedding."""
    bias_linear: bool = True
    """False with ``--disable-bias-linear``: no bias on any linear layer."""
    qkv_bias: bool = False
    """``--add-qkv-bias``: a bias on the query/key/value projection even without linear biases."""
    qk_layernorm: bool = False
    """``--qk-layernorm``: a norm over each head's queries and keys."""
    kv_channels: int = 0
    """``--kv-channels``: the width of one attention head (default hidden / heads)."""
    context_parallel: int = 1
    """``--context-parallel-size``: ranks that split each sequence (a replica is TP x PP x CP ranks)."""
    recompute: Optional[str] = None
    """``--recompute-granularity``: ``full``, ``selective`` or none."""
    lr_decay_style: str = "linear"
    """``--lr-decay-style`` as the job gives it (Megatron has styles the conf's choice lacks)."""
    unmodelled: tuple[str, ...] = ()
    """Flags of :data:`UNMODELLED_FLAGS` the job passes: its parameters are not counted."""


@dataclass(frozen=True)
class JobModel:
    """A job as its flags describe it."""

    config: RunConfig
    """The config with the job's values in its model, training, parallel, precision, optim and checkpoint."""
    architecture: Architecture
    """What the config's sections cannot hold."""
    readings: tuple[Reading, ...]
    """Every value read, in order, with its source."""

    @property
    def data_parallel(self) -> int:
        """World size / (TP x PP x CP)."""
        par = self.config.parallel
        replica = par.tensor_model_parallel_size * par.pipeline_model_parallel_size * self.architecture.context_parallel
        return self.config.world_size // replica

    def from_source(self, source: str) -> list[Reading]:
        return [reading for reading in self.readings if reading.source == source]


class _Reader:
    """Reads flags into values, recording each one's source."""

    def __init__(self, args: Sequence[str], config: RunConfig) -> None:
        self.args, self.config = list(args), config
        self.readings: list[Reading] = []

    def _conf(self, key: str) -> Any:
        """This conf's value of ``section.field``."""
        section, name = key.split(".")
        return getattr(getattr(self.config, section), name)

    def text(self, flag: str) -> Optional[str]:
        """The flag's value as written; None when the flag is absent."""
        if not has_flag(self.args, flag):
            return None
        value = flag_value(self.args, flag)
        if value is None:
            raise ConfigError(f"megatron.args: {flag} is given without a value; write {flag} VALUE")
        return value

    def record(self, key: str, value: object, source: str, flag: str, note: str = "") -> None:
        self.readings.append(Reading(key, value, source, flag, note))

    def integer(self, flag: str, key: str, default: Optional[int] = None) -> int:
        """The flag's positive whole number; else ``default`` (Megatron's), else the conf's ``key``."""
        value = self.optional_integer(flag)
        source = FROM_FLAGS
        if value is None:
            value, source = (default, FROM_DEFAULT) if default is not None else (int(self._conf(key)), FROM_CONF)
        self.record(key, value, source, flag)
        return value

    def optional_integer(self, flag: str) -> Optional[int]:
        """The flag's positive whole number, unrecorded; None when absent."""
        text = self.text(flag)
        if text is not None and not (text.isdigit() and int(text) > 0):
            raise ConfigError(f"megatron.args: {flag} must be a positive whole number, got {text!r}")
        return int(text) if text is not None else None

    def number(self, flag: str, key: str, default: Optional[float] = None) -> float:
        """The flag's number (finite, >= 0); else ``default`` (Megatron's), else the conf's ``key``."""
        text = self.text(flag)
        if text is None:
            value, source = (default, FROM_DEFAULT) if default is not None else (float(self._conf(key)), FROM_CONF)
            self.record(key, value, source, flag)
            return value
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"megatron.args: {flag} must be a number, got {text!r}") from None
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"megatron.args: {flag} must be a finite number >= 0, got {text!r}")
        self.record(key, value, FROM_FLAGS, flag)
        return value

    def choice(self, flag: str, key: str, choices: Sequence[str], default: Optional[str]) -> Optional[str]:
        """The flag's value, one of ``choices``; else Megatron's ``default``."""
        text = self.text(flag)
        if text is not None and text not in choices:
            raise ConfigError(f"megatron.args: {flag} {text} is not one runmgr can plan with: use one of "
                              f"{', '.join(choices)}")
        self.record(key, default if text is None else text, FROM_DEFAULT if text is None else FROM_FLAGS, flag)
        return default if text is None else text

    def switch(self, flag: str, key: str, on: bool = True) -> bool:
        """``on`` when the job passes the switch, else its opposite (Megatron's default)."""
        given = has_flag(self.args, flag)
        values = flag_values(self.args, flag) if given else None
        if values:
            raise ConfigError(f"megatron.args: {flag} takes no value, got {' '.join(values)!r}")
        self.record(key, on if given else not on, FROM_FLAGS if given else FROM_DEFAULT, flag)
        return on if given else not on


def read_job(config: RunConfig) -> JobModel:
    """The job of ``config`` (a Megatron job with its own script or arguments) as its flags
    describe it. Raises :class:`ConfigError` (one line) for a value it cannot parse or a
    layout Megatron would refuse."""
    reader = _Reader(config.megatron.args, config)
    architecture = _architecture(reader)
    model, kv_channels = _model(reader, config.model, architecture)
    architecture = replace(architecture, kv_channels=kv_channels)
    training = replace(config.training,
                       micro_batch_size=reader.integer("--micro-batch-size", "training.micro_batch_size"),
                       global_batch_size=reader.integer("--global-batch-size", "training.global_batch_size"),
                       train_iters=reader.integer("--train-iters", "training.train_iters"))
    parallel = _parallel(reader, config)
    model = replace(model, vocab_size=_vocab(reader, config, parallel.tensor_model_parallel_size))
    precision = replace(config.precision, bf16=reader.switch("--bf16", "precision.bf16"),
                        fp16=reader.switch("--fp16", "precision.fp16"))
    optim = _optim(reader, config, architecture.lr_decay_style)
    save = flag_value(config.megatron.args, "--save")
    checkpoint = replace(config.checkpoint, save=save) if save is not None else config.checkpoint
    job = JobModel(replace(config, model=model, training=training, parallel=parallel, precision=precision,
                           optim=optim, checkpoint=checkpoint), architecture, tuple(reader.readings))
    _refuse_inconsistent(job)
    return job


def _architecture(reader: _Reader) -> Architecture:
    swiglu = reader.switch("--swiglu", "swiglu")
    position = reader.choice("--position-embedding-type", "position_embedding_type", POSITION_EMBEDDINGS,
                             "learned_absolute")
    return Architecture(
        normalization=str(reader.choice("--normalization", "normalization", NORMALIZATIONS, "LayerNorm")),
        swiglu=swiglu, quick_geglu=reader.switch("--quick-geglu", "quick_geglu"), position_embedding=str(position),
        relative_buckets=(reader.integer("--relative-attention-num-buckets", "relative_attention_num_buckets", 32)
                          if position == "relative" else 32),
        bias_linear=reader.switch("--disable-bias-linear", "add_bias_linear", on=False),
        qkv_bias=reader.switch("--add-qkv-bias", "add_qkv_bias"),
        qk_layernorm=reader.switch("--qk-layernorm", "qk_layernorm"),
        context_parallel=reader.integer("--context-parallel-size", "context_parallel_size", 1),
        recompute=reader.choice("--recompute-granularity", "recompute_granularity", RECOMPUTE, None),
        lr_decay_style=_decay_style(reader),
        unmodelled=tuple(flag for flag in UNMODELLED_FLAGS if has_flag(reader.args, flag)),
    )


def _decay_style(reader: _Reader) -> str:
    """``--lr-decay-style`` as written (Megatron's default: linear)."""
    text = reader.text("--lr-decay-style")
    reader.record("lr_decay_style", text or "linear", FROM_FLAGS if text else FROM_DEFAULT, "--lr-decay-style")
    return text or "linear"


def _model(reader: _Reader, conf: ModelConfig, architecture: Architecture) -> tuple[ModelConfig, int]:
    """The model section from the flags (vocabulary apart: it needs the tensor-parallel size),
    and the width of one attention head."""
    hidden = reader.integer("--hidden-size", "model.hidden_size")
    heads = reader.integer("--num-attention-heads", "model.num_attention_heads")
    layers = reader.integer("--num-layers", "model.num_layers")
    ffn_default = int((4 * hidden * 2 / 3) / 64) * 64 if architecture.swiglu else 4 * hidden
    ffn = reader.integer("--ffn-hidden-size", "model.ffn_hidden_size", ffn_default)
    gqa = reader.switch("--group-query-attention", "group_query_attention")
    groups = reader.integer("--num-query-groups", "model.num_query_groups", 1) if gqa else None
    if not gqa and has_flag(reader.args, "--num-query-groups"):
        raise ConfigError("megatron.args: --num-query-groups takes effect only with --group-query-attention "
                          "(Megatron-LM ignores the groups without it): add it, or remove --num-query-groups")
    seq = reader.integer("--seq-length", "model.seq_length")
    positions = reader.optional_integer("--max-position-embeddings")
    if positions is None:
        source = FROM_FLAGS if has_flag(reader.args, "--seq-length") else FROM_CONF
        reader.record("model.max_position_embeddings", seq, source, "--seq-length",
                      "no --max-position-embeddings, which Megatron-LM requires")
    else:
        reader.record("model.max_position_embeddings", positions, FROM_FLAGS, "--max-position-embeddings")
    if hidden % heads and not has_flag(reader.args, "--kv-channels"):
        raise ConfigError(f"megatron.args: --hidden-size {hidden} is not a multiple of --num-attention-heads {heads} "
                          f"(Megatron-LM asserts it unless --kv-channels is given)")
    kv_channels = reader.integer("--kv-channels", "kv_channels", hidden // heads)
    recompute = RecomputeGranularity.full if architecture.recompute == "full" else None
    return replace(conf, num_layers=layers, hidden_size=hidden, num_attention_heads=heads, ffn_hidden_size=ffn,
                   num_query_groups=groups, seq_length=seq, max_position_embeddings=positions or seq,
                   untie_embeddings_and_output_weights=reader.switch("--untie-embeddings-and-output-weights",
                                                                     "model.untie_embeddings_and_output_weights"),
                   recompute_granularity=recompute), kv_channels


def _parallel(reader: _Reader, config: RunConfig) -> ParallelConfig:
    return replace(config.parallel,
                   tensor_model_parallel_size=reader.integer("--tensor-model-parallel-size",
                                                             "parallel.tensor_model_parallel_size", 1),
                   pipeline_model_parallel_size=reader.integer("--pipeline-model-parallel-size",
                                                               "parallel.pipeline_model_parallel_size", 1),
                   sequence_parallel=reader.switch("--sequence-parallel", "parallel.sequence_parallel"),
                   use_distributed_optimizer=reader.switch("--use-distributed-optimizer",
                                                           "parallel.use_distributed_optimizer"),
                   use_torch_fsdp2=reader.switch("--use-torch-fsdp2", "parallel.use_torch_fsdp2"))


def _vocab(reader: _Reader, config: RunConfig, tensor_parallel: int) -> int:
    """The embedding's rows: ``--padded-vocab-size`` (MindSpeed-LLM) as given; else the
    vocabulary (``--vocab-size``, or the conf's: the tokenizer's files decide it) padded as
    Megatron pads it, to a multiple of --make-vocab-size-divisible-by x TP (the built-in
    trainer's dialect pads nothing)."""
    padded = reader.optional_integer("--padded-vocab-size")
    if padded is not None:
        reader.record("model.vocab_size", padded, FROM_FLAGS, "--padded-vocab-size")
        return padded
    given = reader.optional_integer("--vocab-size")
    vocab = given if given is not None else config.model.vocab_size
    source = FROM_FLAGS if given is not None else FROM_CONF
    if config.megatron.module() == BUILTIN_MODULE:
        reader.record("model.vocab_size", vocab, source, "--vocab-size")
        return vocab
    divisible = reader.integer("--make-vocab-size-divisible-by", "make_vocab_size_divisible_by", 128)
    multiple = divisible * tensor_parallel
    rows = math.ceil(vocab / multiple) * multiple
    named = "--vocab-size" if given is not None else "the conf's model.vocab_size"
    note = f"{named} {vocab} padded to a multiple of {divisible} x TP {tensor_parallel}" if rows != vocab else ""
    reader.record("model.vocab_size", rows, source, "--vocab-size", note)
    return rows


def _optim(reader: _Reader, config: RunConfig, decay_style: str) -> OptimConfig:
    optim = replace(config.optim, lr=reader.number("--lr", "optim.lr"),
                    min_lr=reader.number("--min-lr", "optim.min_lr", 0.0))
    if decay_style in LrDecayStyle.values():
        optim = replace(optim, lr_decay_style=LrDecayStyle(decay_style))
    return optim


def _refuse_inconsistent(job: JobModel) -> None:
    """What Megatron-LM would stop at, and runmgr's arithmetic would divide by: one line."""
    config, cp = job.config, job.architecture.context_parallel
    par, t, m = config.parallel, config.training, config.model
    replica = par.tensor_model_parallel_size * par.pipeline_model_parallel_size * cp
    if config.world_size % replica:
        raise ConfigError(f"megatron.args: TP {par.tensor_model_parallel_size} x PP {par.pipeline_model_parallel_size} "
                          f"x CP {cp} = {replica} ranks per replica do not divide cluster.num_workers "
                          f"({config.world_size}): set cluster.num_workers to a multiple of {replica}")
    if t.global_batch_size % (t.micro_batch_size * job.data_parallel):
        raise ConfigError(f"megatron.args: --global-batch-size {t.global_batch_size} is not a multiple of "
                          f"--micro-batch-size {t.micro_batch_size} x data parallel {job.data_parallel} "
                          f"(Megatron-LM asserts it)")
    groups = m.num_query_groups or m.num_attention_heads
    if m.num_attention_heads % groups:
        raise ConfigError(f"megatron.args: --num-query-groups {groups} must divide --num-attention-heads "
                          f"{m.num_attention_heads}")


def parameter_count(model: ModelConfig, architecture: Architecture) -> int:
    """Parameters of Megatron-LM's GPT model (megatron/core/models/gpt) for these sizes and
    flags: the embedding (and learned positions), per layer two norms, the query/key/value
    and output projections (grouped-query attention: groups x kv_channels wide keys and
    values), the MLP (two input projections when gated: --swiglu, --quick-geglu), biases unless
    --disable-bias-linear; a final norm, and an output layer when untied."""
    a, h, f, v = architecture, model.hidden_size, model.ffn_hidden_size, model.vocab_size
    heads = model.num_attention_heads
    q_width, kv_width = heads * a.kv_channels, (model.num_query_groups or heads) * a.kv_channels
    norm_weights = 2 if a.normalization == "LayerNorm" else 1
    qkv_out = q_width + 2 * kv_width
    attention = h * qkv_out + (qkv_out if a.bias_linear or a.qkv_bias else 0) + q_width * h + (h if a.bias_linear else 0)
    qk_norms = 2 * norm_weights * a.kv_channels if a.qk_layernorm else 0
    fc1_out = 2 * f if a.swiglu or a.quick_geglu else f
    mlp = h * fc1_out + f * h + ((fc1_out + h) if a.bias_linear else 0)
    per_layer = 2 * norm_weights * h + attention + qk_norms + mlp
    positions = {"learned_absolute": model.max_position_embeddings * h,
                 "relative": a.relative_buckets * heads}.get(a.position_embedding, 0)
    output = v * h if model.untie_embeddings_and_output_weights else 0
    return v * h + positions + model.num_layers * per_layer + norm_weights * h + output
