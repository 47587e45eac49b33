"""``python -m trainer --num-layers 2 ...`` (and under ``torchrun``): the
built-in trainer run with Megatron-LM's flags, printing Megatron's lines.

What a start does, as Megatron-LM does it:

- ``--load DIR --ckpt-step N`` loads ``DIR/step_N`` (it must verify, else exit
  3); ``--load DIR`` alone the newest verified checkpoint there (none: a start
  from initialisation, with Megatron's warning); no ``--load``: from
  initialisation. Checkpoints are the built-in's verified ``step_NNNNNNNN``
  directories under ``--save``.
- A changed ``--lr``/``--min-lr`` (or warmup, decay length, decay style) at
  resume fails with Megatron's AssertionError text and exit code 1, unless
  ``--override-opt_param-scheduler`` (the new values apply, the schedule's
  step continues) or ``--no-load-optim`` (Adam and the schedule restart: a
  fresh warmup, then the decay from the peak).
- ``--iterations-to-skip I ...``: dummy iterations (ResumePlan.skip_iterations).
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence, TextIO

from trainer import exitcodes
from trainer.config import TrainerConfig
from trainer.errors import BadCheckpointError
from trainer.megatron_args import MegatronInvocation, from_megatron_args
from trainer.megatron_log import LogSettings, MegatronLog
from trainer.plan import ResumePlan

_SCHEDULER_CHECKS = (  # (manifest key, the name Megatron's OptimizerParamScheduler gives it)
    ("max_lr", "learning rate"),
    ("min_lr", "minimum learning rate"),
    ("lr_warmup_steps", "warmup iterations"),
    ("lr_decay_steps", "total number of iterations"),
    ("lr_decay_style", "learning rate decay style"),
)


def schedule_mismatch(manifest: dict, config: TrainerConfig) -> Optional[str]:
    """Megatron's message (``OptimizerParamScheduler._check_and_set``, its text
    verbatim, ``checkpointvalue`` included) for the first schedule value the
    flags change against the checkpoint; None when they agree or the
    checkpoint records no schedule."""
    from trainer.session import LR_SCHEDULE_FIELD, lr_schedule_of

    saved = manifest.get(LR_SCHEDULE_FIELD)
    if not isinstance(saved, dict):
        return None
    wanted = lr_schedule_of(config, ResumePlan())
    for key, name in _SCHEDULER_CHECKS:
        if key in saved and saved[key] != wanted[key]:
            return (f"OptimizerParamScheduler: class input value {wanted[key]} and checkpoint"
                    f"value {saved[key]} for {name} do not match")
    return None


def start_checkpoint(invocation: MegatronInvocation, rank: int, out: TextIO) -> Optional[Path]:
    """The checkpoint the flags ask to load (verified), or None for a start from
    initialisation. Raises :class:`BadCheckpointError` when ``--ckpt-step``'s does not verify."""
    from trainer.manifest import checkpoint_dir, find_latest_verified, verify_checkpoint

    if invocation.load is None:
        return None
    if invocation.ckpt_step is not None:
        path = checkpoint_dir(invocation.load, invocation.ckpt_step)
        ok, reason = verify_checkpoint(path)
        if not ok:
            raise BadCheckpointError(path, invocation.ckpt_step, f"{reason} (--load {invocation.load} "
                                     f"--ckpt-step {invocation.ckpt_step})")
        return path
    found = find_latest_verified(invocation.load)
    if rank == 0:
        for path, reason in found.rejected:
            out.write(f"WARNING: rejected checkpoint {path}: {reason}\n")
        if found.path is None:
            out.write(f"WARNING: could not find a verified checkpoint in {invocation.load}\n"
                      f"    will not load any checkpoints and will start from random\n")
        out.flush()
    return found.path


def _forward_flops_per_sample(config: TrainerConfig) -> float:
    from trainer.checkpoint import config_shapes

    parameters = sum(math.prod(shape) for shape in config_shapes(config.model).values())
    return 2.0 * parameters * config.model.seq_length


def _log(invocation: MegatronInvocation, out: TextIO) -> MegatronLog:
    config = invocation.config
    return MegatronLog(LogSettings(
        train_iters=config.training.train_iters, log_interval=config.training.log_interval,
        global_batch_size=config.training.global_batch_size, save_interval=config.checkpoint.save_interval,
        save_dir=config.checkpoint.save, load_dir=invocation.load, log_straggler=invocation.log_straggler,
        forward_flops_per_sample=_forward_flops_per_sample(config),
    ), out)


def run_megatron(argv: Sequence[str], out: Optional[TextIO] = None) -> int:
    """Parse, resolve the start, train; the exit code. Bad input raises
    (TrainerConfigError, CheckpointError); a schedule the checkpoint was not
    trained with exits 1 with Megatron's assertion, as Megatron does."""
    from trainer.distributed import DistEnv
    from trainer.loop import check_config, train
    from trainer.manifest import read_manifest

    out = out or sys.stdout
    env = DistEnv.from_environ()
    invocation = from_megatron_args(argv, world_size=env.world_size)
    config = invocation.config
    check_config(config, env.world_size)
    start = start_checkpoint(invocation, env.rank, out)
    if start is not None and not invocation.no_load_optim and not invocation.override_scheduler:
        problem = schedule_mismatch(read_manifest(start), config)
        if problem:
            sys.stderr.write(f"AssertionError: {problem}\n")
            return exitcodes.FAILED
    plan = ResumePlan(start_checkpoint=str(start) if start else None, reset_optimizer=invocation.no_load_optim,
                      restart_schedule=invocation.no_load_optim, skip_iterations=invocation.iterations_to_skip)
    reporter = _log(invocation, out) if env.rank == 0 else None
    # Every step reported: the log groups them into --log-interval intervals, as Megatron averages over them.
    every_step = replace(config, training=replace(config.training, log_interval=1))
    train(every_step, plan, reporter, env)
    return exitcodes.DONE
