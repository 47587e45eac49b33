"""Compose ``conf/NAME.yaml`` with ``key=value`` overrides into a typed
:class:`RunConfig`, turning every Hydra/OmegaConf complaint into one line."""

from __future__ import annotations

import copy
import functools
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from runmgr.config.schema import RunConfig
from runmgr.errors import ConfigError, UserError

CONF_DIR_ENV = "RUNMGR_CONF_DIR"
OPEN_MAPPINGS = ("megatron.env",)
"""Mappings whose keys the user chooses (environment variable names): open to new keys,
their values still typed."""


def default_conf_dir() -> Path:
    """``$RUNMGR_CONF_DIR``, else ``./conf`` when it exists, else the repository's conf/."""
    if os.environ.get(CONF_DIR_ENV):
        return Path(os.environ[CONF_DIR_ENV])
    if (Path.cwd() / "conf").is_dir():
        return Path.cwd() / "conf"
    return Path(__file__).resolve().parents[2] / "conf"


def available_confs(conf_dir: Path) -> list[str]:
    return sorted(p.stem for p in conf_dir.glob("*.yaml"))


def split_overrides(overrides: list[str], conf_dir: Path) -> tuple[list[str], list[str]]:
    """(config-group choices for Hydra such as ``model=tiny_opt``, ``key=value``
    settings applied on the typed schema). Settings go to the schema so that
    any schema key can be set even when the YAML leaves it at its default,
    and an unknown key is named clearly."""
    groups, settings = [], []
    for item in map(_without_plus, overrides):
        key, sep, _ = item.partition("=")
        if sep and key.startswith("+") and len(key) > 1:
            raise ConfigError(f"bad override {item!r}: write it without '+' ({item[1:]}): every key of the schema is "
                              f"set as key=value, and '+' adds a key only under {', '.join(OPEN_MAPPINGS)}")
        if not sep or not key or key[0] in "+~":
            raise ConfigError(f"bad override {item!r}: write overrides as key=value, e.g. training.train_iters=100")
        (groups if "." not in key and (conf_dir / key).is_dir() else settings).append(item)
    return groups, settings


def _without_plus(item: str) -> str:
    """Hydra's ``+key=value`` (add a key the config lacks) as ``key=value`` for a key of an open
    mapping (``+megatron.env.NAME=value``): runmgr adds such keys without the '+'. Any other item
    is returned as it is."""
    key = item.partition("=")[0]
    if key.startswith("+") and any(key[1:].startswith(f"{mapping}.") for mapping in OPEN_MAPPINGS):
        return item[1:]
    return item


def compose_dict(conf_name: str, group_overrides: list[str], conf_dir: Path) -> DictConfig:
    """The raw composed config (no schema applied yet)."""
    if not conf_dir.is_dir():
        raise ConfigError(f"config directory {conf_dir} does not exist: pass --config-dir or set {CONF_DIR_ENV}")
    if not (conf_dir / f"{conf_name}.yaml").is_file():
        names = ", ".join(available_confs(conf_dir)) or "none"
        raise ConfigError(f"unknown conf {conf_name!r}: no {conf_name}.yaml in {conf_dir} (available: {names})")
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base=None):
            return compose(config_name=conf_name, overrides=list(group_overrides))
    except MissingConfigException as exc:
        raise ConfigError(_missing_option_message(exc, conf_dir)) from None
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"{conf_dir / conf_name}.yaml: {_first_line(exc)}") from None
    except yaml.YAMLError as exc:  # Hydra lets the parser's own error through
        raise ConfigError(_yaml_message(exc, conf_dir / f"{conf_name}.yaml")) from None


