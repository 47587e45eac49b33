"""The labelled corpus (tests/data/detectors) is what its generator writes, every labels file
reads, and docs/detectors.md's table is what `runmgr watch score` prints for it now: a change to
a detector, the policy or the corpus that moves a figure changes the page in the same commit."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from runmgr.score.command import corpus_files
from runmgr.score.labels import read_labels

ROOT = Path(__file__).resolve().parents[3]
CORPUS = ROOT / "tests" / "data" / "detectors"
DOC = ROOT / "docs" / "detectors.md"


def generator():
    spec = importlib.util.spec_from_file_location("make_corpus", CORPUS / "make_corpus.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_the_committed_corpus_is_what_its_generator_writes_and_every_label_reads():
    logs = generator().LOGS
    assert sorted(logs) == sorted(log.stem for log, _ in corpus_files(CORPUS))
    for name, make in logs.items():
        log, labels = make()
        assert (CORPUS / f"{name}.log").read_text() == log, f"run `python {CORPUS / 'make_corpus.py'}`"
        assert (CORPUS / f"{name}.labels.yaml").read_text() == labels
        read_labels(CORPUS / f"{name}.labels.yaml")
    classes = {label.cls for _, path in corpus_files(CORPUS) for label in read_labels(path).incidents}
    assert classes == {"spike_persistent", "spike_recovering", "loss_scale_collapse", "nan", "slowdown", "hang"}
    assert sum(read_labels(path).clean for _, path in corpus_files(CORPUS)) >= 4


def test_the_detectors_page_shows_the_table_the_score_prints_now(detectors_score):
    done = detectors_score()  # `runmgr watch score tests/data/detectors`, once a session (tests/conftest.py)
    assert done.returncode == 0, done.stderr
    printed = done.stdout.split("\nmisses, wrong decisions and false alarms:")[0].rstrip()
    (shown,) = re.findall(r"```text\n(.*?)\n```", DOC.read_text(), re.S)
    assert shown == printed, "docs/detectors.md's table is out of date: paste the new one (and say what moved)"
