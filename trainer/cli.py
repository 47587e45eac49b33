"""``python -m trainer conf=NAME [key=value ...] [--config-dir DIR]``, or
``python -m trainer --num-layers 2 ...`` in Megatron-LM's dialect (trainer.megatron_main).

Composes ``conf/NAME.yaml`` with Hydra's compose API, keeps the trainer's
sections (runmgr's ``run``, ``cluster``, ``controller``... are ignored),
types them against :class:`TrainerConfig`, resumes from the newest verified
checkpoint in ``checkpoint.save`` if there is one, and trains. Works under
``torchrun`` too. Bad input prints one line and exits 2 (see exitcodes).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional, Sequence, TextIO

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trainer import exitcodes
from trainer.config import TRAINER_SECTIONS, TrainerConfig
from trainer.errors import CheckpointError, TrainerConfigError
from trainer.report import CheckpointReport, Heartbeat, LocalNormsReport, StartReport, StepReport

CONF_DIR_ENV = "RUNMGR_CONF_DIR"


def default_conf_dir() -> Path:
    """``$RUNMGR_CONF_DIR``, else the repository's ``conf/`` next to the package."""
    if os.environ.get(CONF_DIR_ENV):
        return Path(os.environ[CONF_DIR_ENV])
    return Path(__file__).resolve().parent.parent / "conf"


def compose(conf_name: str, overrides: Sequence[str], conf_dir: Path) -> DictConfig:
    """The composed Hydra config (all sections). Raises TrainerConfigError."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException

    conf_dir = conf_dir.resolve()
    if not (conf_dir / f"{conf_name}.yaml").is_file():
        names = ", ".join(sorted(p.stem for p in conf_dir.glob("*.yaml"))) or "none"
        raise TrainerConfigError(f"unknown conf {conf_name!r}: no {conf_name}.yaml in {conf_dir} (available: {names}); "
                                 f"pass --config-dir or set {CONF_DIR_ENV}")
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base=None):
            return hydra_compose(config_name=conf_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as error:
        raise TrainerConfigError(_first_line(error)) from None


def split_overrides(overrides: Sequence[str], conf_dir: Path) -> tuple[list[str], list[str]]:
    """(for Hydra, for the trainer's schema). Hydra gets config-group choices
    (``model=tiny_opt``), ``+``/``~`` edits and other programs' sections;
    ``key.path=value`` of a trainer section is applied on top of the typed
    schema, so a key the YAML leaves at its default (``checkpoint.save``)
    can be set without Hydra's ``+`` and an unknown key is named clearly."""
    to_hydra, to_schema = [], []
    for item in overrides:
        key = item.split("=", 1)[0]
        is_group = "." not in key and (conf_dir / key).is_dir()
        if "=" in item and not is_group and key[:1] not in "+~" and key.split(".")[0] in TRAINER_SECTIONS:
            to_schema.append(item)
        else:
            to_hydra.append(item)
    return to_hydra, to_schema


def trainer_config(composed: DictConfig, overrides: Sequence[str] = ()) -> TrainerConfig:
    """Type the trainer's sections of ``composed``, then apply ``key=value``
    ``overrides``: unknown keys and wrong types fail with one line."""
    sections = {key: composed[key] for key in TRAINER_SECTIONS if key in composed}
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TrainerConfig), sections, OmegaConf.from_dotlist(list(overrides)))
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as error:
        raise TrainerConfigError(_first_line(error)) from None


def config_from_dict(data: dict) -> TrainerConfig:
    """A :class:`TrainerConfig` from plain nested dicts (JSON), checked the same way."""
    return trainer_config(OmegaConf.create(data))


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    key = getattr(error, "full_key", None)  # OmegaConf knows which key; say it
    return f"{key}: {line}" if key and str(key) not in line else line


