"""A followed log's lines: appended in pieces, truncated, rotated, a folder of them, a stream."""

from __future__ import annotations

import io
import os
from pathlib import Path

from runmgr.shadow.lines import FileLines, FolderLines, StreamLines, open_source


def texts(lines) -> list[str]:
    return [line for _, line in lines]


def test_a_line_is_taken_once_its_newline_is_written_each_with_the_time_it_was_read(tmp_path: Path):
    log, clock = tmp_path / "train.log", [5.0]
    source = FileLines(log, lambda: clock[0])
    assert source.take() == []  # not there yet: a job about to start
    log.write_text("first\nsec")
    assert source.take() == [(5.0, "first")]
    clock[0] = 6.0
    with log.open("a") as handle:
        handle.write("ond\r\nthird\n")
    assert source.take() == [(6.0, "second"), (6.0, "third")]
    assert source.take() == []


def test_a_truncated_log_is_read_again_from_its_start(tmp_path: Path):
    log = tmp_path / "train.log"
    source = FileLines(log, lambda: 0.0)
    log.write_text("a\nb\nc\n")
    assert texts(source.take()) == ["a", "b", "c"]
    log.write_text("new\n")  # copytruncate, or the job reopened its log with >
    assert texts(source.take()) == ["new"]


def test_a_rotated_log_is_read_to_its_end_then_the_new_file_from_its_start(tmp_path: Path):
    log = tmp_path / "train.log"
    source = FileLines(log, lambda: 0.0)
    log.write_text("1\n2\n")
    assert texts(source.take()) == ["1", "2"]
    with log.open("a") as handle:
        handle.write("3\n")  # written before the rotation, not yet read
    os.rename(log, tmp_path / "train.log.1")
    log.write_text("4\n")
    assert texts(source.take()) == ["3", "4"]


def test_a_position_saved_is_where_a_new_source_goes_on_unless_the_file_was_replaced(tmp_path: Path):
    log = tmp_path / "train.log"
    log.write_text("a\nb\n")
    first = FileLines(log, lambda: 0.0)
    first.take()
    saved = first.position()
    with log.open("a") as handle:
        handle.write("c\n")
    second = FileLines(log, lambda: 0.0)
    second.restore(saved)
    assert texts(second.take()) == ["c"]
    log.unlink()
    log.write_text("z\n")  # replaced while no one followed it: all of it is new
    third = FileLines(log, lambda: 0.0)
    third.restore(saved)
    assert texts(third.take()) == ["z"]


def test_a_folder_follows_every_file_in_it_and_one_that_appears_later_not_the_rotated_copies(tmp_path: Path):
    (tmp_path / "rank0.log").write_text("r0 a\n")
    (tmp_path / "rank1.log").write_text("r1 a\n")
    (tmp_path / "rank0.log.1").write_text("old\n")
    source = open_source(str(tmp_path), lambda: 0.0, io.StringIO())
    assert isinstance(source, FolderLines)
    assert texts(source.take()) == ["r0 a", "r1 a"]
    (tmp_path / "rank2.log").write_text("r2 a\n")
    with (tmp_path / "rank0.log").open("a") as handle:
        handle.write("r0 b\n")
    assert texts(source.take()) == ["r0 b", "r2 a"]
    restored = FolderLines(tmp_path, lambda: 0.0)
    restored.restore(source.position())
    assert restored.take() == []


def test_a_stream_is_read_as_it_comes_and_says_when_it_ended():
    read, write = os.pipe()
    with os.fdopen(read) as reading, os.fdopen(write, "w") as writing:
        source = StreamLines(reading, lambda: 1.0)
        writing.write("one\ntwo\n")
        writing.flush()
        lines: list = []
        while len(lines) < 2:
            lines += source.take()
        assert lines == [(1.0, "one"), (1.0, "two")] and not source.ended
        writing.close()
        source._thread.join(timeout=10)
        assert source.ended
