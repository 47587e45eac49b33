"""Megatron-LM's command-line dialect for the built-in trainer.

``from_megatron_args`` reads the flags a user passes to Megatron-LM's
``pretrain_gpt.py`` into a :class:`TrainerConfig` plus what a start needs
(``--load``, ``--ckpt-step``, ``--iterations-to-skip``...);
``to_megatron_args`` writes a config's sections back as flags, so the two
round-trip. Only flags the built-in trainer honours are taken; any other is
refused with one line (run the real Megatron-LM for it). An absent flag gets
Megatron-LM's default (``megatron/training/arguments.py``), not the trainer's.

The built-in builds one architecture with Megatron flags: the LLaMA family
(``--normalization RMSNorm --swiglu --position-embedding-type rope
--disable-bias-linear``); the ``opt`` family's ReLU MLP has no Megatron flag.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from trainer.config import (
    CheckpointConfig,
    DataConfig,
    DeviceKind,
    LrDecayStyle,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    PrecisionConfig,
    RecomputeGranularity,
    TrainerConfig,
    TrainingConfig,
)
from trainer.errors import TrainerConfigError

LLAMA_FLAGS = ("--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope", "--disable-bias-linear")
"""The flags that make Megatron build the LLaMA family, the one the dialect builds."""
_BACKEND_OF_DEVICE = {DeviceKind.cpu: "gloo", DeviceKind.cuda: "nccl"}
_DEVICE_OF_BACKEND = {backend: device for device, backend in _BACKEND_OF_DEVICE.items()}


@dataclass(frozen=True)
class MegatronInvocation:
    """One dialect command line, read."""

    config: TrainerConfig
    """Model, optimizer, training, data, checkpoint and precision from the flags."""
    load: Optional[str]
    """``--load``: directory of checkpoints to resume from; None starts from initialisation."""
    ckpt_step: Optional[int]
    """``--ckpt-step``: the iteration to load; None loads the newest verified one."""
    no_load_optim: bool
    """``--no-load-optim``: weights only; Adam and the LR schedule restart (a fresh warmup)."""
    no_load_rng: bool
    """``--no-load-rng``: the built-in never loads an RNG state (each step reseeds from
    seed, step and rank), so with or without it no RNG state is loaded."""
    override_scheduler: bool
    """``--override-opt_param-scheduler``: a changed --lr/--min-lr applies at resume."""
    iterations_to_skip: tuple[int, ...]
    """``--iterations-to-skip``: 1-indexed iterations run as dummy steps (no update)."""
    log_straggler: bool
    """``--log-straggler``: print Megatron's straggler report every log interval."""
    tracker_file: Optional[str] = None
    """``--result-rejected-tracker-filename``: not taken (the built-in validates no
    result), so always None; kept for the contract's shape."""


@dataclass(frozen=True)
class _Scalar:
    """A flag that is one config field: ``section.field`` with a type."""

    flag: str
    section: str
    field: str
    kind: Callable[[str], Any]
    megatron_default: Any = None
    """Megatron-LM's default; ``_REQUIRED`` when Megatron requires the flag."""


