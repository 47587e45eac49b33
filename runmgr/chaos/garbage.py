"""Windows of garbage in the training data, written before launch.

OPT's early data held stray escape characters; a window of such bytes, fed
to a model that has learned real text, makes its loss jump and stay up while
the window lasts. This module writes a copy of the run's dataset (the
indexed dataset at ``data.data_path``, or the embedded corpus) as a Megatron
indexed dataset in which the samples the run trains on at given stream
positions are garbage. The data order is a pure function of (seed, stream
position), so the positions map to dataset samples exactly
(:meth:`trainer.data.SampleStream.dataset_index`); every other sample is
byte for byte the original, and the run keeps its order, length and epochs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

import numpy as np

from trainer.config import DataConfig
from trainer.data import build_sample_stream
from trainer.data.corpus import cache_name, corpus_tokens, default_cache_dir
from trainer.data.indexed import IndexedDataset, IndexedDatasetWriter, index_path

RECIPE_VERSION = 1
"""Bump when the garbage recipe changes, so an old copy is not reused."""
ESCAPES = (b"\x1b[0m", b"\x1b[31m", b"\\x1b", b"\\u001b", b"\\u0000", b"\r\r\n", b"&#27;", b"\\\\\\\\", b"\x7f\x08")
"""Stray escape sequences mixed into the random bytes (byte-level vocabularies)."""


@dataclass(frozen=True)
class SampleWindow:
    """Stream positions ``[start, end)`` that hold garbage."""

    start: int
    end: int

    @classmethod
    def of_steps(cls, at_step: int, steps: int, global_batch_size: int) -> "SampleWindow":
        """The positions steps ``at_step .. at_step + steps - 1`` train on in an uninterrupted run."""
        start = (at_step - 1) * global_batch_size
        return cls(start, start + steps * global_batch_size)

    def overlaps(self, start: int, end: int) -> bool:
        return start < self.end and self.start < end


def mapped_samples(data: DataConfig, seq_length: int, seed: int, windows: Iterable[SampleWindow]) -> np.ndarray:
    """The dataset samples (sorted, unique) trained on at the windows' stream positions."""
    stream = build_sample_stream(data, seq_length, seed)
    indices = [stream.dataset_index(p) for w in windows for p in range(w.start, w.end)]
    return np.unique(np.asarray(indices, dtype=np.int64))


def garbage_tokens(count: int, vocab_size: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` tokens of noise: random bytes with stray escape sequences
    (byte-level vocabularies), or uniformly random token ids otherwise."""
    if vocab_size != 256:
        return rng.integers(1, vocab_size, size=count, dtype=np.int64)
    out = rng.integers(1, 256, size=count, dtype=np.int64)
    position = 0
    while position < count:
        escape = np.frombuffer(ESCAPES[int(rng.integers(len(ESCAPES)))], dtype=np.uint8)
        take = min(escape.size, count - position)
        out[position:position + take] = escape[:take]
        position += take + int(rng.integers(4, 24))  # random bytes between the escapes
    return out


def corrupt(tokens: np.ndarray, samples: np.ndarray, seq_length: int, vocab_size: int,
            rng: np.random.Generator) -> np.ndarray:
    """A copy of ``tokens`` whose samples ``samples`` are garbage. Only a sample's
    inner tokens change: its first and last are shared with the neighbouring
    samples (fixed windows overlap by one token), which must stay intact."""
    out = np.array(tokens, copy=True)
    top = np.iinfo(out.dtype).max if out.dtype.kind in "ui" else vocab_size - 1
    for sample in samples.tolist():
        start = sample * seq_length + 1
        noise = garbage_tokens(seq_length - 1, vocab_size, rng)
        out[start:start + seq_length - 1] = np.minimum(noise, top).astype(out.dtype)
    return out


def source_dataset(data: DataConfig) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """Every token of the run's data and its sequence lengths (None: one sequence)."""
    if data.data_path is not None:
        dataset = IndexedDataset(data.data_path)
        return dataset.tokens, dataset.sizes
    tokens = corpus_tokens(data.corpus_max_bytes)
    cache = default_cache_dir() / cache_name(data.corpus_max_bytes)
    if index_path(cache).exists():
        dataset = IndexedDataset(cache)
        if dataset.total_tokens == tokens.size:
            return dataset.tokens, dataset.sizes
    return tokens, None  # the corpus was built in memory: one sequence holds it all


def copy_name(data: DataConfig, seq_length: int, seed: int, vocab_size: int, windows: list[SampleWindow],
              chaos_seed: int) -> str:
    """A name that changes whenever the copy's content would: a relaunch reuses the copy."""
    source = (str(Path(data.data_path).resolve()) if data.data_path is not None
              else f"corpus:{cache_name(data.corpus_max_bytes)}")
    key = json.dumps({"source": source, "seq_length": seq_length, "seed": seed, "vocab_size": vocab_size,
                      "windows": [[w.start, w.end] for w in windows], "chaos_seed": chaos_seed,
                      "recipe": RECIPE_VERSION}, sort_keys=True)
    return "garbage-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def write_garbage_copy(data: DataConfig, seq_length: int, seed: int, vocab_size: int,
                       windows: list[SampleWindow], chaos_seed: int, out_dir: Path) -> Path:
    """Write (once) the copy of the run's dataset with garbage at ``windows``;
    returns its prefix, for ``data.data_path``."""
    prefix = Path(out_dir).resolve() / copy_name(data, seq_length, seed, vocab_size, windows, chaos_seed)
    if index_path(prefix).exists():
        return prefix  # written by an earlier launch of this lineage; the writer renames .idx last
    tokens, sizes = source_dataset(data)
    samples = mapped_samples(data, seq_length, seed, windows)
    broken = corrupt(tokens, samples, seq_length, vocab_size, np.random.default_rng([chaos_seed, RECIPE_VERSION]))
    lengths = sizes.tolist() if sizes is not None else [int(broken.size)]
    with IndexedDatasetWriter(prefix, broken.dtype) as writer:
        offset = 0
        for length in lengths:
            writer.add_document(broken[offset:offset + length])
            offset += length
    return prefix
