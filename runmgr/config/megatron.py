"""Which trainer a run drives (``trainer.kind``) and, for a Megatron-LM or
MindSpeed-LLM job, how it is started (``megatron.*``).

runmgr rewrites the flags it owns in every sub-run (the start checkpoint, the
LR, clipping, the optimizer reset, skipped iterations: runmgr/megatron/flags.py)
and reads the others for its own arithmetic, so some flags are required and a
few are refused here, each with one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from trainer.config import Choice

from runmgr.config.argv import flag_value, flag_values, has_flag

REQUIRED_FLAGS: dict[str, str] = {
    "--save": "runmgr verifies, mirrors and restarts from the checkpoints written there",
    "--train-iters": "runmgr measures progress and places triggers in iterations",
    "--global-batch-size": "runmgr turns skipped samples into --iterations-to-skip with it",
}
"""Flags a Megatron job must pass, and why runmgr needs each."""
RUNMGR_OWNED_FLAGS: dict[str, str] = {
    "--ckpt-step": "runmgr chooses the checkpoint each sub-run starts from",
    "--no-load-optim": "runmgr resets the optimizer only as a remedy",
}
"""Flags runmgr sets itself per sub-run; a user's would be overwritten, so they are refused."""
REFUSED_FLAGS: dict[str, str] = {
    "--rampup-batch-size": "skipped samples are turned into iterations with a constant global batch",
}
"""Flags whose effect runmgr cannot follow."""
MODULE_PREFIX = "-m "
"""``megatron.script: "-m MODULE"`` runs a module instead of a file."""


class TrainerKind(Choice):
    """Which trainer runs the ranks."""

    builtin = "builtin"
    megatron = "megatron"


class MegatronFlavor(Choice):
    """The Megatron code base the job runs; it decides which remedies can be carried out."""

    megatron_lm = "megatron_lm"
    mindspeed_llm = "mindspeed_llm"


@dataclass
class TrainerSection:
    """The trainer in use (``trainer.kind``)."""

    kind: TrainerKind = TrainerKind.builtin
    """``builtin``: runmgr's own trainer, one Ray actor per rank; ``megatron``: a Megatron-LM or
    MindSpeed-LLM job under torchrun, one Ray actor per node (the ``megatron`` section)."""


@dataclass
class MegatronConfig:
    """A Megatron-LM / MindSpeed-LLM job as its user starts it (used with ``trainer.kind=megatron``)."""

    flavor: MegatronFlavor = MegatronFlavor.megatron_lm
    """``megatron_lm`` (NVIDIA) or ``mindspeed_llm`` (Ascend): MindSpeed-LLM cannot skip data."""
    script: Optional[str] = None
    """Path of the user's ``pretrain_gpt.py``, or ``-m MODULE``; null: the built-in trainer in
    Megatron's dialect (``-m trainer``)."""
    args: list[str] = field(default_factory=list)
    """The script's arguments, as the user would pass them. Empty with a null script: derived
    from this conf's model/optim/training/... sections. Must name --save, --train-iters and
    --global-batch-size; runmgr adds --load/--ckpt-step and its remedies' flags per sub-run."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment added to the device layer's (and winning over it) on every node."""
    nproc_per_node: int = 1
    """Ranks torchrun starts on each node; cluster.num_workers = nodes x nproc_per_node."""

    def module(self) -> Optional[str]:
        """The module of ``-m MODULE``; None for a script path (or none)."""
        if self.script is not None and self.script.startswith(MODULE_PREFIX):
            return self.script[len(MODULE_PREFIX):].strip() or None
        return None

    def problems(self, world_size: int) -> list[str]:
        """One line per setting that cannot be honoured (empty when valid), for ``world_size`` ranks."""
        out = []
        if self.nproc_per_node < 1:
            out.append(f"megatron.nproc_per_node must be >= 1, got {self.nproc_per_node}")
        elif world_size % self.nproc_per_node:
            out.append(f"cluster.num_workers ({world_size}) must be a multiple of megatron.nproc_per_node "
                       f"({self.nproc_per_node}): every node runs the same number of ranks")
        out += self._script_problems()
        out += self._env_problems()
        if self.script is not None or self.args:
            out += args_problems(self.args)
        return out

    def _env_problems(self) -> list[str]:
        """An environment variable's value is one string (a number is taken as its digits)."""
        return [f"megatron.env.{name} must be one value (a string), got {value!r}: write megatron.env.{name}=VALUE "
                f"or megatron.env={{{name}:VALUE}}" for name, value in self.env.items() if not isinstance(value, str)][:1]

    def _script_problems(self) -> list[str]:
        if self.script is None:
            return []
        if self.script.startswith(MODULE_PREFIX):
            return [] if self.module() else [f"megatron.script {self.script!r} names no module: write '-m MODULE'"]
        if not Path(self.script).is_file():
            return [f"megatron.script {self.script!r} is not a file: give the path of the training script "
                    f"(e.g. pretrain_gpt.py) or '-m MODULE'"]
        return []


def args_problems(args: list[str]) -> list[str]:
    """What runmgr cannot work with in a job's arguments."""
    out = [f"megatron.args must contain {flag}: {why}" for flag, why in REQUIRED_FLAGS.items()
           if flag_value(args, flag) is None]
    out += [f"megatron.args must not contain {flag}: {why}; remove it" for flag, why in RUNMGR_OWNED_FLAGS.items()
            if has_flag(args, flag)]
    out += [f"megatron.args: {flag} is not supported: {why}; remove it" for flag, why in REFUSED_FLAGS.items()
            if has_flag(args, flag)]
    load, save = flag_values(args, "--load"), flag_value(args, "--save")
    if load is not None and load != [save]:
        out.append(f"megatron.args: --load {' '.join(load)} differs from --save {save}: runmgr loads the "
                   f"checkpoints it verified under --save; remove --load")
    for flag in ("--train-iters", "--global-batch-size", "--micro-batch-size", "--seq-length"):
        value = flag_value(args, flag)
        if value is not None and not (value.isdigit() and int(value) > 0):
            out.append(f"megatron.args: {flag} must be a positive whole number, got {value!r}")
    skips = flag_values(args, "--iterations-to-skip") or []
    bad = [value for value in skips if not (value.isdigit() and int(value) > 0)]
    if bad:
        out.append(f"megatron.args: --iterations-to-skip takes 1-indexed iterations, got {bad[0]!r}")
    return out


def save_dir(args: list[str]) -> Optional[str]:
    """The ``--save`` of a job's arguments."""
    return flag_value(args, "--save")
