"""runmgr watch score: the detectors and the policy measured over labelled logs."""