def to_run_config(raw: DictConfig, settings: list[str] = ()) -> RunConfig:
    """Merge into the schema, then apply ``key=value`` settings: unknown keys
    and wrong types fail here."""
    schema = copy.deepcopy(schema_tree())
    # Frozen dataclasses (watcher, policy) make read-only nodes; the YAML and
    # the overrides must still be able to set them before they are typed.
    make_writable(schema)
    for key in OPEN_MAPPINGS:
        OmegaConf.set_struct(OmegaConf.select(schema, key), False)
    try:
        merged = OmegaConf.merge(schema, raw)
    except OmegaConfBaseException as exc:
        raise ConfigError(_schema_message(exc)) from None
    try:
        for batch in _setting_batches(list(settings)):
            merged = OmegaConf.merge(merged, batch)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        raise ConfigError(_list_item_message(merged, settings) or _schema_message(exc)) from None


@functools.cache
def schema_tree() -> DictConfig:
    """:class:`RunConfig` as OmegaConf's typed tree, built once a process: building it reads every
    dataclass of the schema (about 0.07 CPU-seconds), a copy of it about 0.01. A process that
    forks runmgr's commands (the tests' CLI fork server) builds it before it forks."""
    return OmegaConf.structured(RunConfig)


def _setting_batches(settings: list[str]) -> list[DictConfig]:
    """``key=value`` settings as configs to merge in order: runs of plain values through
    OmegaConf's dotlist (YAML values), and each mapping value (``megatron.env={K:V}``) through
    Hydra's override grammar, where ``{K:V}`` is the mapping K -> V (YAML would read the key
    ``K:V`` with no value). A mapping merges into the one there, as Hydra merges it."""
    batches: list[DictConfig] = []
    plain: list[str] = []
    for item in settings:
        key, _, value = item.partition("=")
        if not value.lstrip().startswith("{"):
            plain.append(item)
            continue
        if plain:
            batches.append(OmegaConf.from_dotlist(plain))
            plain = []
        batches.append(OmegaConf.create(_nested(key, _hydra_mapping(item))))
    if plain:
        batches.append(OmegaConf.from_dotlist(plain))
    return batches


def _hydra_mapping(item: str) -> dict:
    """The mapping of ``key={K:V,...}`` as Hydra's override grammar reads it; one line when it cannot."""
    try:
        value = OverridesParser.create().parse_override(item).value()
    except HydraException as exc:
        key = item.partition("=")[0]
        raise ConfigError(f"bad override {item!r}: {_first_line(exc)}; write a mapping as {key}={{K1:V1,K2:V2}} "
                          f"(quote a value with commas or braces: {key}={{K:'a,b'}}) or one entry as {key}.K1=V1") from None
    if not isinstance(value, dict):
        raise ConfigError(f"bad override {item!r}: its value is not one mapping; write {item.partition('=')[0]}="
                          f"{{K1:V1,K2:V2}}")
    return value


def _nested(key: str, value: object) -> dict:
    """``a.b.c`` and a value as ``{a: {b: {c: value}}}``."""
    for part in reversed(key.split(".")):
        value = {part: value}
    return value  # type: ignore[return-value]


def _list_item_message(merged: DictConfig, settings: list[str]) -> str | None:
    """One line for a ``key=value`` that sets one item of a list (``a.b.1.c=v``):
    OmegaConf merges lists whole, so the list must be given whole."""
    for item in settings:
        parts = item.split("=", 1)[0].lstrip("+~").split(".")
        for depth in range(1, len(parts)):
            if isinstance(OmegaConf.select(merged, ".".join(parts[:depth])), ListConfig):
                whole = ".".join(parts[:depth])
                return (f"cannot set {item.split('=', 1)[0]}: {whole} is a list, set it whole, e.g. "
                        f"{whole}=[...] with every item (its current items are in conf/*.yaml)")
    return None


def split_conf(items: Sequence[str], example: str) -> tuple[Optional[str], list[str]]:
    """A command's ``conf=NAME key=value ...`` items as (NAME or None, the overrides); more than one
    ``conf=`` is one line, with ``example`` (``runmgr watch replay FILE conf=demo``) to show how."""
    conf = [item.split("=", 1)[1] for item in items if item.startswith("conf=")]
    if len(conf) > 1:
        raise UserError(f"name at most one config, e.g. `{example}`")
    return (conf[0] if conf else None), [item for item in items if not item.startswith("conf=")]


