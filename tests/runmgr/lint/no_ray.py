"""``runmgr`` with Ray's start and preflight replaced by a refusal: a launch that reaches them
says so ("ray started", exit 99). Run as ``python no_ray.py ARGS`` (tests/runmgr/lint/test_launch.py
forks it from the tests' CLI fork server); runmgr calls both through the ``runmgr.cluster`` module,
so replacing them there is seen wherever they are called."""

import sys

import runmgr.cluster


def refuse(*args, **kwargs):
    print("ray started", file=sys.stderr)
    sys.exit(99)


runmgr.cluster.connect = runmgr.cluster.preflight = refuse
from runmgr.cli import main  # noqa: E402 - after the replacement, as a user's process would import it

sys.exit(main(sys.argv[1:]))
