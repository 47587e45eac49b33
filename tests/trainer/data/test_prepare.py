"""The prepare CLI: text and JSONL in, indexed dataset out, bad input exit 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests import cli
from trainer.data.indexed import IndexedDataset
from trainer.data.prepare import main


def run_prepare(*args: str) -> subprocess.CompletedProcess:
    """``python -m trainer.data.prepare ARGS`` as a process of its own (exit code, stderr, no output
    left behind), forked from the session's CLI fork server (tests/cli.py), which imported it once.
    The command as a user types it is the README's (tests/test_readme.py)."""
    return cli.runmgr(*args, module="trainer.data.prepare", timeout=60)


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


# ---- a Hugging Face tokenizer, built here (no download) ------------------------------------------

CORPUS = ["the cat sat on the mat", "the dog sat on the log", "a cat and a dog"]


def save_word_tokenizer(directory, eos_in_config: bool = True):
    """A tiny WordLevel tokenizer trained on CORPUS, saved as save_pretrained would."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=["<unk>", "<end>"]))
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    if eos_in_config:
        (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<end>"}}))
    return tokenizer


def test_a_hugging_face_tokenizer_gives_its_ids_and_eos_and_the_vocab_size(tmp_path):
    tokenizer = save_word_tokenizer(tmp_path / "tok")
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in CORPUS[:2]) + "\n")
    result = cli.runmgr("prepare-data", "--input", str(tmp_path / "docs.jsonl"), "--output-prefix",
                        str(tmp_path / "ds"), "--tokenizer", str(tmp_path / "tok"), timeout=60)
    assert result.returncode == 0, result.stderr
    dataset = IndexedDataset(tmp_path / "ds")
    assert dataset.dtype.name == "uint16"  # Megatron's choice below 65500 tokens of vocabulary
    end = tokenizer.token_to_id("<end>")
    for index, text in enumerate(CORPUS[:2]):
        assert dataset.get(index).tolist() == tokenizer.encode(text).ids + [end]
    vocab = tokenizer.get_vocab_size()
    assert f"vocabulary {vocab}: train with data.data_path={tmp_path / 'ds'} model.vocab_size={vocab}" in result.stdout


def test_the_tokenizer_file_itself_and_an_explicit_eod_token(tmp_path):
    tokenizer = save_word_tokenizer(tmp_path / "tok", eos_in_config=False)
    (tmp_path / "a.txt").write_text("the cat", encoding="utf-8")
    args = ["--input", str(tmp_path / "a.txt"), "--output-prefix", str(tmp_path / "ds"),
            "--tokenizer", str(tmp_path / "tok" / "tokenizer.json")]
    result = run_prepare(*args)
    assert result.returncode == 2 and "pass --eod-token TOKEN" in result.stderr
    assert not list(tmp_path.glob("ds*"))
    assert main([*args, "--eod-token", "<end>"]) == 0
    assert documents(tmp_path / "ds") == [
        np.asarray(tokenizer.encode("the cat").ids + [tokenizer.token_to_id("<end>")], np.uint16).tobytes()]


def test_a_model_name_is_read_from_the_local_hugging_face_cache(tmp_path, monkeypatch):
    snapshot = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "abc123"
    tokenizer = save_word_tokenizer(snapshot)
    (tmp_path / "hub" / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny" / "refs" / "main").write_text("abc123")
    (tmp_path / "a.txt").write_text("a dog", encoding="utf-8")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["--input", str(tmp_path / "a.txt"), "--output-prefix", str(tmp_path / "ds"),
                 "--tokenizer", "acme/tiny"]) == 0
    assert IndexedDataset(tmp_path / "ds").get(0).tolist() == tokenizer.encode("a dog").ids + [
        tokenizer.token_to_id("<end>")]


def test_a_name_that_is_neither_a_path_nor_cached_is_one_line_and_nothing_is_fetched(tmp_path):
    (tmp_path / "a.txt").write_text("x", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "runmgr", "prepare-data", "--input", str(tmp_path / "a.txt"),
         "--output-prefix", str(tmp_path / "ds"), "--tokenizer", "gpt2"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "HF_HUB_CACHE": str(tmp_path / "empty")})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr
    assert "--tokenizer gpt2: not a file, a directory, or a model in the Hugging Face cache" in lines[0]
    assert "nothing is downloaded here" in lines[0] and "save_pretrained(DIR)" in lines[0]
    assert not list(tmp_path.glob("ds*"))
