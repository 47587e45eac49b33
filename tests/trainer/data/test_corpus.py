"""The embedded corpus: same bytes in every process, cache safe under races."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np

from trainer.data.corpus import (
    cache_name, corpus_tokens, iter_corpus_documents, stdlib_dir, stdlib_source_files,
)
from trainer.data.indexed import IndexedDataset

SMALL = 300_000

# Run in a fresh interpreter: build (or read) the corpus in CACHE_DIR, print its hash.
HASH_SCRIPT = """
import hashlib, sys
from pathlib import Path
from trainer.data.corpus import corpus_tokens
tokens = corpus_tokens(int(sys.argv[2]), Path(sys.argv[1]))
print(hashlib.sha256(tokens.tobytes()).hexdigest())
"""

# Rebuild the cache repeatedly while another process does the same, reading it
# back after each build; every read must see a complete, identical corpus.
RACE_SCRIPT = """
import hashlib, sys
from pathlib import Path
from trainer.data.corpus import _write_corpus, cache_name
from trainer.data.indexed import IndexedDataset
prefix = Path(sys.argv[1]) / cache_name(int(sys.argv[2]))
seen = set()
for _ in range(8):
    _write_corpus(prefix, int(sys.argv[2]))
    seen.add(hashlib.sha256(IndexedDataset(prefix).tokens.tobytes()).hexdigest())
print(" ".join(sorted(seen)))
"""


def run_all(scripts: list[list[str]]) -> list[str]:
    procs = [subprocess.Popen([sys.executable, "-c", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for args in scripts]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        outs.append(out.strip())
    return outs


def expected_hash(max_bytes: int) -> str:
    return hashlib.sha256(b"".join(iter_corpus_documents(max_bytes))).hexdigest()


def test_corpus_is_identical_across_processes_and_cache_races(tmp_path):
    alone_a, alone_b, racer_a, racer_b = run_all([
        [HASH_SCRIPT, str(tmp_path / "a"), str(SMALL)],
        [HASH_SCRIPT, str(tmp_path / "b"), str(SMALL)],
        [RACE_SCRIPT, str(tmp_path / "shared"), str(SMALL)],
        [RACE_SCRIPT, str(tmp_path / "shared"), str(SMALL)],
    ])
    assert alone_a == alone_b == racer_a == racer_b == expected_hash(SMALL)
    assert sorted(p.name for p in (tmp_path / "shared").iterdir()) == [
        f"{cache_name(SMALL)}.bin", f"{cache_name(SMALL)}.idx"]


def test_corpus_is_stdlib_source_cut_at_max_bytes_with_nul_separators(tmp_path):
    tokens = corpus_tokens(SMALL, tmp_path)
    assert tokens.dtype == np.uint8 and tokens.size == SMALL
    files = stdlib_source_files()
    documents = bytes(tokens).split(b"\x00")
    assert len(documents) >= 3
    # Every complete document is a whole stdlib file, in sorted-path order.
    for relative, document in zip(files, documents[:-1]):
        assert document == (stdlib_dir() / relative).read_bytes()
    assert (stdlib_dir() / files[len(documents) - 1]).read_bytes().startswith(documents[-1])


def test_source_files_leave_out_tests_and_third_party_code():
    files = stdlib_source_files()
    assert files == sorted(files) and "os.py" in files and "json/decoder.py" in files
    parts = {part for path in files for part in Path(path).parts[:-1]}
    assert not parts & {"test", "tests", "idle_test", "site-packages", "__pycache__"}
    assert not any(Path(path).name.startswith("_sysconfigdata") for path in files)


def test_damaged_cache_is_rebuilt_not_trusted(tmp_path):
    corpus_tokens(SMALL, tmp_path)
    idx = tmp_path / f"{cache_name(SMALL)}.idx"
    idx.write_bytes(idx.read_bytes()[:-16])
    tokens = corpus_tokens(SMALL, tmp_path)
    assert hashlib.sha256(tokens.tobytes()).hexdigest() == expected_hash(SMALL)
    assert len(IndexedDataset(tmp_path / cache_name(SMALL))) >= 1
