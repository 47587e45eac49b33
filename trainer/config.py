"""Typed configuration of the trainer, with Megatron-LM argument names.

The trainer takes a :class:`TrainerConfig`; runmgr composes the same sections
from Hydra (``conf/``) and hands them over. Every field has a docstring: what it
means and its unit, for the reader of a conf. Validation that needs no I/O lives in
:meth:`TrainerConfig.problems`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from trainer.parallel.layout import Layout


class Choice(str, Enum):
    """A closed set of values for a config field.

    A ``str`` enum because OmegaConf 2.3 refuses ``Literal`` annotations in
    structured configs but types enums: YAML and ``key=value`` keep the plain
    strings, and any other value fails with one line naming the choices
    ("Invalid value 'x', expected one of [a, b]"). OmegaConf converts by member
    *name*, so each member's name is its value. A member compares equal to its
    string and prints as it, so the code can keep comparing with strings.
    """

    def __str__(self) -> str:
        return self.value

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """Every value, in declaration order."""
        return tuple(member.value for member in cls)


class ModelFamily(Choice):
    """Architecture family of the transformer."""

    llama = "llama"
    opt = "opt"


class RecomputeGranularity(Choice):
    """Activation recomputation in backward (Megatron's ``--recompute-granularity``)."""

    full = "full"


class LrDecayStyle(Choice):
    """Shape of the learning rate after warmup."""

    cosine = "cosine"
    linear = "linear"
    constant = "constant"


class DeviceKind(Choice):
    """What the ranks compute on; trainer/device.py gives each kind its meaning."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"
    npu = "npu"


@dataclass
class ModelConfig:
    """Shape of a decoder-only transformer."""

    family: ModelFamily = ModelFamily.llama
    """``llama``: RMSNorm, rotary positions, grouped-query attention, SwiGLU.
    ``opt``: LayerNorm, learned positions, ReLU MLP."""
    num_layers: int = 2
    """Number of transformer blocks."""
    hidden_size: int = 64
    """Width of the residual stream."""
    ffn_hidden_size: int = 172
    """Inner width of the MLP."""
    num_attention_heads: int = 4
    """Query heads per layer."""
    num_query_groups: Optional[int] = None
    """Key/value heads (grouped-query attention); None means one per query head."""
    seq_length: int = 64
    """Tokens per training sample."""
    max_position_embeddings: int = 64
    """Longest sequence the position encoding supports (>= seq_length)."""
    vocab_size: int = 256
    """Vocabulary size; 256 for the byte-level embedded corpus."""
    norm_epsilon: float = 1e-5
    """Epsilon of RMSNorm / LayerNorm."""
    hidden_dropout: float = 0.0
    """Dropout after attention and MLP (seed 000: keep 0 for pretraining)."""
    attention_dropout: float = 0.0
    """Dropout on attention probabilities."""
    init_method_std: float = 0.02
    """Standard deviation of the Gaussian weight init (also learned positions)."""
    untie_embeddings_and_output_weights: bool = False
    """True: separate output projection; False: output shares the embedding."""
    rotary_base: float = 10000.0
    """Base of the rotary frequencies (llama family)."""
    recompute_granularity: Optional[RecomputeGranularity] = None
    """None, or ``full``: recompute each block's activations in backward."""


@dataclass
class OptimConfig:
    """AdamW and the learning-rate schedule."""

    lr: float = 1e-3
    """Peak learning rate, reached at the end of warmup."""
    min_lr: float = 1e-4
    """Learning rate at the end of decay."""
    lr_decay_style: LrDecayStyle = LrDecayStyle.cosine
    """``cosine``, ``linear`` or ``constant`` decay after warmup."""
    lr_warmup_fraction: Optional[float] = None
    """Warmup length as a fraction of the decay iterations (overrides lr_warmup_iters)."""
    lr_warmup_iters: int = 0
    """Warmup length in iterations."""
    lr_decay_iters: Optional[int] = None
    """Iterations over which to decay; None means train_iters."""
    weight_decay: float = 0.1
    """Decoupled weight decay, applied to matrices (>= 2-D weights)."""
    decay_1d_weights: bool = False
    """Also decay biases and 1-D weights (norm gains). Megatron does not; seed
    004 traced a loss gap to one framework doing it. Kept for reproducing that
    mistake (``runmgr precision-check``); ``runmgr lint`` warns when on."""
    clip_grad: float = 1.0
    """Global gradient-norm clipping threshold; 0 disables clipping."""
    adam_beta1: float = 0.9
    """Adam beta1."""
    adam_beta2: float = 0.95
    """Adam beta2 (seeds 000/002: 0.95, not 0.999)."""
    adam_eps: float = 1e-8
    """Adam epsilon (seed 000: 1e-8, not 1e-5)."""


@dataclass
class PrecisionConfig:
    """Mixed precision; at most one of bf16 and fp16."""

    bf16: bool = False
    """Autocast compute to bfloat16, fp32 master weights."""
    embedding_bf16: bool = False
    """Keep the embedding's weight in bfloat16 as the passes see it: the lookup
    (and the tied output projection) use its bf16 rounding and its gradient is
    rounded to bf16 too; the optimizer keeps fp32 master weights. Seed 004's
    forward-stage case (one framework's embedding in bf16, the reference's in
    fp32), kept for reproducing it (``runmgr precision-check``). No Megatron
    flag: refused with ``trainer.kind=megatron``."""
    fp16: bool = False
    """Autocast compute to float16 with a dynamic loss scaler."""
    initial_loss_scale: float = 65536.0
    """fp16: starting loss scale."""
    loss_scale_window: int = 1000
    """fp16: steps without overflow before the scale doubles."""
    min_loss_scale: float = 1.0
    """fp16: the scale never drops below this."""
    hysteresis: int = 2
    """fp16: overflows tolerated before the scale halves."""


@dataclass
class DataConfig:
    """Where training samples come from."""

    data_path: Optional[str] = None
    """Prefix of a Megatron indexed dataset (``PREFIX.bin`` / ``PREFIX.idx``);
    None uses the embedded corpus (the Python standard library's source, bytes)."""
    corpus_max_bytes: int = 4_000_000
    """Embedded corpus only: how many bytes of source to tokenize."""


@dataclass
class TrainingConfig:
    """Batching, length and reproducibility of the run."""

    micro_batch_size: int = 4
    """Samples per rank per forward/backward pass."""
    global_batch_size: int = 8
    """Samples per optimizer step over all data-parallel ranks; must be a
    multiple of micro_batch_size x data-parallel size."""
    train_iters: int = 100
    """Optimizer steps to train."""
    seed: int = 1234
    """Seed of initialisation, data order and dropout."""
    deterministic: bool = True
    """Deterministic algorithms and per-step reseeding so that a resumed run
    reproduces the uninterrupted one bit for bit (HCCL_DETERMINISTIC on NPU)."""
    log_interval: int = 1
    """Report every this many steps."""
    local_norms_interval: int = 100
    """Record every weight's gradient norm (seed 004's "local norm", docs/local_norms.md)
    every this many steps, besides the steps a resume plan asks for; 0: only those."""


@dataclass
class ParallelConfig:
    """How ranks split the work: data parallel, tensor parallel, pipeline parallel
    (1F1B), ZeRO-1 (``use_distributed_optimizer``) and FSDP2 (docs/parallel.md).
    ``runmgr launch --dry-run`` plans any consistent layout; the combinations the
    built-in trainer cannot execute are refused with one line
    (:meth:`TrainerConfig.unsupported`)."""

    tensor_model_parallel_size: int = 1
    """Tensor-parallel degree (Megatron): each rank of a group holds 1/tp of every
    large matrix (DTensor, :mod:`trainer.parallel.tensor`); it must divide the
    attention heads, key/value groups, ffn_hidden_size and vocab_size."""
    sequence_parallel: bool = False
    """With tensor parallelism, run the norms and dropouts on 1/tp of the
    sequence (Megatron's --sequence-parallel); needs tp > 1 and tp dividing seq_length."""
    pipeline_model_parallel_size: int = 1
    """Pipeline-parallel degree: the layers split evenly by number over this many
    stages (1F1B schedule, the step's micro-batches; needs an untied output)."""
    use_distributed_optimizer: bool = False
    """Shard the optimizer state and the update over data parallel (ZeRO-1,
    Megatron's distributed optimizer); weights and gradients stay replicated."""
    use_torch_fsdp2: bool = False
    """Shard weights, gradients and optimizer state over data parallel
    (``fully_shard``, ZeRO-3)."""
    dist_timeout_s: float = 60.0
    """Timeout of collectives: a hung peer surfaces as an error after this long."""


@dataclass
class CheckpointConfig:
    """Sharded checkpoints (torch.distributed.checkpoint) with a manifest."""

    save: Optional[str] = None
    """Directory of checkpoints; runmgr sets it to ``<run dir>/checkpoints``."""
    save_interval: int = 10
    """Save every this many steps (and at the end)."""
    keep_last: int = 3
    """Verified checkpoints kept; older ones are deleted (0: keep every one). The
    trainer alone deletes them after each save; under runmgr only the driver
    deletes, once its logbook has recorded a newer one, and the trainer none."""
    async_save: bool = True
    """Write in the background on a process group of its own."""
    memory_interval: int = 0
    """Keep this rank's state in memory for warm recovery every this many steps (0: none).
    With a driver that re-forms the group (runmgr's warm restarts), a rank that survives a
    peer's death goes on in the same process, and a replacement copies its state from a peer's
    memory. In plain data parallel a replica's live state is that copy, current at every step
    whatever the interval, and no snapshot is taken (trainer/live.py); under the other layouts
    each rank snapshots every this many steps and its buddy keeps a copy (trainer/warm.py)."""


@dataclass
class TrainerConfig:
    """Everything the trainer needs to run. Its fields are the trainer's
    sections of a composed config (:data:`TRAINER_SECTIONS`): adding one here
    adds it to runmgr's RunConfig and to the trainer's CLI."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Shape of the transformer (conf/model/*.yaml)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """AdamW and the learning-rate schedule."""
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    """Mixed precision and the fp16 loss scaler."""
    data: DataConfig = field(default_factory=DataConfig)
    """Where samples come from."""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """Batching, length, seed."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """How ranks split the work."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Where and how often checkpoints are written."""
    device: DeviceKind = DeviceKind.auto
    """``auto`` (npu, then cuda, then cpu), ``cpu``, ``cuda`` or ``npu``."""

    def layout(self, world_size: int) -> "Layout":
        """How ``world_size`` ranks split the work under :attr:`parallel`."""
        from trainer.parallel.layout import layout_of  # the parallel package imports this module

        par = self.parallel
        return layout_of(world_size, par.tensor_model_parallel_size, par.pipeline_model_parallel_size,
                         par.use_distributed_optimizer, par.use_torch_fsdp2)

    @property
    def model_parallel_size(self) -> int:
        """Ranks of one data-parallel replica: tensor x pipeline parallel."""
        return self.parallel.tensor_model_parallel_size * self.parallel.pipeline_model_parallel_size

    def data_parallel_size(self, world_size: int) -> int:
        return world_size // self.model_parallel_size

    def world_size_of(self, data_parallel_size: int) -> int:
        """Ranks that ``data_parallel_size`` replicas take."""
        return data_parallel_size * self.model_parallel_size

    def accumulation_steps(self, world_size: int) -> int:
        """Micro-batches per rank per step: global / (micro x data parallel)."""
        dp = self.data_parallel_size(world_size)
        return self.training.global_batch_size // (self.training.micro_batch_size * dp)

    def unsupported(self) -> Optional[str]:
        """One line naming the settings the built-in trainer cannot execute
        although the config is consistent (``--dry-run`` plans them for a
        trainer that can), and the values it runs; None when it runs them all."""
        par = self.parallel
        if par.use_distributed_optimizer and par.tensor_model_parallel_size > 1:
            return ("the built-in trainer cannot execute parallel.use_distributed_optimizer=true with "
                    f"parallel.tensor_model_parallel_size={par.tensor_model_parallel_size} (ZeRO-1 shards whole "
                    "replicated weights); set parallel.use_distributed_optimizer=false")
        sharded = [key for key, on in (("parallel.use_distributed_optimizer", par.use_distributed_optimizer),
                                        ("parallel.use_torch_fsdp2", par.use_torch_fsdp2)) if on]
        if sharded and par.pipeline_model_parallel_size > 1:
            return (f"the built-in trainer cannot execute {sharded[0]}=true with parallel.pipeline_model_parallel_size="
                    f"{par.pipeline_model_parallel_size} yet (sharding within pipeline stages is not verified); "
                    f"set {sharded[0]}=false")
        return self._tensor_parallel_unsupported() or self._unsupported_pipeline()

    def _unsupported_pipeline(self) -> Optional[str]:
        """The pipeline combinations the trainer cannot run: a tied output (the
        built-in pipeline does not share the embedding between its first and
        last stage; Megatron does)."""
        if self.parallel.pipeline_model_parallel_size > 1 and not self.model.untie_embeddings_and_output_weights:
            return ("pipeline parallel needs model.untie_embeddings_and_output_weights=true (the built-in trainer "
                    "does not share a tied output between the first and last stage); set it, or "
                    "parallel.pipeline_model_parallel_size=1")
        return None

    def _tensor_parallel_unsupported(self) -> Optional[str]:
        """The combinations with tensor parallelism the trainer cannot run."""
        tp = self.parallel.tensor_model_parallel_size
        if tp > 1 and self.precision.embedding_bf16:
            return ("precision.embedding_bf16=true cannot run with parallel.tensor_model_parallel_size>1 (the "
                    "vocabulary-parallel embedding looks up its fp32 weight); set precision.embedding_bf16=false")
        return None

    def _tensor_parallel_problems(self) -> list[str]:
        """What tensor parallelism needs of the model's sizes: whole heads,
        key/value groups, ffn columns and vocabulary rows on every rank."""
        m, tp = self.model, self.parallel.tensor_model_parallel_size
        if tp <= 1:
            if self.parallel.sequence_parallel:
                return ["parallel.sequence_parallel=true needs parallel.tensor_model_parallel_size > 1 "
                        "(it splits the sequence over the tensor-parallel ranks); set parallel.sequence_parallel=false"]
            return []
        sizes = {"model.num_attention_heads": m.num_attention_heads,
                 "model.num_query_groups": m.num_query_groups or m.num_attention_heads,
                 "model.ffn_hidden_size": m.ffn_hidden_size, "model.vocab_size": m.vocab_size}
        if self.parallel.sequence_parallel:
            sizes["model.seq_length"] = m.seq_length
        return [f"parallel.tensor_model_parallel_size ({tp}) must divide {key} ({value}); "
                f"choose a tensor-parallel size that divides it" for key, value in sizes.items() if value % tp]

    def problems(self, world_size: int) -> list[str]:
        """Every inconsistency of this config for ``world_size`` ranks, as
        one-line messages naming the key and how to fix it (empty when valid).
        A consistent config may still be one the built-in trainer cannot run:
        see :meth:`unsupported`."""
        m, o, p, t, par = self.model, self.optim, self.precision, self.training, self.parallel
        out: list[str] = []
        positives = {
            "model.num_layers": m.num_layers, "model.hidden_size": m.hidden_size,
            "model.ffn_hidden_size": m.ffn_hidden_size, "model.num_attention_heads": m.num_attention_heads,
            "model.seq_length": m.seq_length, "model.max_position_embeddings": m.max_position_embeddings,
            "model.vocab_size": m.vocab_size, "training.micro_batch_size": t.micro_batch_size,
            "training.global_batch_size": t.global_batch_size, "training.train_iters": t.train_iters,
            "parallel.tensor_model_parallel_size": par.tensor_model_parallel_size,
            "parallel.pipeline_model_parallel_size": par.pipeline_model_parallel_size,
            "checkpoint.save_interval": self.checkpoint.save_interval,
            "training.log_interval": t.log_interval, "precision.loss_scale_window": p.loss_scale_window,
            "precision.hysteresis": p.hysteresis,
        }
        out += [f"{k} must be a positive integer, got {v}" for k, v in positives.items() if v <= 0]
        if t.local_norms_interval < 0:
            out.append(f"training.local_norms_interval must be >= 0 (0: only the steps a rollback asks for), "
                       f"got {t.local_norms_interval}")
        if self.checkpoint.keep_last < 0:
            out.append(f"checkpoint.keep_last must be >= 0 (0 keeps every checkpoint), got {self.checkpoint.keep_last}")
        if self.checkpoint.memory_interval < 0:
            out.append(f"checkpoint.memory_interval must be >= 0 (0: no in-memory snapshots), got "
                       f"{self.checkpoint.memory_interval}")
        if out:
            return out
        if m.hidden_size % m.num_attention_heads:
            out.append(f"model.hidden_size ({m.hidden_size}) must be divisible by model.num_attention_heads ({m.num_attention_heads})")
        groups = m.num_query_groups or m.num_attention_heads
        if groups <= 0 or m.num_attention_heads % groups:
            out.append(f"model.num_query_groups ({groups}) must divide model.num_attention_heads ({m.num_attention_heads})")
        if m.max_position_embeddings < m.seq_length:
            out.append(f"model.max_position_embeddings ({m.max_position_embeddings}) must be >= model.seq_length ({m.seq_length})")
        if o.lr <= 0 or o.min_lr < 0 or o.min_lr > o.lr:
            out.append(f"optim.lr ({o.lr}) must be > 0 and optim.min_lr ({o.min_lr}) in [0, lr]")
        if not (0 <= o.adam_beta1 < 1 and 0 <= o.adam_beta2 < 1):
            out.append(f"optim.adam_beta1/adam_beta2 must be in [0, 1), got {o.adam_beta1}/{o.adam_beta2}")
        if o.adam_eps <= 0 or o.weight_decay < 0 or o.clip_grad < 0:
            out.append("optim.adam_eps must be > 0, optim.weight_decay and optim.clip_grad >= 0")
        if o.lr_warmup_fraction is not None and not 0 <= o.lr_warmup_fraction <= 1:
            out.append(f"optim.lr_warmup_fraction must be in [0, 1], got {o.lr_warmup_fraction}")
        if o.lr_warmup_iters < 0:
            out.append(f"optim.lr_warmup_iters must be >= 0, got {o.lr_warmup_iters}")
        if o.lr_decay_iters is not None and o.lr_decay_iters <= 0:
            out.append(f"optim.lr_decay_iters must be a positive integer or null (train_iters), got {o.lr_decay_iters}")
        if not (0 <= m.hidden_dropout < 1 and 0 <= m.attention_dropout < 1):
            out.append(f"model.hidden_dropout/attention_dropout must be in [0, 1), got {m.hidden_dropout}/{m.attention_dropout}")
        if m.norm_epsilon <= 0 or m.init_method_std <= 0 or m.rotary_base <= 0:
            out.append("model.norm_epsilon, model.init_method_std and model.rotary_base must be > 0")
        if not 0 < p.min_loss_scale <= p.initial_loss_scale or par.dist_timeout_s <= 0:
            out.append(f"need 0 < precision.min_loss_scale ({p.min_loss_scale}) <= precision.initial_loss_scale "
                       f"({p.initial_loss_scale}) and parallel.dist_timeout_s > 0 ({par.dist_timeout_s})")
        if t.seed < 0:
            out.append(f"training.seed must be >= 0 (numpy's seed sequences take no negative number), got {t.seed}")
        if p.bf16 and p.fp16:
            out.append("precision.bf16 and precision.fp16 are both true: choose one")
        if par.use_distributed_optimizer and par.use_torch_fsdp2:
            out.append("parallel.use_distributed_optimizer and parallel.use_torch_fsdp2 are both true: choose one "
                       "(FSDP2 already shards the optimizer state)")
        pp = par.pipeline_model_parallel_size
        if m.num_layers % pp:
            out.append(f"parallel.pipeline_model_parallel_size ({pp}) must divide model.num_layers ({m.num_layers}): "
                       "each stage holds as many layers")
        out += self._tensor_parallel_problems()
        model_parallel = par.tensor_model_parallel_size * pp
        if world_size % model_parallel:
            out.append(f"world size {world_size} is not divisible by tensor x pipeline parallel size {model_parallel}")
        else:
            dp = world_size // model_parallel
            if t.global_batch_size % (t.micro_batch_size * dp):
                out.append(
                    f"training.global_batch_size ({t.global_batch_size}) must be divisible by "
                    f"micro_batch_size x data-parallel size ({t.micro_batch_size} x {dp} = {t.micro_batch_size * dp})"
                )
            elif pp > 1 and self.accumulation_steps(world_size) < pp:
                out.append(
                    f"pipeline parallel {pp} needs at least {pp} micro-batches a step (1F1B keeps every stage busy), "
                    f"got training.global_batch_size / (micro_batch_size x data-parallel size) = "
                    f"{self.accumulation_steps(world_size)}; raise training.global_batch_size or lower "
                    "training.micro_batch_size"
                )
        return out


TRAINER_SECTIONS: tuple[str, ...] = tuple(f.name for f in fields(TrainerConfig))
"""The top-level keys of a composed config that belong to the trainer (the
one list: runmgr's RunConfig inherits these fields, the trainer's CLI keeps
these sections)."""


def _yaml(value: object) -> str:
    """``value`` as a user writes it in YAML or ``key=value``."""
    return str(value).lower() if isinstance(value, bool) else str(value)
