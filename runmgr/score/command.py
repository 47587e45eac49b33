"""``runmgr watch score DIR [conf=NAME] [key=value ...] [--json]``: the detectors' and the policy's
precision over a folder of labelled logs.

Each ``NAME.log`` in DIR (a Megatron-LM or MindSpeed-LLM training log) is followed as ``runmgr
watch follow`` would have followed it while it was written (runmgr/score/playback.py), with the
config's watcher and policy (default conf/shadow.yaml) and the flavor its ``NAME.labels.yaml``
names; the incidents and decisions are matched against the labels (runmgr/score/tally.py) and a
table says, per class of incident: found, missed, the delay from onset to decision, whether the
decision was the labelled remedy; and the false alarms, per kind, with their rate on the clean runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence, TextIO

from logbook import Logbook
from runmgr.config.compose import split_conf
from runmgr.config.schema import RunConfig
from runmgr.score.labels import LABELS_SUFFIX, LogLabels, ScoreInputError, read_labels
from runmgr.score.playback import play
from runmgr.score.report import render_json, render_text
from runmgr.score.tally import Corpus, LogScore, score_log
from runmgr.score.timeline import PlayedLog, step_times, timed_lines
from runmgr.shadow.command import follow_config


def corpus_files(folder: Path) -> list[tuple[Path, Path]]:
    """Each log of ``folder`` with its labels file; a log without labels (or labels without a log)
    is one line."""
    if not folder.is_dir():
        raise ScoreInputError(f"no such folder: {folder}; pass a folder of NAME.log files, each with "
                              f"NAME{LABELS_SUFFIX} beside it (tests/data/detectors is one)")
    logs = sorted(folder.glob("*.log"))
    labels = {path.name[:-len(LABELS_SUFFIX)] for path in folder.glob("*" + LABELS_SUFFIX)}
    if not logs:
        raise ScoreInputError(f"{folder} holds no *.log: pass a folder of labelled training logs")
    for log in logs:
        if log.stem not in labels:
            raise ScoreInputError(f"{log} has no {log.stem}{LABELS_SUFFIX} beside it: label it, or move it out")
    for name in sorted(labels - {log.stem for log in logs}):
        raise ScoreInputError(f"{folder / (name + LABELS_SUFFIX)} labels no log: {name}.log is not there")
    return [(log, folder / f"{log.stem}{LABELS_SUFFIX}") for log in logs]


def score_one(config: RunConfig, log: Path, labels: LogLabels) -> LogScore:
    """``log`` followed with ``config`` in the labels' flavor, into a logbook thrown away after."""
    flavored = replace(config, megatron=replace(config.megatron, flavor=labels.flavor))
    with log.open(encoding="utf-8", errors="replace", newline="") as handle:
        timed = timed_lines(handle.readlines())
    source = PlayedLog(timed, log.name, now=timed[0][0] if timed else 0.0)
    with tempfile.TemporaryDirectory(prefix="runmgr-score-") as scratch:
        book = Logbook.open(Path(scratch) / log.stem, clock=source.clock, scratch=True)
        try:
            calls = play(flavored, source, book, labels.silence_at_end_s)
        finally:
            book.close()
    return score_log(log.name, labels, calls, step_times(timed))


def main_score(folder: str, conf: Optional[str], overrides: Sequence[str], conf_dir: Optional[Path],
               out: TextIO, as_json: bool = False) -> int:
    """Score every log of ``folder``; 0 after printing the table."""
    config = follow_config(conf, overrides, conf_dir)
    if not config.drives_megatron:
        raise ScoreInputError("watch score reads labelled Megatron-LM and MindSpeed-LLM logs: the config must say "
                              "trainer.kind=megatron (conf/shadow.yaml does)")
    files = corpus_files(Path(folder))
    labelled = [(log, read_labels(labels)) for log, labels in files]  # every labels file checked first
    corpus = Corpus([score_one(config, log, labels) for log, labels in labelled])
    heading = f"runmgr watch score {folder} (conf={conf or 'shadow'}{''.join(' ' + o for o in overrides)})"
    out.write(render_json(corpus, heading) if as_json else render_text(corpus, heading))
    return 0


def cmd_watch_score(args: argparse.Namespace) -> int:
    conf, overrides = split_conf(args.items, "runmgr watch score tests/data/detectors conf=shadow")
    return main_score(args.folder, conf, overrides, args.config_dir, sys.stdout, args.json)


def add_parser(watch_sub) -> None:
    score = watch_sub.add_parser("score", help="the detectors' precision over a folder of labelled logs: found, "
                                               "missed, delay, right decision, false alarms")
    score.add_argument("folder", help="a folder of NAME.log files, each with NAME.labels.yaml beside it")
    score.add_argument("items", nargs="*", metavar="conf=NAME key=value",
                       help="the config and overrides whose watcher and policy judge the logs (default conf/shadow.yaml)")
    score.add_argument("--config-dir", type=Path, default=None, help="directory of the configs (default: ./conf)")
    score.add_argument("--json", action="store_true", help="the score as one JSON document, every call listed")
    score.set_defaults(func=cmd_watch_score)
