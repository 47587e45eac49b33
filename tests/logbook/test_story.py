"""A run's story (logbook/story.py): what must read the same each time the same run is told again."""

from __future__ import annotations

from logbook import Logbook
from logbook.story import story_lines, story_of


def test_the_story_names_each_sub_run_s_start_and_each_decided_incident(scripted_run):
    with Logbook.open(scripted_run.run_dir) as book:
        lines = story_lines(story_of(book.events()))
    assert lines == ["7.00: worker_lost -> restart (restarting)",
                     "7.01: loss_spike -> rollback_skip_lower_lr (restarting)",
                     "7.02: nothing acted on (finished)"]


def test_what_a_machine_s_speed_moves_is_not_part_of_the_story(scripted_run):
    """Times, the step a stopped sub-run had reached (and so a restart's checkpoint), the step a
    death was heard at and an incident left alone differ between two tellings of one run on
    machines of different speeds; the story does not. What was done does."""
    with Logbook.open(scripted_run.run_dir) as book:
        events = book.events()
    ignored = [{"seq": 900, "type": "incident", "subrun": "7.02", "time": 0.0, "id": 900, "kind": "straggler"},
               {"seq": 901, "type": "decision", "subrun": "7.02", "time": 0.0, "incident_id": 900, "action": "ignore"}]
    moved = [{**e, "time": e["time"] + 100.0,
              **({"last_step": e["last_step"] + 3} if e["type"] == "subrun_end" else {}),
              **({"start_step": e["start_step"] + 20} if e["type"] == "subrun_start" else {}),
              **({"step": (e["step"] or 0) + 2} if e["type"] == "incident" else {})} for e in events]
    assert story_of(moved[:-1] + ignored + moved[-1:]) == story_of(events)
    other_action = [{**e, "action": "abort"} if e["type"] == "decision" else e for e in events]
    assert story_lines(story_of(other_action)) != story_lines(story_of(events))
