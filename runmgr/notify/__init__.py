"""Telling a person: webhooks sent what needs one (a run stopped for a person, a recommendation
in shadow mode, optionally every incident), in the background, never blocking the run."""
