"""Config diffs between consecutive sub-runs, as flat dotted keys.

``{"optim": {"lr": 1e-3}}`` flattens to ``{"optim.lr": 1e-3}``; a diff maps
each changed key to ``[old, new]``, with None where a side lacks the key.
Lists are leaf values: a changed list shows whole on both sides.
"""

from __future__ import annotations

from typing import Any, Mapping


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings to one level of dotted keys (``optim.lr``)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, prefix=f"{dotted}."))
        else:
            flat[dotted] = value
    return flat


def config_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, list[Any]]:
    """``{"optim.lr": [old, new]}`` for every flattened key that differs."""
    flat_old, flat_new = flatten(old), flatten(new)
    diff: dict[str, list[Any]] = {}
    for key in sorted(set(flat_old) | set(flat_new)):
        before, after = flat_old.get(key), flat_new.get(key)
        if key not in flat_old or key not in flat_new or not _same(before, after):
            diff[key] = [before, after]
    return diff


def _same(a: Any, b: Any) -> bool:
    # 1 == 1.0 == True in Python, but a config that turns 1 into True changed.
    return type(a) is type(b) and a == b
