"""`runmgr watch score DIR` on a folder of labelled logs written here: the table a person reads,
the same as JSON, and bad input as one line with exit code 2."""

from __future__ import annotations

import json

import pytest

from tests import cli
from tests.runmgr.score.played_logs import Log

SPIKE_LABELS = """\
about: a spike at 450 that does not recover, and one at 300 that does
flavor: megatron_lm
incidents:
  - {class: spike_persistent, kinds: [loss_spike, grad_spike], step: 450, remedy: [rollback_skip]}
  - {class: spike_recovering, kinds: [loss_spike], step: 300, remedy: [ignore]}
"""
HANG_LABELS = """\
about: silent after iteration 150, killed half an hour later
flavor: megatron_lm
silence_at_end_s: 1800
incidents:
  - {class: hang, kinds: [hang], step: 150, remedy: [dump_and_restart, restart]}
"""
CLEAN_LABELS = "about: nothing happens\nflavor: mindspeed_llm\nincidents: []\n"


def corpus(folder):
    folder.mkdir()
    spiky = Log().train(range(1, 300)).train(range(300, 304), lifted=range(300, 304)).train(range(304, 450))
    spiky.train(range(450, 601), lifted=range(450, 601))
    (folder / "spike.log").write_text(spiky.text())
    (folder / "spike.labels.yaml").write_text(SPIKE_LABELS)
    (folder / "hang.log").write_text(Log().train(range(1, 151)).text())
    (folder / "hang.labels.yaml").write_text(HANG_LABELS)
    (folder / "clean.log").write_text(Log().train(range(1, 401)).text())
    (folder / "clean.labels.yaml").write_text(CLEAN_LABELS)
    return folder


def row(out: str, name: str) -> list[str]:
    return next(line.split() for line in out.splitlines() if line.startswith(name + " "))


def test_the_table_says_per_class_what_was_found_how_late_and_whether_the_decision_was_right(tmp_path):
    folder = corpus(tmp_path / "corpus")
    done = cli.runmgr("watch", "score", str(folder))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith(f"runmgr watch score {folder} (conf=shadow): 3 logs, 3 labelled incidents, 1,150 iterations")
    # class, logs, labelled, found, missed, delay steps, delay s, right, decided
    assert row(out, "hang")[:8] == ["hang", "1", "1", "1", "0", "0", "60.2", "1/1"]
    assert row(out, "spike_persistent")[:5] == ["spike_persistent", "1", "1", "1", "0"]
    assert row(out, "spike_persistent")[7:9] == ["1/1", "rollback_skip"]
    assert row(out, "spike_recovering")[7:9] == ["1/1", "ignore"]
    assert "clean runs: 1 logs, 400 iterations: 0 false alarm(s)" in out

    as_json = json.loads(cli.runmgr("watch", "score", str(folder), "--json").stdout)
    hang = next(c for c in as_json["classes"] if c["class"] == "hang")
    assert hang["found"] == 1 and hang["right_decision"] == 1 and hang["median_delay_s"] == pytest.approx(60.2)
    assert as_json["clean_iterations"] == 400
    assert {log["log"]: log["flavor"] for log in as_json["logs"]}["clean.log"] == "mindspeed_llm"


def test_other_thresholds_change_the_calls(tmp_path):
    folder = corpus(tmp_path / "corpus")
    done = cli.runmgr("watch", "score", str(folder), "conf=shadow", "watcher.loss_spike.grace_steps=2")
    assert done.returncode == 0, done.stderr
    # A 2-step grace: the spike at 300, 4 iterations long, no longer recovers in time.
    assert row(done.stdout, "spike_recovering")[7] == "0/1"
    assert "watcher.loss_spike.grace_steps=2" in done.stdout.splitlines()[0]


@pytest.mark.parametrize("setup, args, words", [
    (None, ["/no/such/corpus"], "no such folder: /no/such/corpus"),
    ("empty", [], "holds no *.log"),
    ("unlabelled", [], "has no orphan.labels.yaml beside it"),
    ("labels only", [], "labels no log: gone.log is not there"),
    ("bad labels", [], "unknown key incidents[0].onset"),
    ("corpus", ["trainer.kind=builtin"], "trainer.kind=megatron"),
    ("corpus", ["conf=shadow", "conf=demo"], "name at most one config"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, setup, args, words):
    folder = tmp_path / "corpus"
    if setup is not None:
        folder.mkdir()
    if setup in ("unlabelled", "labels only", "bad labels", "corpus"):
        corpus(tmp_path / "full")
        for path in (tmp_path / "full").iterdir():
            path.rename(folder / path.name)
    if setup == "unlabelled":
        (folder / "orphan.log").write_text("x\n")
    if setup == "labels only":
        (folder / "gone.labels.yaml").write_text(CLEAN_LABELS)
    if setup == "bad labels":
        (folder / "hang.labels.yaml").write_text(HANG_LABELS.replace("step: 150", "onset: 150"))
    done = cli.runmgr("watch", "score", str(folder) if setup is not None else args.pop(0), *args)
    assert done.returncode == 2 and words in done.stderr and done.stderr.count("\n") == 1, done.stderr