_REQUIRED = object()
_SCALARS = (
    _Scalar("--num-layers", "model", "num_layers", int, _REQUIRED),
    _Scalar("--hidden-size", "model", "hidden_size", int, _REQUIRED),
    _Scalar("--num-attention-heads", "model", "num_attention_heads", int, _REQUIRED),
    _Scalar("--seq-length", "model", "seq_length", int, _REQUIRED),
    _Scalar("--vocab-size", "model", "vocab_size", int, 256),
    _Scalar("--norm-epsilon", "model", "norm_epsilon", float, 1e-5),
    _Scalar("--rotary-base", "model", "rotary_base", float, 10000.0),
    _Scalar("--init-method-std", "model", "init_method_std", float, 0.02),
    _Scalar("--hidden-dropout", "model", "hidden_dropout", float, 0.1),
    _Scalar("--attention-dropout", "model", "attention_dropout", float, 0.1),
    _Scalar("--lr", "optim", "lr", float, _REQUIRED),
    _Scalar("--min-lr", "optim", "min_lr", float, 0.0),
    _Scalar("--lr-decay-iters", "optim", "lr_decay_iters", int, None),
    _Scalar("--weight-decay", "optim", "weight_decay", float, 0.01),
    _Scalar("--clip-grad", "optim", "clip_grad", float, 1.0),
    _Scalar("--adam-beta1", "optim", "adam_beta1", float, 0.9),
    _Scalar("--adam-beta2", "optim", "adam_beta2", float, 0.999),
    _Scalar("--adam-eps", "optim", "adam_eps", float, 1e-8),
    _Scalar("--initial-loss-scale", "precision", "initial_loss_scale", float, float(2 ** 32)),
    _Scalar("--min-loss-scale", "precision", "min_loss_scale", float, 1.0),
    _Scalar("--loss-scale-window", "precision", "loss_scale_window", int, 1000),
    _Scalar("--hysteresis", "precision", "hysteresis", int, 2),
    _Scalar("--micro-batch-size", "training", "micro_batch_size", int, _REQUIRED),
    _Scalar("--train-iters", "training", "train_iters", int, _REQUIRED),
    _Scalar("--seed", "training", "seed", int, 1234),
    _Scalar("--log-interval", "training", "log_interval", int, 100),
    _Scalar("--save", "checkpoint", "save", str, None),
    _Scalar("--pipeline-model-parallel-size", "parallel", "pipeline_model_parallel_size", int, 1),
)
_SWITCHES = (  # (flag, section, field): store_true flags that are one bool field
    ("--untie-embeddings-and-output-weights", "model", "untie_embeddings_and_output_weights"),
    ("--bf16", "precision", "bf16"),
    ("--fp16", "precision", "fp16"),
    ("--deterministic-mode", "training", "deterministic"),
    ("--async-save", "checkpoint", "async_save"),
)


_NO_FLAG = (  # (section, field, why Megatron has no flag for it): bool settings the dialect cannot express when on
    ("optim", "decay_1d_weights", "Megatron never decays biases and 1-D weights"),
    ("precision", "embedding_bf16", "Megatron keeps the embedding in the model's own dtype"),
)


def without_megatron_flag(config: TrainerConfig) -> Optional[str]:
    """One line naming the settings that are on but have no Megatron flag (a
    Megatron job would run without them), with the fix; None when there is none."""
    on = [(f"{section}.{name}", why) for section, name, why in _NO_FLAG if getattr(getattr(config, section), name)]
    if not on:
        return None
    keys = ", ".join(f"{key}=true" for key, _ in on)
    reasons = "; ".join(why for _, why in on)
    fix = " ".join(f"{key}=false" for key, _ in on)
    return (f"{keys} has no Megatron flag ({reasons}): a Megatron job cannot run it; set {fix} "
            f"or use trainer.kind=builtin")


