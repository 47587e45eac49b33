#!/bin/sh
# The RayJob's entrypoint, run on the Ray head once every pod is up.
#
# 1. Check every Ray node and label the Kubernetes nodes of the bad ones
#    runmgr.io/health=excluded (label only by default; with --k8s-taint the
#    node would also be tainted runmgr.io/unhealthy:NoSchedule, keeping every
#    other workload off it too): the pods of this run keep off labelled nodes
#    (their node affinity), so a replacement or the next RayCluster never
#    lands there, and the launch below leaves them out. Nodes that pass again
#    lose the label; `runmgr health-check --readmit NODE` clears it by hand.
#    Exit 0: all admitted, 1: some excluded (the run goes on without them);
#    2: bad config, 3: the API refused the labels (RBAC): stop here.
# 2. Launch the run (conf=k8s: the ConfigMap runmgr-job's k8s.yaml, composed
#    with the image's conf/ groups), metrics served on the port the metrics
#    Service targets; its own probes are skipped: step 1 just ran them, and
#    the exclusions it stored still apply.
# A job that ends non-zero is submitted again by KubeRay (the RayJob's
# backoffLimit) on a new RayCluster, and resumes the run.
runmgr health-check conf=k8s --k8s-label
status=$?
if [ "$status" -gt 1 ]; then
    exit "$status"
fi
exec runmgr launch conf=k8s metrics.address=0.0.0.0:8000 health.skip=true
