"""``runmgr health-check`` and its launch gate: the probes of :mod:`health`
run on every Ray node (one pinned task each), small groups of nodes measure
their collectives, the fleet analysis decides, and the exclusions are kept
where ``runmgr launch`` reads them. (The mid-run device poll is the
watcher's input: runmgr/workers/devicepoll.py and runmgr/watch/device_readings.py.)

Modules: ``nodes`` (which Ray nodes, how they are named), ``node_task`` (what
runs on a node), ``collectives`` (group tests through Ray actors),
``fleet_run`` (the whole check), ``exclusions`` (history and lemons),
``summary`` (JSON and table), ``staging`` (``--stage``: the dataset onto
every node's disk), ``k8s`` (labels, annotations and taints), ``recheck``
(``--readmit`` and ``--recheck-self``: undoing exclusions), ``gate``
(``preflight_health`` for launch), ``command`` (the subcommand).
"""
