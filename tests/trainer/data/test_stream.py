"""The sample stream built from config: order, skips, tokens and text."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.config import DataConfig
from trainer.data import DataError, build_sample_stream, check_data_path
from trainer.data.corpus import CACHE_DIR_ENV, iter_corpus_documents
from trainer.data.indexed import IndexedDatasetWriter
from trainer.data.stream import decode_tokens
from trainer.plan import SkipRange

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(40))
SEQ = 16


@pytest.fixture
def dataset(tmp_path):
    prefix = tmp_path / "fox"
    with IndexedDatasetWriter(prefix, np.uint8) as writer:
        writer.add_document(np.frombuffer(TEXT.encode() + b"\x00", dtype=np.uint8))
    return DataConfig(data_path=str(prefix))


def test_tokens_are_the_window_of_the_shuffled_sample(dataset):
    stream = build_sample_stream(dataset, SEQ, seed=3)
    flat = np.frombuffer(TEXT.encode() + b"\x00", dtype=np.uint8)
    assert stream.num_samples == (flat.size - 1) // SEQ
    indices = [stream.dataset_index(p) for p in range(stream.num_samples)]
    assert sorted(indices) == list(range(stream.num_samples))
    for position in (0, 1, stream.num_samples + 2):
        k = stream.dataset_index(position)
        assert stream.tokens(position).tolist() == flat[k * SEQ:k * SEQ + SEQ + 1].tolist()
    assert stream.batch([0, 1]).shape == (2, SEQ + 1)


def test_same_positions_give_same_samples_whatever_the_call_pattern(dataset):
    skips = (SkipRange(4, 9),)
    first = build_sample_stream(dataset, SEQ, seed=5, skip_ranges=skips)
    whole, _ = first.take(0, 3 * first.num_samples)
    expected = [first.tokens(p).tolist() for p in whole]
    # A fresh stream, consumed in uneven chunks, tokens fetched newest first.
    second = build_sample_stream(dataset, SEQ, seed=5, skip_ranges=skips)
    cursor, positions = 0, []
    for size in (7, 1, 50, 3, 400):
        taken, cursor = second.take(cursor, size)
        positions += taken
    positions = positions[:len(whole)]
    assert positions == whole
    assert [second.tokens(p).tolist() for p in reversed(positions)] == expected[::-1]


def test_skipped_samples_never_appear_in_their_epoch(dataset):
    stream = build_sample_stream(dataset, SEQ, seed=9, skip_ranges=[SkipRange(10, 20), (30, 31)])
    n = stream.num_samples
    skipped = set(range(10, 20)) | {30}
    taken, cursor = stream.take(0, n - len(skipped))
    assert cursor == n and not skipped & set(taken)
    trained = {stream.dataset_index(p) for p in taken}
    assert not trained & {stream.dataset_index(p) for p in skipped}
    assert all(stream.is_skipped(p) for p in skipped)


def test_decode_returns_the_sample_text(dataset):
    stream = build_sample_stream(dataset, SEQ, seed=1)
    for position in range(5):
        k = stream.dataset_index(position)
        assert stream.decode(position) == TEXT[k * SEQ:k * SEQ + SEQ + 1]
    assert decode_tokens([104, 105, 50256, 0xC3]) == "hi<|50256|>\ufffd"


def test_default_is_the_embedded_corpus(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    config = DataConfig(data_path=None, corpus_max_bytes=100_000)
    stream = build_sample_stream(config, 64, seed=1234)
    corpus = b"".join(iter_corpus_documents(100_000)).decode("utf-8", errors="replace")
    assert stream.num_samples == (100_000 - 1) // 64
    assert stream.decode(0) in corpus and stream.max_token() < 256
    assert "embedded corpus" in stream.source


def test_check_data_path_accepts_good_data(dataset):
    check_data_path(dataset)
    check_data_path(DataConfig(data_path=None))


def junk_pair(prefix) -> str:
    prefix.with_suffix(".bin").write_bytes(b"x")
    prefix.with_suffix(".idx").write_bytes(b"y" * 40)
    return str(prefix)


@pytest.mark.parametrize("make, message", [
    (lambda d: str(d / "missing"),
     r"missing\.bin not found; write one with `runmgr prepare-data --input FILE --output-prefix .*missing`"),
    (lambda d: str(d / "fox.bin"), r"ends with \.bin: give the prefix without it, data\.data_path=.*fox$"),
    (lambda d: junk_pair(d / "junk"), r"junk\.idx is not a Megatron indexed-dataset index"),
])
def test_check_data_path_names_the_problem_and_fix(dataset, tmp_path, make, message):
    with pytest.raises(DataError, match=message):
        check_data_path(DataConfig(data_path=make(tmp_path)))


def test_corpus_size_must_be_positive():
    with pytest.raises(DataError, match="data.corpus_max_bytes must be a positive"):
        check_data_path(DataConfig(corpus_max_bytes=0))


def test_data_shorter_than_one_sample_is_refused(dataset):
    with pytest.raises(DataError, match="fewer than one sample"):
        build_sample_stream(dataset, seq_length=len(TEXT) + 5, seed=1)
