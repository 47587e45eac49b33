"""``runmgr launch conf=run12 --rehearse`` end to end: run12's recipe, made small, trains on
a local Ray with a chaos schedule, and the logbook says it is a rehearsal of run12.

run12's kinds of parallelism at degree 2: TP 2 x DP 2 with FSDP2, 4 ranks. Kept small for CI on
2 cores: 6 steps of one micro-batch of 2 per replica, a model of width 32 over 32 tokens, a
checkpoint every 3, one fault (kill -9 of rank 1 at step 5, resumed from the checkpoint of step
3). A rehearsal takes its schedule by name from the config directory (``rehearse.chaos``), so the
test runs on a copy of conf/ with that one-fault schedule added (:data:`SCHEDULE`);
conf/chaos/kill_worker.yaml's kill at step 30 would be five times the steps. The
whole schedule (conf/chaos/rehearsal.yaml, 200 steps) is `runmgr launch conf=run12 --rehearse`,
run by hand (docs/parallel.md)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from logbook import Logbook
from tests import cli

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

STEPS = 6
KILL_AT = 5
SCHEDULE = "ci_kill_worker"
"""conf/chaos/kill_worker.yaml's fault, earlier: kill -9 of rank 1 at step :data:`KILL_AT`, where
every rank waits after that step until the kill (the pause fires once a lineage: the restarted
sub-run passes it), so the kill lands before the run's end however fast the ranks step."""
SMALL = [f"rehearse.train_iters={STEPS}", "rehearse.save_interval=3", f"rehearse.chaos={SCHEDULE}",
         "rehearse.micro_batch_size=2", "rehearse.global_batch_size=4", "rehearse.hidden_size=32",
         "rehearse.seq_length=32",
         "health.skip=true", "data.corpus_max_bytes=400000"]
"""The rehearsal's sizes for CI (a global batch of 4: one micro-batch of 2 per replica at DP 2; a
model of width 32 over 32 tokens, whose 4 heads of 8 still split over TP 2: what is rehearsed is
the layout and the chaos, not the model's size; was a batch of 16, then 8, at width 64 over 64
tokens), and two settings of the real run a rehearsal keeps (no node probes: the chaos is the
test; a smaller slice of the embedded corpus)."""


def config_dir(tmp_path: Path) -> Path:
    """The repository's conf/, copied, with :data:`SCHEDULE` in its chaos/."""
    conf = shutil.copytree(ROOT / "conf", tmp_path / "conf")
    (conf / "chaos" / f"{SCHEDULE}.yaml").write_text(
        f"faults:\n  - {{kind: pause_at_step, at_step: {KILL_AT}}}\n  - {{kind: kill_worker, at_step: {KILL_AT}, rank: 1}}\n"
        "seed: 0\n")
    return conf


def test_a_rehearsal_of_run12_finishes_past_its_chaos_and_the_logbook_marks_it(tmp_path):
    conf = config_dir(tmp_path)
    result = cli.runmgr("launch", "conf=run12", "--rehearse", "--config-dir", str(conf), *SMALL, cwd=tmp_path,
                        timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    run_dir = tmp_path / "runs" / "run12-rehearsal"  # never the real run's directory
    with Logbook.open(run_dir, create=False) as book:
        lineage, events = book.lineage(), book.events()
    assert lineage[0].id == "12.00" and lineage[-1].end_state == "finished" and lineage[-1].last_step == STEPS
    assert lineage[0].config["rehearse"]["of"] == "run12"
    parallel = lineage[0].config["parallel"]
    assert parallel["tensor_model_parallel_size"] == 2 and parallel["use_torch_fsdp2"]  # run12's kinds
    assert lineage[0].config["precision"]["fp16"] and lineage[0].config["optim"]["adam_beta2"] == 0.95
    marks = [e for e in events if e.get("kind") == "rehearsal"]
    assert [e["subrun"] for e in marks] == ["12.00"] and marks[0]["data"]["of"] == "run12"
    chaos = [e for e in events if e.get("kind") == "chaos"]
    incidents = [e for e in events if e["type"] == "incident"]
    decisions = [e for e in events if e["type"] == "decision"]
    # The pause the kill lands in, and the kill.
    assert sorted(e["data"]["kind"] for e in chaos) == ["kill_worker", "pause_at_step"]
    (kill,) = [e for e in chaos if e["data"]["kind"] == "kill_worker"]
    assert "kill" in kill["message"] and kill["data"]["step"] == KILL_AT
    assert [i["kind"] for i in incidents] == ["worker_death"] and [d["action"] for d in decisions] == ["restart"]
    shown = cli.runmgr("logbook", "show", str(run_dir), cwd=tmp_path, timeout=120).stdout
    assert "a rehearsal of run12" in shown.splitlines()[0]
