"""The same rules at every ``runmgr launch``: an error stops it with one line and
exit code 2 before a run directory or Ray exists; a warning is printed and
recorded in the logbook, and so is each rule ``lint.ignore`` silences."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from logbook import Logbook
from runmgr.config.compose import load_run_config
from runmgr.lint.checkpoint import check_checkpoint
from tests import cli
from trainer.data.indexed import IndexedDatasetWriter

ROOT = Path(__file__).resolve().parents[3]
SMALL = ["model.seq_length=32", "model.max_position_embeddings=32", "data.corpus_max_bytes=200000"]
NO_RAY = Path(__file__).with_name("no_ray.py")
"""``runmgr`` with Ray's start and preflight replaced by a refusal: a launch that reaches them says so."""


def runmgr_without_ray(*args: str) -> subprocess.CompletedProcess:
    """Forked from the session's CLI fork server (tests/cli.py), not a new Python: about a
    CPU-second of start-up and imports a case."""
    return cli.runmgr(*args, script=NO_RAY, cwd=ROOT, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))


@pytest.fixture(scope="module")
def out_of_range(tmp_path_factory) -> Path:
    """A byte-level dataset with one token id (300) past the demo's vocabulary of 256."""
    prefix = tmp_path_factory.mktemp("data") / "bad"
    rng = np.random.default_rng(1)
    with IndexedDatasetWriter(prefix, dtype=np.uint16) as writer:
        for index in range(30):
            tokens = rng.integers(0, 256, 400)
            if index == 17:
                tokens[5] = 300
            writer.add_document(tokens)
    return prefix


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]], ids=["launch", "dry-run"])
def test_an_out_of_range_token_stops_the_launch_in_one_line_before_anything_exists(out_of_range, tmp_path,
                                                                                       dry_run):
    run_dir = tmp_path / "run"
    done = runmgr_without_ray("launch", "conf=demo", *dry_run, f"run.dir={run_dir}",
                              f"data.data_path={out_of_range}", *SMALL)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("runmgr: error: lint error token-range: token id 300 is "
                                                   "outside [0, model.vocab_size=256)"), done.stderr
    assert "ray started" not in done.stderr and done.stdout == ""
    assert not run_dir.exists()


@pytest.mark.slow
def test_a_tied_model_from_an_untied_checkpoint_is_an_error(tmp_path):
    """The real trainer writes an untied checkpoint; the same run dir with tied embeddings is refused."""
    save = tmp_path / "run" / "checkpoints"
    # `python -m trainer`, forked from the session's CLI fork server (torch imported once: tests/cli.py).
    trained = cli.runmgr("conf=demo", "training.train_iters=1", "checkpoint.save_interval=1",
                         "model.untie_embeddings_and_output_weights=true", f"checkpoint.save={save}", *SMALL,
                         module="trainer", cwd=ROOT, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert trained.returncode == 0, trained.stderr[-3000:]
    tied = load_run_config("demo", [f"run.dir={tmp_path / 'run'}", *SMALL])
    found = check_checkpoint(tied)
    assert [(f.rule, f.severity) for f in found] == [("tied-from-untied", "error")]
    assert "output.weight" in found[0].message
    untied = load_run_config("demo", [f"run.dir={tmp_path / 'run'}", "model.untie_embeddings_and_output_weights=true",
                                      *SMALL])
    assert check_checkpoint(untied) == []


@pytest.mark.slow
def test_a_launch_records_its_warnings_and_its_ignored_rules_in_the_logbook(tmp_path, shared_ray):
    # The session's Ray (no Ray of its own) and no probes: the lint runs before either.
    run_dir = tmp_path / "warned"
    done = cli.runmgr(
        "launch", "conf=demo", f"run.dir={run_dir}", "chaos=none", f"cluster.address={shared_ray.address}",
        "health.skip=true", "training.train_iters=2", "checkpoint.save_interval=2", "cluster.num_workers=1",
        "training.global_batch_size=4", "optim.adam_beta2=0.999", "model.hidden_dropout=0.1",
        "lint.ignore=[dropout]", "metrics.enabled=false", *SMALL,
        cwd=ROOT, timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "lint warning adam-beta2: optim.adam_beta2 is 0.999" in done.stdout
    with Logbook.open(run_dir, create=False) as book:
        events = [e for e in book.events() if e.get("kind") in ("lint", "lint_ignored")]
    assert [(e["kind"], e["data"]["rule"]) for e in events] == [("lint", "adam-beta2"), ("lint_ignored", "dropout")]
    assert events[1]["data"]["silenced"]["message"].startswith("dropout is on in pretraining")
