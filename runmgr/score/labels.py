"""What happened in a recorded log, as a person labelled it: ``NAME.labels.yaml`` beside
``NAME.log``, read by ``runmgr watch score``.

    about: bf16 Megatron-core, log interval 1: a loss spike at 1200 that does not recover
    flavor: megatron_lm       # or mindspeed_llm (the job's megatron.flavor)
    silence_at_end_s: 0       # how long the job stayed silent after the last line (a hang the log ends in)
    incidents:                # [] for a clean run
      - class: spike_persistent
        kinds: [loss_spike, grad_spike]   # the incident kinds that find it; the first is the main one
        step: 1200                        # the first bad iteration; a hang: the last one logged
        remedy: [rollback_skip]           # the right decisions (any one of them)
        within: 200                       # optional: steps after ``step`` it must be found in

A wrong key or value is one line naming the file and the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from runmgr.choices import Action, IncidentKind
from runmgr.config.megatron import MegatronFlavor
from runmgr.errors import UserError

LABELS_SUFFIX = ".labels.yaml"
DEFAULT_WITHIN = 200
"""Steps after the labelled onset an incident may be found in (a persistent spike is decided after
its 50-step grace, a slowdown after a window of slow steps)."""
BEFORE = 20
"""Steps before the labelled onset an incident's onset may lie (a log interval of 10 samples the
onset; a detector's baseline may see the rise a little early)."""


class ScoreInputError(UserError):
    """A labels file or corpus folder ``watch score`` cannot use: one line."""


@dataclass(frozen=True)
class Label:
    """One incident that happened in the log, and what should have been done."""

    cls: str
    """The row of the score's table (``spike_persistent``, ``hang``, ...)."""
    kinds: tuple[IncidentKind, ...]
    step: int
    remedy: tuple[Action, ...]
    within: int = DEFAULT_WITHIN

    def explains(self, kind: str, step: int) -> bool:
        """Whether an incident of ``kind`` at ``step`` (its onset, or where it was decided) is this one."""
        return kind in self.kinds and self.step - BEFORE <= step <= self.step + self.within


@dataclass(frozen=True)
class LogLabels:
    """A log's labels file."""

    about: str
    flavor: MegatronFlavor
    incidents: tuple[Label, ...]
    silence_at_end_s: float = 0.0

    @property
    def clean(self) -> bool:
        """Nothing happened: every incident found in it is a false alarm."""
        return not self.incidents


_TOP = {"about", "flavor", "silence_at_end_s", "incidents"}
_INCIDENT = {"class", "kinds", "step", "remedy", "within"}


def read_labels(path: Path) -> LogLabels:
    """The labels of ``path``; a missing or wrong key or value is one line."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as problem:
        raise ScoreInputError(f"cannot read {path}: {problem.strerror or problem}") from None
    except yaml.YAMLError as problem:
        raise ScoreInputError(f"{path} is not YAML: {str(problem).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ScoreInputError(f"{path}: expected a mapping with about, flavor and incidents")
    _known(path, "", data, _TOP, required=("about", "flavor", "incidents"))
    incidents = data["incidents"]
    if not isinstance(incidents, list):
        raise ScoreInputError(f"{path}: incidents must be a list ([] for a clean run)")
    silence = data.get("silence_at_end_s", 0)
    if isinstance(silence, bool) or not isinstance(silence, (int, float)) or silence < 0:
        raise ScoreInputError(f"{path}: silence_at_end_s must be seconds >= 0, got {silence!r}")
    return LogLabels(str(data["about"]), _choice(path, "flavor", data["flavor"], MegatronFlavor),
                     tuple(_label(path, n, item) for n, item in enumerate(incidents)), float(silence))


def _label(path: Path, number: int, item: Any) -> Label:
    where = f"incidents[{number}]"
    if not isinstance(item, dict):
        raise ScoreInputError(f"{path}: {where} must be a mapping with class, kinds, step and remedy")
    _known(path, where + ".", item, _INCIDENT, required=("class", "kinds", "step", "remedy"))
    kinds, remedy = item["kinds"], item["remedy"]
    if not isinstance(kinds, list) or not kinds:
        raise ScoreInputError(f"{path}: {where}.kinds must be a non-empty list of incident kinds")
    if not isinstance(remedy, list) or not remedy:
        raise ScoreInputError(f"{path}: {where}.remedy must be a non-empty list of actions")
    return Label(str(item["class"]), tuple(_choice(path, f"{where}.kinds", k, IncidentKind) for k in kinds),
                 _count(path, f"{where}.step", item["step"]),
                 tuple(_choice(path, f"{where}.remedy", a, Action) for a in remedy),
                 _count(path, f"{where}.within", item.get("within", DEFAULT_WITHIN)))


def _known(path: Path, prefix: str, data: dict, allowed: set[str], required: tuple[str, ...]) -> None:
    unknown = sorted(set(map(str, data)) - allowed)
    if unknown:
        raise ScoreInputError(f"{path}: unknown key {prefix}{unknown[0]} (known: {', '.join(sorted(allowed))})")
    missing = [key for key in required if key not in data]
    if missing:
        raise ScoreInputError(f"{path}: missing {prefix}{missing[0]}")


def _choice(path: Path, where: str, value: Any, choices):
    try:
        return choices(value)
    except ValueError:
        raise ScoreInputError(f"{path}: {where} {value!r} is not one of {', '.join(c.value for c in choices)}") \
            from None


def _count(path: Path, where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ScoreInputError(f"{path}: {where} must be a whole number >= 0, got {value!r}")
    return value