def load_run_config(conf_name: str, overrides: list[str], conf_dir: Path | None = None) -> RunConfig:
    """Compose, type and check the config; raise ConfigError with one line."""
    conf_dir = (conf_dir or default_conf_dir()).resolve()
    groups, settings = split_overrides(list(overrides), conf_dir)
    config = to_run_config(compose_dict(conf_name, groups, conf_dir), settings)
    problems = megatron_override_problems(config, settings) + config.problems()
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise ConfigError(problems[0] + more)
    return config


MEGATRON_UNRECORDED = ("training.local_norms_interval",)
"""Settings a Megatron job cannot honour whatever the conf file says (its log has no
per-weight gradient norms): refused when a command line sets them for one."""


def megatron_override_problems(config: RunConfig, settings: list[str]) -> list[str]:
    """One line for each ``key=value`` of :data:`MEGATRON_UNRECORDED` given with
    ``trainer.kind=megatron`` (the conf file's own value is not expressed: docs/local_norms.md)."""
    if not config.drives_megatron:
        return []
    keys = {item.split("=", 1)[0].lstrip("+~") for item in settings}
    return [f"{key} is not honoured with trainer.kind=megatron: a Megatron job reports no per-weight gradient "
            f"norms, so runmgr records no local norms for it (docs/local_norms.md); drop the {key} override"
            for key in MEGATRON_UNRECORDED if key in keys]


def make_writable(node) -> None:
    OmegaConf.set_readonly(node, False)
    children = node.values() if isinstance(node, DictConfig) else node
    for child in children:
        if isinstance(child, (DictConfig, ListConfig)):
            make_writable(child)


def with_settings(config: RunConfig, settings: list[str]) -> RunConfig:
    """``config`` with ``key=value`` settings applied and checked again (a rehearsal's
    config, which no conf file composes, takes the chaos schedule's inputs so)."""
    if not settings:
        return config
    changed = to_run_config(OmegaConf.create(config_as_dict(config)), settings)
    problems = changed.problems()
    if problems:
        raise ConfigError(problems[0])
    return changed


def config_as_dict(config: RunConfig) -> dict:
    """Plain data (choices as their strings)."""
    return OmegaConf.to_container(OmegaConf.structured(config), resolve=True, enum_to_str=True)  # type: ignore[return-value]


def recorded_config(config: RunConfig) -> dict:
    """The config as the logbook keeps it: plain data, a webhook's URL written out in it masked (a
    secret: runmgr/config/notify.py)."""
    plain = config_as_dict(config)
    plain["notify"].update(config.notify.masked())
    return plain


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _yaml_message(exc: yaml.YAMLError, composed: Path) -> str:
    """``FILE:LINE:COLUMN: not valid YAML: what the parser found``."""
    mark = getattr(exc, "problem_mark", None)
    where = f"{mark.name}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(composed)
    problem = getattr(exc, "problem", None) or _first_line(exc)
    return f"{where}: not valid YAML ({problem}); fix the file"


def _schema_message(exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None) or "?"
    text = _first_line(exc)
    if "not in struct" in text or "Key '" in text and "not in" in text:
        return f"unknown config key {key!r}: check the spelling (the keys are in conf/*.yaml and runmgr/config/schema.py)"
    value = getattr(exc, "msg", text)
    if "Value '" in text:
        return f"bad value for {key}: {text}"
    return f"{key}: {value.splitlines()[0] if value else text}"


def _missing_option_message(exc: MissingConfigException, conf_dir: Path) -> str:
    match = re.search(r"Could not find '([^/']+)/([^']+)'", str(exc))
    if not match:
        return _first_line(exc)
    group, option = match.groups()
    options = ", ".join(available_confs(conf_dir / group)) or "none"
    return f"unknown {group} {option!r}: no conf/{group}/{option}.yaml (available: {options})"
