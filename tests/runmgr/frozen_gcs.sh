#!/bin/sh
# A Ray GCS that does not come up in time, whatever the machine's load: it stops itself
# (as a person's kill -STOP would) before it runs the real GCS, so its port file never
# appears and Ray's wait for it runs out. It holds a file of its session directory open for
# writing, as a real GCS holds its logs, so that runmgr's clean-up of a failed start finds
# and kills it as it would a GCS (runmgr/reaper.py). Started in place of Ray's GCS by
# tests/runmgr/frozen_gcs.py.
for arg do
  case $arg in
    --session-dir=*) exec 3>>"${arg#--session-dir=}/frozen_gcs.log" ;;
  esac
done
kill -STOP $$
exec "$RUNMGR_TEST_REAL_GCS" "$@"
