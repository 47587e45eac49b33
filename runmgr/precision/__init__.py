"""Seed 004's precision check (``runmgr precision-check``): a simplified,
pinned configuration run on this machine and compared stage by stage with
another config or a Megatron log (protocol, runner, logref, compare, check,
render, command)."""
