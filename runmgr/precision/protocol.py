"""Seed 004's simplified, pinned configuration, as overrides of a run config.

Before two trainings are compared step by step, everything that could make
them differ by chance is pinned: 2 layers, a constant learning rate with no
warmup, no dropout, deterministic computation, one rank, the same seed (so
the same initial weights and the same batches) and no injected faults. What
remains different between the two sides is what the user set differently.
A user override of a pinned key is refused (it would be overridden
silently otherwise), and so is a config the built-in trainer cannot run here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from runmgr.config.compose import load_run_config
from runmgr.errors import UserError
from trainer.config import CheckpointConfig, TrainerConfig

PINNED: dict[str, str] = {
    "model.num_layers": "2",
    "model.hidden_dropout": "0.0",
    "model.attention_dropout": "0.0",
    "optim.lr_decay_style": "constant",
    "optim.lr_warmup_iters": "0",
    "optim.lr_warmup_fraction": "null",
    "training.deterministic": "true",
    "cluster.num_workers": "1",
    "chaos.faults": "[]",
}
"""Key -> value the protocol sets on both sides (seed 004, step 2: simplify and pin randomness)."""
SET_BY_THE_CHECK: dict[str, str] = {
    "chaos": "the check injects no faults (it pins chaos.faults=[]): drop it",
    "training.train_iters": "the check sets the steps: use --steps N",
    "trainer.kind": "the check runs the built-in trainer; compare a Megatron job through its log "
                    "(--against-log FILE)",
}
"""Keys the check sets itself, and what to do instead."""
SEED_KEY = "training.seed"


@dataclass(frozen=True)
class Side:
    """One side of the comparison as the user named it: a conf and its overrides."""

    conf: str
    overrides: tuple[str, ...] = ()

    def label(self) -> str:
        """``conf=demo optim.decay_1d_weights=true``, as typed."""
        return " ".join((f"conf={self.conf}", *self.overrides))


def override_key(item: str) -> str:
    """``optim.lr=1e-3`` -> ``optim.lr``."""
    return item.partition("=")[0].strip()


def side_from_items(items: list[str], what: str) -> Side:
    """The conf and overrides of ``conf=NAME key=value ...`` (``what`` names the
    side in the one-line error)."""
    confs = [item for item in items if item.startswith("conf=")]
    if len(confs) != 1 or not confs[0][len("conf="):]:
        raise UserError(f"{what} must name exactly one config, e.g. conf=demo (the names are the files in conf/*.yaml)")
    return Side(confs[0][len("conf="):], tuple(item for item in items if not item.startswith("conf=")))


def refuse_pinned_overrides(side: Side, seed: Optional[int]) -> None:
    """One line for an override the protocol would overrule (``seed``: the
    reference's, when ``side`` is the other one)."""
    for item in side.overrides:
        key = override_key(item)
        if key in PINNED and item.partition("=")[2].strip() != PINNED[key]:
            raise UserError(f"{item} in `{side.label()}`: the precision check pins {key}={PINNED[key]} "
                            f"(the precision-tuning guide's simplified configuration): drop it")
        if key in SET_BY_THE_CHECK:
            raise UserError(f"{item} in `{side.label()}`: {SET_BY_THE_CHECK[key]}")
        if key == SEED_KEY and seed is not None and item.partition("=")[2].strip() != str(seed):
            raise UserError(f"{item} in `{side.label()}`: both sides run with the first config's seed, {seed} "
                            f"(identical weights and data); set {SEED_KEY} on the first config instead")


def pinned_overrides(steps: int, seed: Optional[int]) -> list[str]:
    """The protocol's overrides for a check of ``steps`` long-run steps (and the
    reference's ``seed``, for the other side)."""
    out = [f"{key}={value}" for key, value in PINNED.items()]
    out.append(f"training.train_iters={max(2, steps)}")
    if seed is not None:
        out.append(f"{SEED_KEY}={seed}")
    return out


def pinned_config(side: Side, steps: int, conf_dir: Optional[Path], seed: Optional[int] = None) -> TrainerConfig:
    """The trainer config of ``side`` under the protocol: composed and checked
    as ``runmgr launch`` does, then pinned. ``seed``: the reference's, for the
    other side (None for the reference itself)."""
    from trainer.loop import check_config  # torch: only once the command line has been read

    refuse_pinned_overrides(side, seed)
    pins = set(PINNED) | ({SEED_KEY} if seed is not None else set())
    own = [item for item in side.overrides if override_key(item) not in pins]  # the rest say what the pins say
    config = load_run_config(side.conf, [*own, *pinned_overrides(steps, seed)], conf_dir)
    if config.drives_megatron:
        raise UserError(f"conf {side.conf} runs trainer.kind=megatron: the check runs the built-in trainer; "
                        f"compare a Megatron job through its log (--against-log FILE)")
    trainer_config = replace(config.trainer_config(), checkpoint=CheckpointConfig(save=None))  # none written
    check_config(trainer_config, world_size=1)
    return trainer_config
