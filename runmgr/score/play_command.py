"""``runmgr watch play LOG DEST|- [--speed X]``: a recorded training log written again, line by
line, at the pace its job wrote it (``--speed`` times faster): a stand-in for a running job, to
try ``runmgr watch follow`` (its notifications, its metrics and alerts) on a log whose story is
known before pointing it at a real one.

    runmgr watch play tests/data/live/megatron_spikes_and_hang.log train.log --speed 100 &
    runmgr watch follow train.log run.dir=runs/beside
    runmgr watch play job42.log - | runmgr watch follow - conf=myjob

Each line waits until its time (runmgr/score/timeline.py: its stamp, or the log's clock) has come,
relative to the first line's, divided by the speed; lines of one moment are written together and
flushed at once. DEST is created (or emptied) first; ``-`` is standard output, and a reader that
goes away ends the play.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable, Sequence, TextIO

from runmgr.score.labels import ScoreInputError
from runmgr.score.timeline import timed_lines
from runmgr.shadow.lines import Line


def read_log(path: Path) -> list[str]:
    if not path.is_file():
        raise ScoreInputError(f"no such log: {path}; pass a recorded Megatron-LM or MindSpeed-LLM training log")
    with path.open(encoding="utf-8", errors="replace", newline="") as handle:
        return handle.readlines()


def moments(timed: Sequence[Line]) -> list[tuple[float, list[str]]]:
    """The lines grouped by the moment they were written, in order."""
    grouped: list[tuple[float, list[str]]] = []
    for at, line in timed:
        if grouped and grouped[-1][0] == at:
            grouped[-1][1].append(line)
        else:
            grouped.append((at, [line]))
    return grouped


def play(timed: Sequence[Line], out: TextIO, speed: float,
         clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> int:
    """Write ``timed`` to ``out`` at ``speed`` times its pace; the lines written."""
    if not timed:
        return 0
    start, first = clock(), timed[0][0]
    written = 0
    for at, lines in moments(timed):
        wait = start + (at - first) / speed - clock()
        if wait > 0:
            sleep(wait)
        out.write("".join(line + "\n" for line in lines))
        out.flush()
        written += len(lines)
    return written


def main_play(log: str, dest: str, speed: float, stdout: TextIO) -> int:
    timed = timed_lines(read_log(Path(log)))
    if dest == "-":
        try:
            play(timed, stdout, speed)
        except BrokenPipeError:  # the follower at the pipe's end stopped: nothing left to write for
            return 0
        return 0
    target = Path(dest)
    if not target.parent.is_dir():
        raise ScoreInputError(f"no such folder: {target.parent} (for {dest}); write the log where a follower can read it")
    with target.open("w", encoding="utf-8") as out:
        play(timed, out, speed)
    return 0


def positive_speed(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--speed must be a number above 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"--speed must be a number above 0, got {text!r}")
    return value


def cmd_watch_play(args: argparse.Namespace) -> int:
    return main_play(args.log, args.dest, args.speed, sys.stdout)


def add_parser(watch_sub) -> None:
    played = watch_sub.add_parser("play", help="write a recorded training log again at its pace (a stand-in for a "
                                               "running job, to try `watch follow` on)")
    played.add_argument("log", help="a recorded Megatron-LM or MindSpeed-LLM training log")
    played.add_argument("dest", help="the file to write it to (created or emptied), or - for standard output")
    played.add_argument("--speed", type=positive_speed, default=1.0, metavar="X",
                        help="times faster than the job wrote it (default 1)")
    played.set_defaults(func=cmd_watch_play)
