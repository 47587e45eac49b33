#!/bin/sh
# The RayJob's entrypoint, run on the Ray head once every pod is up.
#
# 1. Check every Ray node and label + taint the Kubernetes nodes of the bad
#    ones (runmgr.io/health=excluded, runmgr.io/unhealthy:NoSchedule): the
#    next RayCluster keeps off them, and the launch below leaves them out.
#    Exit 0: all admitted, 1: some excluded (the run goes on without them);
#    2: bad config, 3: the API refused the labels (RBAC): stop here.
# 2. Launch the run (conf=k8s: the ConfigMap runmgr-job's k8s.yaml, composed
#    with the image's conf/ groups), metrics served to the ServiceMonitor;
#    its own probes are skipped: step 1 just ran them, and the exclusions it
#    stored still apply.
runmgr health-check conf=k8s --k8s-label
status=$?
if [ "$status" -gt 1 ]; then
    exit "$status"
fi
exec runmgr launch conf=k8s metrics.address=0.0.0.0:8000 health.skip=true
