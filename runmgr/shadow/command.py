"""``runmgr watch follow FILE|DIR|- [conf=NAME] [key=value ...]``: a live training log followed
in shadow mode until it ends (a stream closed) or the follower is stopped (Ctrl-C, SIGTERM).

The config (``conf/shadow.yaml`` unless one is named) gives the watcher and policy settings, the
run directory (``run.dir=``, as for launch) and the metrics endpoint; ``megatron.args`` the job's
own arguments, for the restart command each recommendation quotes; ``trainer.kind`` the log's
format: ``megatron`` (Megatron-LM, MindSpeed-LLM) or ``builtin`` (runmgr's own trainer run by
another launcher: ``torchrun -m trainer conf=demo | runmgr watch follow - conf=demo``).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import Optional, Sequence, TextIO

from logbook import Logbook
from runmgr.config.compose import load_run_config, split_conf
from runmgr.config.schema import RunConfig
from runmgr.errors import UserError
from runmgr.metrics.exporter import MetricsObserver
from runmgr.metrics.server import MetricsServer
from runmgr.notify.observer import NotifyObserver
from runmgr.shadow.follower import NOT_ACTED_ON, Follower
from runmgr.shadow.lines import StreamLines, open_source

DEFAULT_CONF = "shadow"
POLL_INTERVAL_S = 0.2
"""Between two looks at the log: a line is judged within this of being written."""


class FollowInputError(UserError):
    """A source or option ``watch follow`` cannot use: one line."""


def follow_config(conf: Optional[str], overrides: Sequence[str], conf_dir: Optional[Path]) -> RunConfig:
    """The config that judges the log: ``trainer.kind=megatron`` (conf/shadow.yaml) reads a
    Megatron-LM or MindSpeed-LLM log, ``builtin`` runmgr's own trainer's (``python -m trainer``
    under another launcher; a run runmgr launched has its logbook already)."""
    return load_run_config(conf or DEFAULT_CONF, list(overrides), conf_dir)


def check_source(where: str) -> None:
    if where == "-":
        return
    path = Path(where)
    if not path.exists() and not path.parent.is_dir():
        raise FollowInputError(f"no such folder: {path.parent} (for the log {where}); pass the job's log file, "
                               f"its folder of per-rank logs, or - for standard input")


def main_follow(where: str, conf: Optional[str], overrides: Sequence[str], conf_dir: Optional[Path],
                out: TextIO, stdin: TextIO, poll_interval_s: float = POLL_INTERVAL_S,
                stop: Optional[threading.Event] = None) -> int:
    """Follow until the source ends or ``stop`` is set (SIGINT/SIGTERM set it); 0."""
    config = follow_config(conf, overrides, conf_dir)
    check_source(where)
    stop = stop or _stop_on_signals()
    source = open_source(where, time.time, stdin)
    metrics = MetricsServer.start(config.metrics)
    book = Logbook.open(config.run_dir())
    exporter = MetricsObserver(book, config.training.train_iters, save_interval=config.save_interval(),
                               run=config.run.name) \
        if metrics is not None else None
    if metrics is not None and exporter is not None:
        metrics.registry.register(exporter)
    notify = None
    try:
        notify = NotifyObserver(config, book) if config.notify.targets() else None  # a missing secret: one line
        follower = Follower(config, source, book, time.time, observers=(exporter,) if exporter else (),
                            notify=notify)
        say(out, f"runmgr: following {source.describe()} in shadow mode ({NOT_ACTED_ON}); logbook {config.run_dir()}"
                 + (f"; metrics at http://{metrics.address}/metrics" if metrics is not None else ""))
        _follow(follower, source, stop, poll_interval_s, out)
    finally:
        if notify is not None:  # what is queued is sent (or its failure recorded) before the logbook closes
            notify.close()
        if metrics is not None:
            if exporter is not None:
                metrics.registry.unregister(exporter)
            metrics.close()
        book.close()
    return 0


def _follow(follower: Follower, source, stop: threading.Event, poll_interval_s: float, out: TextIO) -> None:
    while not stop.is_set():
        for judgement in follower.poll():
            decision = judgement.decision
            acted = "" if decision.action == "ignore" else f" ({NOT_ACTED_ON})"
            say(out, f"runmgr: {judgement.incident.summary()} -> {decision.action}{acted}")
        if isinstance(source, StreamLines) and source.ended:
            follower.poll()
            follower.close(f"the followed stream ended at step {follower.subrun.last_step}"
                           if follower.subrun is not None else None)
            say(out, "runmgr: the followed stream ended")
            return
        stop.wait(poll_interval_s)
    follower.close()
    say(out, "runmgr: stopped following; a follower of the same run directory goes on from here")


def say(out: TextIO, line: str) -> None:
    out.write(line + "\n")
    out.flush()


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    return stop


def cmd_watch_follow(args) -> int:
    conf, overrides = split_conf(args.items, "runmgr watch follow train.log conf=myjob")
    return main_follow(args.source, conf, overrides, args.config_dir, sys.stdout, sys.stdin,
                       poll_interval_s=args.poll_interval)
