"""Build frozen config dataclasses from plain mappings, strictly.

Hydra/OmegaConf hands the watcher and the policy plain dicts (after
``OmegaConf.to_container``). This turns them into the typed dataclasses of
:mod:`runmgr.config.watcher` and :mod:`runmgr.config.policy`, refusing unknown
keys and wrong types with one line that names the key and how to fix it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any, TypeVar, Union

T = TypeVar("T")


def build(cls: type[T], data: Any, where: str, error: type[Exception]) -> T:
    """``cls(**data)`` with every value checked against the field's type.

    ``where`` names the config section in messages (``watcher.hang``);
    ``error`` is the exception type raised for a bad value. A dataclass that
    defines ``problems() -> list[str]`` is checked after it is built.
    """
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise error(f"{where}: expected a mapping of keys to values, got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(str(key) for key in data if key not in known)
    if unknown:
        raise error(f"{where}: unknown key '{unknown[0]}'; known keys are {', '.join(known)}")
    values = {name: _convert(hints[name], data[name], f"{where}.{name}", error) for name in known if name in data}
    built = cls(**values)
    problems = getattr(built, "problems", None)
    if problems is not None:
        found = problems()
        if found:
            raise error(f"{where}: {found[0]}")
    return built


def _convert(hint: Any, value: Any, where: str, error: type[Exception]) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, where, error)
    if dataclasses.is_dataclass(hint):
        return build(hint, value, where, error)
    if origin is tuple:
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise error(f"{where}: expected a list, got {value!r}")
        return tuple(_convert(args[0], item, f"{where}[{i}]", error) for i, item in enumerate(value))
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise error(f"{where}: expected a mapping, got {value!r}")
        return {_convert(args[0], str(k), f"{where}.{k}", error): _convert(args[1], v, f"{where}.{k}", error)
                for k, v in value.items()}
    if isinstance(hint, type) and issubclass(hint, Enum):
        try:
            return hint(value)
        except ValueError:
            raise error(f"{where}: {value!r} is not one of {', '.join(m.value for m in hint)}") from None
    return _scalar(hint, value, where, error)


def _scalar(hint: Any, value: Any, where: str, error: type[Exception]) -> Any:
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise error(f"{where}: expected true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise error(f"{where}: expected a whole number, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise error(f"{where}: expected a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise error(f"{where}: expected a string, got {value!r}")
    return value


def nested_problems(section: Any, where: str) -> list[str]:
    """What ``problems()`` of every dataclass inside ``section`` reports, each named by
    its path (``watcher.hang.step: ...``). A config built by OmegaConf rather than
    :func:`build` is checked this way, so no nested range check is skipped."""
    out: list[str] = []
    for item in dataclasses.fields(section):
        value = getattr(section, item.name)
        if not dataclasses.is_dataclass(value):
            continue
        path = f"{where}.{item.name}"
        problems = getattr(value, "problems", None)
        out += [f"{path}: {problem}" for problem in (problems() if problems is not None else [])]
        out += nested_problems(value, path)
    return out
