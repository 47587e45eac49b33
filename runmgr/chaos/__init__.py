"""Chaos: fault schedules injected into a run's real processes and inputs.

The schedule is configuration (:mod:`runmgr.config.chaos`); this package
carries it out. The driver calls :func:`runmgr.chaos.build.build_chaos`.
"""
