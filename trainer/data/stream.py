"""The sample stream the trainer consumes, and how to build it from config.

A :class:`SampleStream` joins the three pure parts: the token source cut into
fixed windows, the per-epoch shuffle, and the skip ranges of the resume plan.
The trainer keeps one integer, the cursor (Megatron's "consumed samples"),
checkpoints it, and asks for the next positions with :meth:`SampleStream.take`.
"""

from __future__ import annotations

import sys
from typing import Iterable, Optional, Sequence

import numpy as np

from trainer.config import DataConfig
from trainer.data.corpus import corpus_tokens
from trainer.data.errors import DataError
from trainer.data.indexed import IndexedDataset, data_path, index_path, read_index_header
from trainer.data.sampler import EpochShuffle, SkipSchedule
from trainer.data.windows import FixedWindows

_PREPARE_HINT = ("write one with `runmgr prepare-data --input FILE --output-prefix {prefix}` "
                 "(`python -m trainer.data.prepare` takes the same flags where only the trainer is installed)")


class SampleStream:
    """Training samples in a fixed order that is a pure function of
    ``(seed, position)``, with the skip ranges jumped over."""

    def __init__(self, windows: FixedWindows, order: EpochShuffle, skips: SkipSchedule, source: str) -> None:
        self._windows = windows
        self._order = order
        self._skips = skips
        self.source = source
        """Where the tokens come from, for messages and the logbook."""
        self._max_token: Optional[int] = None

    @property
    def num_samples(self) -> int:
        """Samples per epoch (fixed windows in the dataset)."""
        return self._windows.num_samples

    @property
    def seq_length(self) -> int:
        return self._windows.seq_length

    @property
    def skip_ranges(self) -> tuple[tuple[int, int], ...]:
        """The merged ``(start, end)`` stream ranges never returned by take()."""
        return self._skips.ranges

    def take(self, cursor: int, count: int) -> tuple[list[int], int]:
        """The next ``count`` positions at or after ``cursor`` not in a skip
        range, and the new cursor (one past the last position taken)."""
        return self._skips.take(cursor, count)

    def is_skipped(self, position: int) -> bool:
        return self._skips.is_skipped(position)

    def dataset_index(self, position: int) -> int:
        """The dataset sample (window) trained on at stream ``position``."""
        return self._order.dataset_index(position)

    def tokens(self, position: int) -> np.ndarray:
        """The ``seq_length + 1`` tokens (int64) of the sample at ``position``."""
        return self._windows.window(self.dataset_index(position))

    def batch(self, positions: Sequence[int]) -> np.ndarray:
        """Tokens of several positions stacked: shape ``(len(positions), seq_length + 1)``."""
        if not positions:
            return np.zeros((0, self.seq_length + 1), dtype=np.int64)
        return np.stack([self.tokens(position) for position in positions])

    def decode(self, position: int) -> str:
        """The sample's text: bytes decoded as UTF-8 with errors replaced.

        Tokens above 255 (a dataset from another tokenizer) show as ``<|N|>``.
        """
        return decode_tokens(self.tokens(position))

    def all_tokens(self) -> np.ndarray:
        """Every token of the source in dataset order (memory-mapped: slicing reads only that part)."""
        return self._windows.tokens

    def max_token(self) -> int:
        """Largest token id in the data (scans it once; cached), so that the
        trainer can check model.vocab_size against it."""
        if self._max_token is None:
            tokens = self._windows.tokens
            self._max_token = int(tokens.max()) if tokens.size else 0
        return self._max_token


def decode_tokens(tokens: Iterable[int]) -> str:
    """Byte-level tokens as text (UTF-8, errors replaced)."""
    values = np.asarray(tokens, dtype=np.int64)
    if values.size == 0 or (values.min() >= 0 and values.max() < 256):
        return values.astype(np.uint8).tobytes().decode("utf-8", errors="replace")
    parts, run = [], bytearray()
    for value in values.tolist():
        if 0 <= value < 256:
            run.append(value)
            continue
        parts.append(run.decode("utf-8", errors="replace"))
        parts.append(f"<|{value}|>")
        run = bytearray()
    parts.append(run.decode("utf-8", errors="replace"))
    return "".join(parts)


def build_sample_stream(data_cfg: DataConfig, seq_length: int, seed: int, skip_ranges=()) -> SampleStream:
    """The stream of ``data_cfg``: the indexed dataset at ``data_path``, or the
    embedded corpus when it is None. Raises :class:`DataError` on bad data."""
    check_data_path(data_cfg)
    if data_cfg.data_path is None:
        tokens = corpus_tokens(data_cfg.corpus_max_bytes)
        version = ".".join(str(part) for part in sys.version_info[:3])
        source = f"the embedded corpus ({tokens.size} bytes of the Python {version} standard library)"
    else:
        tokens = IndexedDataset(data_cfg.data_path).tokens
        source = f"data.data_path {data_cfg.data_path}"
    windows = FixedWindows(tokens, seq_length, source)
    return SampleStream(windows, EpochShuffle(windows.num_samples, seed), SkipSchedule(skip_ranges), source)


def check_data_path(data_cfg: DataConfig) -> None:
    """Cheap check that the configured data exists and looks right (files and
    index header only); raises :class:`DataError` with a one-line fix."""
    if data_cfg.data_path is None:
        if data_cfg.corpus_max_bytes <= 0:
            raise DataError(f"data.corpus_max_bytes must be a positive number of bytes, got {data_cfg.corpus_max_bytes}")
        return
    prefix = str(data_cfg.data_path)
    for suffix in (".bin", ".idx"):
        if prefix.endswith(suffix):
            raise DataError(f"data.data_path {prefix} ends with {suffix}: give the prefix without it, "
                            f"data.data_path={prefix[:-len(suffix)]}")
    for path in (data_path(prefix), index_path(prefix)):
        if not path.is_file():
            raise DataError(f"data.data_path: {path} not found; {_PREPARE_HINT.format(prefix=prefix)}")
    read_index_header(index_path(prefix))
