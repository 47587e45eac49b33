"""The prepare CLI: text and JSONL in, indexed dataset out, bad input exit 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from trainer.data.indexed import IndexedDataset
from trainer.data.prepare import main


def run_prepare(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer.data.prepare", *args],
                          capture_output=True, text=True, timeout=60)


def documents(prefix) -> list[bytes]:
    ds = IndexedDataset(prefix)
    return [ds.get(i).tobytes() for i in range(len(ds))]


def test_text_and_jsonl_files_become_one_dataset(tmp_path):
    (tmp_path / "a.txt").write_text("first file\n\nstill the first file\n", encoding="utf-8")
    rows = [{"text": "héllo"}, {"text": ""}, {"text": "second row", "id": 2}]
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    result = run_prepare("--input", str(tmp_path / "a.txt"), "--input", str(tmp_path / "b.jsonl"),
                         "--output-prefix", str(tmp_path / "out" / "ds"))
    assert result.returncode == 0, result.stderr
    assert documents(tmp_path / "out" / "ds") == [
        b"first file\n\nstill the first file\n\x00", "héllo".encode() + b"\x00", b"second row\x00"]
    assert IndexedDataset(tmp_path / "out" / "ds").dtype.name == "uint8"
    assert "3 documents" in result.stdout and "1 empty skipped" in result.stdout
    assert "ds.bin" in result.stdout and "ds.idx" in result.stdout


def test_split_paragraphs_and_json_key(tmp_path, capsys):
    (tmp_path / "p.txt").write_text("one\n\n\ntwo\nlines\n  \nthree\n", encoding="utf-8")
    (tmp_path / "c.jsonl").write_text('{"body": "from body"}\n', encoding="utf-8")
    assert main(["--input", str(tmp_path / "p.txt"), "--split-paragraphs", "--output-prefix", str(tmp_path / "p")]) == 0
    assert documents(tmp_path / "p") == [b"one\x00", b"two\nlines\x00", b"three\x00"]
    assert main(["--input", str(tmp_path / "c.jsonl"), "--json-key", "body", "--output-prefix", str(tmp_path / "c")]) == 0
    assert documents(tmp_path / "c") == [b"from body\x00"]


def bad_json(d):
    (d / "bad.jsonl").write_text('{"text": "ok"}\n{"text": oops}\n', encoding="utf-8")
    return d / "bad.jsonl", r"bad\.jsonl:2: bad JSON"


def missing_key(d):
    (d / "nokey.jsonl").write_text('{"text": "ok"}\n{"txt": "typo"}\n', encoding="utf-8")
    return d / "nokey.jsonl", r"nokey\.jsonl:2: no key 'text'.*--json-key"


def missing_file(d):
    return d / "absent.txt", r"--input .*absent\.txt: file not found"


def binary_file(d):
    (d / "blob.txt").write_bytes(b"\xff\xfe\x00binary")
    return d / "blob.txt", r"blob\.txt: not UTF-8 text"


@pytest.mark.parametrize("make_input", [bad_json, missing_key, missing_file, binary_file])
def test_bad_input_is_one_line_exit_2_and_no_output(tmp_path, make_input):
    path, expected = make_input(tmp_path)
    result = run_prepare("--input", str(path), "--output-prefix", str(tmp_path / "out"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith("error: ")
    assert re.search(expected, lines[0])
    assert not list(tmp_path.glob("out*")) and not list(tmp_path.glob(".out*"))


def test_usage_mistake_is_one_line_exit_2(tmp_path):
    result = run_prepare("--input", str(tmp_path / "a.txt"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: the following arguments are required: --output-prefix "
        "(see `python -m trainer.data.prepare --help`)"]
