"""Shadow mode: runmgr beside a job it does not run (``runmgr watch follow``), judging its live
log and recording what it would have done, never doing it."""
