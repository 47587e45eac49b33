"""Node health checks: parsers of vendor-tool output (``health.parsers``),
probes that run on one node (``health.probes``, gathered by
``health.check.check_node``), and the pure fleet analysis (``health.fleet``,
``health.groups``) that turns node reports into admit / warn / exclude.

Nothing here imports runmgr, trainer, logbook or ray; runmgr decides where
the probes run. Submodules are imported explicitly so that the light ones
(parsers, fleet) never pull in torch.
"""
