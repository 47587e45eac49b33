"""``runmgr logbook skipped RUN``: the data a run chose never to train on.

Every skip range in the lineage's plans (stream positions ``[start, end)``)
is listed with the sub-run that added it and why, then the text of its samples
from the incident's onset on (the range may start at the checkpoint before it),
decoded from the run's own sample stream: the data order is a pure
function of (seed, position), so the recorded config rebuilds exactly the
samples the trainer would have read there (seed 004: look at the data around
a jump). Lives in runmgr because it needs both the logbook and the trainer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping, Sequence, TextIO

from logbook import Logbook, LogbookError, SubRun
from logbook.changes import range_text, skip_ranges
from logbook.render import run_title
from logbook.textfmt import tidier, wrap
from trainer.config import DataConfig
from trainer.data import SampleStream, build_sample_stream

DEFAULT_LIMIT = 3
"""Samples decoded per range unless ``--limit`` says otherwise."""
DEFAULT_CHARS = 300
"""Characters of each decoded sample shown unless ``--chars`` says otherwise."""
_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\"}
"""A backslash is escaped too, so data holding the text ``\\x1b`` reads apart from an ESC byte."""


@dataclass(frozen=True)
class SkippedRange:
    """One skip range and where it came from."""

    start: int
    """First stream position skipped."""
    end: int
    """One past the last position skipped."""
    subrun: SubRun
    """The first sub-run whose plan holds the range: its config defines the stream."""
    grows: tuple[tuple[int, int], ...] = ()
    """Earlier ranges this one swallowed (ranges that touch are merged)."""

    def new_positions(self) -> list[int]:
        """Positions of the range that no earlier range skipped already."""
        return [p for p in range(self.start, self.end) if not any(a <= p < b for a, b in self.grows)]

    @property
    def onset(self) -> tuple[int, int | None] | None:
        """``(stream position, step)`` where the incident that added the range began, when the
        sub-run's evidence records it inside the range's new positions: what a reader looks at first."""
        incident = self.subrun.evidence.get("incident")
        sample = incident.get("onset_sample") if isinstance(incident, Mapping) else None
        if not isinstance(sample, int) or sample not in self.new_positions():
            return None
        step = incident.get("onset_step")
        return sample, step if isinstance(step, int) else None

    def shown_positions(self) -> list[int]:
        """The new positions in the order they are decoded: from the onset on, then the ones before it."""
        positions, onset = self.new_positions(), self.onset
        if onset is None:
            return positions
        return [p for p in positions if p >= onset[0]] + [p for p in positions if p < onset[0]]

    @property
    def why(self) -> str:
        """The decision's reason when recorded, else the sub-run's cause."""
        decision = self.subrun.evidence.get("decision")
        if isinstance(decision, Mapping) and decision.get("reason"):
            return str(decision["reason"])
        return self.subrun.cause


def skipped_ranges(lineage: Sequence[SubRun]) -> list[SkippedRange]:
    """Each range the first time a sub-run's plan holds it, in lineage order."""
    found: list[SkippedRange] = []
    seen: set[tuple[int, int]] = set()
    for subrun in lineage:
        for start, end in skip_ranges(subrun.plan):
            if (start, end) in seen:
                continue
            grows = tuple((r.start, r.end) for r in found if r.start < end and start < r.end)
            found.append(SkippedRange(start, end, subrun, grows))
            seen.add((start, end))
    return found


def stream_of(subrun: SubRun) -> SampleStream:
    """The sample stream of the sub-run's recorded config, without skips (so skipped positions decode)."""
    config = subrun.config
    data, model, training = (config.get(key) for key in ("data", "model", "training"))
    if not (isinstance(data, Mapping) and isinstance(model, Mapping) and isinstance(training, Mapping)
            and "seq_length" in model and "seed" in training):
        raise LogbookError(
            f"sub-run {subrun.id} recorded no data/model.seq_length/training.seed config, so its samples "
            "cannot be rebuilt: only runs launched by `runmgr launch` can be decoded")
    known = {f.name for f in fields(DataConfig)}
    data_config = DataConfig(**{key: value for key, value in data.items() if key in known})
    return build_sample_stream(data_config, int(model["seq_length"]), int(training["seed"]))


def printable(text: str) -> str:
    """Text safe for a terminal: newlines, tabs, NULs and other control characters
    escaped as Python would (``codecs.decode(..., "unicode_escape")`` reverses it)."""
    out = []
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        else:
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    return "".join(out)


def chunks(text: str, width: int) -> list[str]:
    """``text`` in pieces of ``width`` characters, exactly (decoded data is not prose)."""
    return [text[i:i + width] for i in range(0, len(text), width)] or [""]


def describe(found: SkippedRange, stream: SampleStream, limit: int, chars: int, width: int) -> list[str]:
    """One range: where it is, who added it and why, then its samples decoded from the
    incident's onset on where the evidence records it, else its first (of a range that grew an
    earlier one, of its new samples)."""
    count = found.end - found.start
    head = f"{range_text(found.start, found.end)}  {count} sample{'s' if count != 1 else ''}, " \
           f"added by {found.subrun.id}"
    if found.grows:
        head += " (grows " + ", ".join(range_text(*r) for r in found.grows) + ")"
    lines = wrap(head, width, "  ")
    run = found.subrun.config.get("run")
    tidy = tidier([run.get("dir") if isinstance(run, Mapping) else None])
    lines += wrap(f"  why: {tidy(found.why)}", width, "       ")
    label_width = len(str(found.end)) + 2
    positions = found.shown_positions()
    onset = found.onset
    if onset is not None and limit > 0:
        step = f" (step {onset[1]}'s batch)" if onset[1] is not None else ""
        lines.append(f"  from the incident's onset, #{onset[0]}{step}:")
    for position in positions[:limit]:
        text = printable(stream.decode(position))
        shown = text if len(text) <= chars else text[:chars] + "…"
        label = f"  {'#' + str(position):>{label_width}}  "
        pieces = chunks(shown, max(20, width - len(label)))
        lines.append(label + pieces[0])
        lines += [" " * len(label) + piece for piece in pieces[1:]]
    if len(positions) > limit:
        lines.append(f"  … {len(positions) - limit} more (--limit {len(positions)} shows them all)")
    return lines


def show_skipped(run_dir: str | Path, out: TextIO, limit: int = DEFAULT_LIMIT, chars: int = DEFAULT_CHARS,
                 width: int = 100) -> int:
    """Print every skip range of the run with its first ``limit`` samples decoded."""
    if limit < 0 or chars < 1:
        raise LogbookError(f"--limit must be >= 0 and --chars >= 1, got --limit {limit} --chars {chars}")
    with Logbook.open(run_dir, create=False) as book:
        lineage = book.lineage()
    found = skipped_ranges(lineage)
    title = run_title(lineage)
    if not found:
        out.write(f"{title}: no skip ranges: every sample of the stream was trained on (or is still to come)\n")
        return 0
    streams: dict[str, SampleStream] = {}
    lines = [f"{title}: {len(found)} skip range{'s' if len(found) != 1 else ''} "
             "(stream positions, [start, end))"]
    for item in found:
        key = _stream_key(item.subrun.config)
        if key not in streams:
            streams[key] = stream_of(item.subrun)
        lines += [""] + describe(item, streams[key], limit, chars, width)
    lines += [""] + [f"decoded from {source}" for source in sorted({s.source for s in streams.values()})]
    out.write("\n".join(lines) + "\n")
    return 0


def _stream_key(config: Mapping[str, Any]) -> str:
    return json.dumps([config.get(key) for key in ("data", "model", "training")], sort_keys=True, default=str)