class _Parser(argparse.ArgumentParser):
    """argparse that raises one line instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise TrainerConfigError(f"bad Megatron arguments: {message}")


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m trainer", allow_abbrev=False,
                     description="The built-in trainer, driven by Megatron-LM's flags (the ones it can honour).")
    for scalar in _SCALARS:
        parser.add_argument(scalar.flag, type=scalar.kind, default=None)
    for flag, _section, _field in _SWITCHES:
        parser.add_argument(flag, action="store_true")
    add = parser.add_argument
    add("--ffn-hidden-size", type=int, default=None, help="default as Megatron: 4 x hidden (2/3 of it, /64, with --swiglu)")
    add("--max-position-embeddings", type=int, default=None, help="default: --seq-length")
    add("--group-query-attention", action="store_true")
    add("--num-query-groups", type=int, default=None)
    add("--normalization", choices=("LayerNorm", "RMSNorm"), default="LayerNorm")
    add("--position-embedding-type", choices=("learned_absolute", "rope"), default="learned_absolute")
    add("--swiglu", action="store_true")
    add("--disable-bias-linear", action="store_true")
    add("--tokenizer-type", choices=("NullTokenizer",), default=None, help="tokens as the data holds them")
    add("--recompute-granularity", choices=tuple(RecomputeGranularity.values()), default=None)
    add("--lr-decay-style", choices=tuple(LrDecayStyle.values()), default="linear")
    add("--lr-warmup-iters", type=int, default=None)
    add("--lr-warmup-fraction", type=float, default=None)
    add("--optimizer", choices=("adam",), default="adam", help="AdamW, as Megatron's adam")
    add("--global-batch-size", type=int, default=None, help="default: micro batch x data-parallel size")
    add("--data-path", nargs="*", default=None, help="one dataset prefix; none: the embedded corpus")
    add("--save-interval", type=int, default=None, help="default: --train-iters (a save at the end)")
    add("--ckpt-format", choices=("torch_dist",), default="torch_dist")
    add("--tensor-model-parallel-size", type=int, choices=(1,), default=1)
    add("--distributed-backend", choices=tuple(_DEVICE_OF_BACKEND), default=None,
        help="gloo: CPU ranks, nccl: CUDA ranks; absent: the device layer picks (npu, cuda, cpu)")
    add("--distributed-timeout-minutes", type=int, default=10)
    add("--load", default=None)
    add("--ckpt-step", type=int, default=None)
    add("--no-load-optim", action="store_true")
    add("--no-load-rng", action="store_true")
    add("--override-opt_param-scheduler", "--override-opt-param-scheduler", dest="override_opt_param_scheduler",
        action="store_true")
    add("--iterations-to-skip", nargs="+", type=int, default=[])
    add("--log-straggler", action="store_true")
    return parser


def _refuse_unknown(extras: list[str]) -> None:
    flags = [item for item in extras if item.startswith("-")]
    if flags:
        name = flags[0].split("=", 1)[0]
        raise TrainerConfigError(
            f"unknown Megatron flag {name}: the built-in trainer's dialect takes only the flags it can honour "
            f"(`python -m trainer --help` lists them); run the real Megatron-LM for it (trainer.kind=megatron "
            f"with megatron.script)")
    if extras:
        raise TrainerConfigError(f"unexpected argument {extras[0]!r}: Megatron flags start with --")


def _require_llama(args: argparse.Namespace) -> None:
    if (args.normalization, args.swiglu, args.position_embedding_type, args.disable_bias_linear) != \
            ("RMSNorm", True, "rope", True):
        raise TrainerConfigError(
            "the built-in trainer's dialect builds the LLaMA family only: pass " + " ".join(LLAMA_FLAGS)
            + "; run the real Megatron-LM for another architecture")


def _model(args: argparse.Namespace, values: dict[str, dict]) -> ModelConfig:
    if args.num_query_groups is not None and not args.group_query_attention:
        raise TrainerConfigError("--num-query-groups takes effect only with --group-query-attention: add it "
                                 "(Megatron ignores the groups without it)")
    hidden = values["model"]["hidden_size"]
    ffn = args.ffn_hidden_size if args.ffn_hidden_size is not None else int((4 * hidden * 2 / 3) / 64) * 64
    recompute = RecomputeGranularity(args.recompute_granularity) if args.recompute_granularity else None
    return ModelConfig(family="llama", ffn_hidden_size=ffn, num_query_groups=args.num_query_groups,
                       max_position_embeddings=args.max_position_embeddings or values["model"]["seq_length"],
                       recompute_granularity=recompute, **values["model"])


def _data_path(args: argparse.Namespace) -> Optional[str]:
    if not args.data_path:
        return None
    if len(args.data_path) != 1:
        raise TrainerConfigError(f"--data-path takes one dataset prefix in the built-in trainer, got "
                                 f"{len(args.data_path)} items (weighted blends are Megatron-LM's)")
    return args.data_path[0]


def _sections(args: argparse.Namespace) -> dict[str, dict]:
    values: dict[str, dict] = {name: {} for name in ("model", "optim", "precision", "training", "checkpoint",
                                                     "parallel")}
    for scalar in _SCALARS:
        given = getattr(args, _dest(scalar.flag))
        if given is None and scalar.megatron_default is _REQUIRED:
            raise TrainerConfigError(f"{scalar.flag} is required (as in Megatron-LM)")
        values[scalar.section][scalar.field] = scalar.megatron_default if given is None else given
    for flag, section, name in _SWITCHES:
        values[section][name] = bool(getattr(args, _dest(flag)))
    return values


def from_megatron_args(argv: Sequence[str], world_size: int = 1) -> MegatronInvocation:
    """Read Megatron flags. ``world_size`` only fills an absent --global-batch-size
    (Megatron's default: micro batch x data-parallel size). Raises
    :class:`TrainerConfigError` (one line) on an unknown, unsupported or bad flag."""
    args, extras = _parser().parse_known_args(list(argv))
    _refuse_unknown(extras)
    _require_llama(args)
    values = _sections(args)
    training = values["training"]
    stages = values["parallel"]["pipeline_model_parallel_size"]  # a bad one is refused with the config
    data_parallel = max(1, world_size // stages) if stages > 0 else world_size
    training["global_batch_size"] = args.global_batch_size or training["micro_batch_size"] * data_parallel
    training["local_norms_interval"] = 0  # Megatron's log has no per-weight norms (docs/local_norms.md)
    if args.lr_warmup_iters is not None and args.lr_warmup_fraction is not None:
        raise TrainerConfigError("--lr-warmup-iters and --lr-warmup-fraction are both given: pass one (as Megatron asserts)")
    optim = OptimConfig(lr_decay_style=LrDecayStyle(args.lr_decay_style), lr_warmup_iters=args.lr_warmup_iters or 0,
                        lr_warmup_fraction=args.lr_warmup_fraction, **values["optim"])
    checkpoint = CheckpointConfig(save_interval=args.save_interval or training["train_iters"],
                                  keep_last=0, **values["checkpoint"])  # Megatron deletes no checkpoint
    config = TrainerConfig(
        model=_model(args, values), optim=optim, precision=PrecisionConfig(**values["precision"]),
        data=DataConfig(data_path=_data_path(args)), training=TrainingConfig(**training),
        parallel=ParallelConfig(dist_timeout_s=60.0 * args.distributed_timeout_minutes, **values["parallel"]),
        checkpoint=checkpoint,
        device=_DEVICE_OF_BACKEND.get(args.distributed_backend, DeviceKind.auto),
    )
    return MegatronInvocation(
        config=config, load=args.load, ckpt_step=args.ckpt_step, no_load_optim=args.no_load_optim,
        no_load_rng=args.no_load_rng, override_scheduler=args.override_opt_param_scheduler,
        iterations_to_skip=tuple(args.iterations_to_skip), log_straggler=args.log_straggler,
    )


def _number(value: Any) -> str:
    """As a flag's value: an integral float as an int (Megatron types --rotary-base as int)."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    return str(value)


def _shape_args(model: ModelConfig) -> list[str]:
    if model.family != "llama":
        raise TrainerConfigError(f"model.family={model.family} has no Megatron flags (its ReLU MLP is not one of "
                                 f"Megatron's activations): the dialect builds the llama family")
    out = [*LLAMA_FLAGS, "--ffn-hidden-size", str(model.ffn_hidden_size),
           "--max-position-embeddings", str(model.max_position_embeddings), "--tokenizer-type", "NullTokenizer"]
    if model.num_query_groups is not None:
        out += ["--group-query-attention", "--num-query-groups", str(model.num_query_groups)]
    if model.recompute_granularity is not None:
        out += ["--recompute-granularity", str(model.recompute_granularity)]
    return out


def _optim_args(optim: OptimConfig) -> list[str]:
    out = ["--lr-decay-style", str(optim.lr_decay_style)]
    if optim.lr_warmup_fraction is not None:
        return out + ["--lr-warmup-fraction", _number(optim.lr_warmup_fraction)]
    return out + ["--lr-warmup-iters", str(optim.lr_warmup_iters)]


def to_megatron_args(config: TrainerConfig) -> list[str]:
    """The flags that make :func:`from_megatron_args` give ``config`` back. Not
    expressed (the dialect's value comes back instead): ``data.corpus_max_bytes``,
    ``checkpoint.keep_last`` (0: Megatron keeps every checkpoint), ``training.local_norms_interval``
    (0: Megatron prints no per-weight gradient norms; runmgr refuses it as an override), ``device``
    ``auto``/``npu`` (no flag: the device layer picks) and ``parallel.dist_timeout_s``
    below a whole minute (rounded up). Raises :class:`TrainerConfigError` for a
    config the dialect cannot express (the opt family, model parallelism, a setting
    without a Megatron flag: :func:`without_megatron_flag`)."""
    unsupported = config.unsupported() or without_megatron_flag(config)
    if unsupported:
        raise TrainerConfigError(unsupported)
    out: list[str] = []
    for scalar in _SCALARS:
        value = getattr(getattr(config, scalar.section), scalar.field)
        if value is not None:
            out += [scalar.flag, _number(value)]
    out += [flag for flag, section, name in _SWITCHES if getattr(getattr(config, section), name)]
    out += _shape_args(config.model) + _optim_args(config.optim)
    out += ["--global-batch-size", str(config.training.global_batch_size),
            "--save-interval", str(config.checkpoint.save_interval),
            "--distributed-timeout-minutes", str(max(1, math.ceil(config.parallel.dist_timeout_s / 60)))]
    if config.data.data_path is not None:
        out += ["--data-path", config.data.data_path]
    if config.device in _BACKEND_OF_DEVICE:
        out += ["--distributed-backend", _BACKEND_OF_DEVICE[DeviceKind(config.device)]]
    return out
