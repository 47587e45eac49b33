"""Megatron indexed datasets: our writer and reader against the format itself."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from trainer.data import DataError
from trainer.data.indexed import IndexedDataset, IndexedDatasetWriter

MAGIC = b"MMIDIDX\x00\x00"


def megatron_idx_bytes(lengths, document_index, dtype_code, itemsize) -> bytes:
    """An .idx built field by field from the format's description, independent
    of trainer.data.indexed (header count field = document-index entries)."""
    out = MAGIC + struct.pack("<Q", 1) + struct.pack("<B", dtype_code)
    out += struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(document_index))
    out += b"".join(struct.pack("<i", n) for n in lengths)
    pointer = 0
    for n in lengths:
        out += struct.pack("<q", pointer)
        pointer += n * itemsize
    out += b"".join(struct.pack("<q", d) for d in document_index)
    return out


def write_pair(prefix, idx: bytes, tokens: list[int], fmt: str) -> None:
    (prefix.parent / f"{prefix.name}.idx").write_bytes(idx)
    (prefix.parent / f"{prefix.name}.bin").write_bytes(b"".join(struct.pack(fmt, t) for t in tokens))


def test_writer_round_trip(tmp_path):
    docs = [[5, 6, 7, 0], [], [65535, 1, 0]]
    with IndexedDatasetWriter(tmp_path / "ds", np.uint16) as writer:
        for doc in docs:
            writer.add_document(doc)
    ds = IndexedDataset(tmp_path / "ds")
    assert len(ds) == ds.num_documents == 3
    assert ds.dtype == np.uint16
    assert ds.sizes.tolist() == [4, 0, 3]
    assert [ds.get(i).tolist() for i in range(3)] == docs
    assert ds.total_tokens == 7
    assert ds.tokens.tolist() == [5, 6, 7, 0, 65535, 1, 0]


def test_writer_output_is_byte_identical_to_the_format(tmp_path):
    with IndexedDatasetWriter(tmp_path / "ds", np.uint8) as writer:
        writer.add_document(b"ab\x00")
        writer.add_document(b"cde\x00")
    expected = megatron_idx_bytes([3, 4], [0, 1, 2], dtype_code=1, itemsize=1)
    assert (tmp_path / "ds.idx").read_bytes() == expected
    assert (tmp_path / "ds.bin").read_bytes() == b"ab\x00cde\x00"


def test_reads_a_megatron_pair_built_byte_by_byte(tmp_path):
    # Two documents; the first was split into two sentences (preprocess_data
    # --split-sentences), so it spans sequences 0 and 1. int32 tokens (code 4).
    lengths, document_index = [2, 3, 1], [0, 2, 3]
    tokens = [100000, 7, 8, 9, 50256, 42]
    write_pair(tmp_path / "mega", megatron_idx_bytes(lengths, document_index, 4, 4), tokens, "<i")
    ds = IndexedDataset(tmp_path / "mega")
    assert ds.dtype == np.int32
    assert len(ds) == 3 and ds.num_documents == 2
    assert ds.get(1).tolist() == [8, 9, 50256]
    assert ds.get_document(0).tolist() == [100000, 7, 8, 9, 50256]
    assert ds.get_document(1).tolist() == [42]
    assert ds.pointers.tolist() == [0, 8, 20]
    assert ds.tokens.tolist() == tokens


def test_reads_an_empty_megatron_dataset(tmp_path):
    write_pair(tmp_path / "empty", megatron_idx_bytes([], [0], 8, 2), [], "<H")
    ds = IndexedDataset(tmp_path / "empty")
    assert len(ds) == ds.num_documents == ds.total_tokens == 0


def good_idx() -> bytes:
    return megatron_idx_bytes([2, 2], [0, 1, 2], 1, 1)


@pytest.mark.parametrize("damage, words", [
    (lambda b: b"GPT2IDX\x00\x00" + b[9:], "magic"),
    (lambda b: b[:20], "magic or too short"),
    (lambda b: b"TNTIDX\x00\x00" + b[8:], "legacy lazy/cached index"),
    (lambda b: b[:9] + struct.pack("<Q", 2) + b[17:], "version 2"),
    (lambda b: b[:17] + bytes([9]) + b[18:], "dtype code 9"),
    (lambda b: b[:-8], "truncated"),
    (lambda b: b[:-8] + struct.pack("<q", 5), "document index"),
    (lambda b: b[:34] + struct.pack("<ii", 2, -2) + b[42:], "negative"),
])
def test_rejects_a_corrupt_idx_naming_file_and_problem(tmp_path, damage, words):
    write_pair(tmp_path / "bad", damage(good_idx()), [1, 2, 3, 4], "<B")
    with pytest.raises(DataError) as caught:
        IndexedDataset(tmp_path / "bad")
    message = str(caught.value)
    assert str(tmp_path / "bad.idx") in message and words in message and "\n" not in message


def test_rejects_a_bin_that_does_not_match_its_idx(tmp_path):
    write_pair(tmp_path / "short", good_idx(), [1, 2, 3], "<B")
    with pytest.raises(DataError, match=r"short\.bin holds 3 bytes but .* describes 4"):
        IndexedDataset(tmp_path / "short")


def test_missing_files_name_the_fix(tmp_path):
    with pytest.raises(DataError, match=r"nothing\.idx not found; .*`runmgr prepare-data --input FILE --output-prefix"):
        IndexedDataset(tmp_path / "nothing")


def test_failed_write_leaves_nothing_behind(tmp_path):
    with pytest.raises(ValueError, match="do not fit dtype uint8"):
        with IndexedDatasetWriter(tmp_path / "ds", np.uint8) as writer:
            writer.add_document([1, 2])
            writer.add_document([1, 300])
    assert list(tmp_path.iterdir()) == []


def test_rewrite_replaces_the_dataset_whole(tmp_path):
    for tokens in ([1, 2, 3], [9] * 10):
        with IndexedDatasetWriter(tmp_path / "ds", np.uint8) as writer:
            writer.add_document(tokens)
    assert IndexedDataset(tmp_path / "ds").tokens.tolist() == [9] * 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.bin", "ds.idx"]
