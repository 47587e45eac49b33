"""NaN, infinities and integers beyond 64 bits are refused for every config
field by one walk over the composed config, not a check per field."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from runmgr.config.compose import compose_dict, default_conf_dir, to_run_config
from runmgr.config.numbers import NONFINITE_MEANING, number_problems
from runmgr.config.schema import RunConfig


@dataclass
class Inner:
    ratio: float = 1.0
    steps: list = field(default_factory=lambda: [1.0, 2.0])


@dataclass
class Outer:
    inner: Inner = field(default_factory=Inner)
    count: int = 3
    timeout_s: float = field(default=5.0, metadata={NONFINITE_MEANING: "inf: wait forever"})
    flag: bool = True


def float_keys(config, where: str = "") -> list[str]:
    """Every float field of a config, as a dotted key."""
    keys = []
    for f in fields(config):
        value, key = getattr(config, f.name), f"{where}.{f.name}" if where else f.name
        if hasattr(value, "__dataclass_fields__"):
            keys += float_keys(value, key)
        elif isinstance(value, float):
            keys.append(key)
    return keys


def test_nested_fields_lists_and_huge_integers_are_named_by_their_key():
    config = Outer(Inner(ratio=math.nan, steps=[1.0, -math.inf]), count=2**64)
    problems = number_problems(config)
    assert [p.split()[0] for p in problems] == ["inner.ratio", "inner.steps[1]", "count"]
    assert number_problems(Outer()) == []


def test_a_field_that_gives_infinity_a_meaning_accepts_it():
    assert number_problems(Outer(timeout_s=math.inf)) == []


def test_a_float_field_of_every_section_refuses_nan_and_infinities():
    composed = compose_dict("demo", ["chaos=none"], default_conf_dir())
    keys = float_keys(to_run_config(composed))
    assert len(keys) > 50 and "optim.lr" in keys and "controller.worker_lease_s" in keys
    last_of_section = list({key.split(".")[0]: key for key in keys}.values())  # one merge is ~0.2 s
    for key, value in zip(last_of_section, ["nan", "inf", "-inf"] * len(keys)):
        problems = to_run_config(composed, [f"{key}={value}"]).problems()
        assert problems and problems[0].startswith(f"{key} must be a finite number"), (key, problems)


def test_no_field_of_run_config_needs_a_check_of_its_own():
    assert number_problems(RunConfig()) == []
