"""The scale harness: thousands of simulated ranks on this machine, driven by the real driver.

What is simulated: the ranks (:mod:`runmgr.scale.ranks`: no math, no torch, their reports
computed from a clock) and the nodes they sit on (names; many simulated nodes share one Ray
actor, :mod:`runmgr.scale.hosts`). What is real: Ray (a local cluster, one actor process per
host of simulated nodes, one remote call per rank wherever the driver makes one per rank),
the worker group's polling code, the controller, the judge (watcher and policy), the logbook
and the metrics exporter (:mod:`runmgr.scale.harness`).
"""