class PrintingReporter:
    """One readable line per step and per checkpoint (rank 0 prints; the
    trainer calls step/checkpoint on rank 0 only)."""

    def __init__(self, train_iters: int, out: Optional[TextIO] = None) -> None:
        self.train_iters, self.out = train_iters, out or sys.stdout

    def started(self, r: StartReport) -> None:
        origin = f"from {r.resumed_from}" if r.resumed_from else "from initialisation"
        groups = "; ".join(f"{g['name']}: betas {tuple(g['betas'])}, eps {g['eps']:g}, wd {g['weight_decay']:g}, "
                           f"adam step {g['step']}" for g in r.optimizer)
        self.out.write(f"start at step {r.start_step} {origin} | {groups}\n")
        self.out.flush()

    def step(self, r: StepReport) -> None:
        skipped = " | SKIPPED (overflow)" if r.skipped else ""
        self.out.write(
            f"step {r.step:>6}/{self.train_iters} | loss {r.loss:.4f} | lr {r.lr:.3e} | grad norm {r.grad_norm:.3f} "
            f"| loss scale {r.loss_scale:g} | {r.step_time * 1000:.0f} ms | samples {r.consumed_samples}{skipped}\n"
        )
        self.out.flush()

    def checkpoint(self, r: CheckpointReport) -> None:
        self.out.write(f"checkpoint step {r.step} -> {r.path} ({r.seconds:.2f} s)\n")
        self.out.flush()

    def local_norms(self, r: LocalNormsReport) -> None:
        largest = sorted(r.norms.items(), key=lambda item: -item[1])[:3]
        self.out.write(f"local norms step {r.step}: {len(r.norms)} weights, largest "
                       + ", ".join(f"{name} {norm:.3g}" for name, norm in largest) + "\n")
        self.out.flush()

    def heartbeat(self, beat: Heartbeat) -> None:
        pass


def _parse(argv: Sequence[str]) -> tuple[str, list[str], Path]:
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="conf=NAME, then key=value overrides")
    parser.add_argument("--config-dir", type=Path, default=None, help=f"directory of NAME.yaml (default ${CONF_DIR_ENV} or ./conf of the repo)")
    args = parser.parse_intermixed_args(list(argv))
    names = [o.split("=", 1)[1] for o in args.overrides if o.startswith("conf=")]
    if not names:
        raise TrainerConfigError("no conf given: run `python -m trainer conf=demo [key=value ...]`")
    rest = [o for o in args.overrides if not o.startswith("conf=")]
    return names[-1], rest, args.config_dir or default_conf_dir()


def _resume_plan(save_dir: Path, rank: int, out: TextIO):
    """Resume from the newest verified checkpoint in ``save_dir``, if any."""
    from trainer.manifest import find_latest_verified
    from trainer.plan import ResumePlan

    found = find_latest_verified(save_dir)
    if rank == 0:
        for path, reason in found.rejected:
            out.write(f"rejected checkpoint {path}: {reason}\n")
        if found.path is not None:
            out.write(f"resuming from {found.path} (step {found.step})\n")
    return ResumePlan(start_checkpoint=str(found.path) if found.path else None)


def run(argv: Sequence[str], out: Optional[TextIO] = None) -> int:
    """Compose, check and train; returns the exit code. Bad input raises."""
    out = out or sys.stdout
    from trainer.distributed import DistEnv
    from trainer.loop import check_config, train

    conf_name, overrides, conf_dir = _parse(argv)
    to_hydra, to_schema = split_overrides(overrides, conf_dir)
    config = trainer_config(compose(conf_name, to_hydra, conf_dir), to_schema)
    env = DistEnv.from_environ()
    check_config(config, env.world_size)
    if config.checkpoint.memory_interval > 0:
        # Warm state serves only a driver that re-forms the group; torchrun restarts every rank.
        raise TrainerConfigError("checkpoint.memory_interval keeps state for warm restarts, which need a driver that "
                                 "re-forms the group (runmgr launch ... controller.warm_spares=1): set "
                                 "checkpoint.memory_interval=0 here")
    if config.checkpoint.save is None:
        config.checkpoint.save = str(Path("checkpoints") / conf_name)
    plan = _resume_plan(Path(config.checkpoint.save), env.rank, out)
    reporter = PrintingReporter(config.training.train_iters, out) if env.rank == 0 else None
    result = train(config, plan, reporter, env)
    if env.rank == 0:
        out.write(f"done: step {result.step}, last checkpoint {result.last_checkpoint}\n")
    return exitcodes.DONE


def speaks_megatron(argv: Sequence[str]) -> bool:
    """Whether ``argv`` is Megatron's dialect (``--num-layers 2 ...``: it starts
    with a flag and names no conf) rather than ``conf=NAME [key=value ...]``."""
    return bool(argv) and argv[0].startswith("--") and argv[0] != "--config-dir" \
        and not any(item.startswith("conf=") for item in argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    from trainer.data import DataError

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if speaks_megatron(argv):
            from trainer.megatron_main import run_megatron

            return run_megatron(argv)
        return run(argv)
    except (TrainerConfigError, DataError) as error:
        sys.stderr.write(f"error: {error}\n")
        return exitcodes.BAD_INPUT
    except CheckpointError as error:
        sys.stderr.write(f"error: {error}\n")
        return exitcodes.CHECKPOINT_ERROR
