"""Chaos: fault schedules injected into a run's real processes and inputs.

The driver calls :func:`runmgr.chaos.build.build_chaos` (kept out of this
module so that the config schema can import :mod:`runmgr.chaos.config`
without the rest).
"""
