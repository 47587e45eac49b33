"""Megatron indexed datasets (the ``mmap`` format): ``PREFIX.idx`` + ``PREFIX.bin``.

Byte-compatible with what Megatron-LM's and MindSpeed-LLM's
``tools/preprocess_data.py`` write, so their datasets train here and ours there.

``PREFIX.idx``, little-endian::

    9 bytes   magic b"MMIDIDX\\x00\\x00"
    uint64    version, always 1
    uint8     dtype code of the tokens (see DTYPE_CODES)
    uint64    S, number of sequences
    uint64    D, number of entries of the document index (documents + 1)
    int32[S]  sequence lengths, in tokens
    int64[S]  sequence pointers, byte offsets into PREFIX.bin
    int64[D]  document index: document d is sequences [idx[d], idx[d+1]);
              starts at 0, ends at S
    (int8[S]  sequence modes, multimodal datasets only; ignored here)

``PREFIX.bin`` holds the tokens of all sequences back to back.
"""

from __future__ import annotations

import os
import secrets
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Union

import numpy as np

from trainer.data.errors import DataError

INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
LEGACY_MAGIC = b"TNTIDX\x00\x00"  # the old lazy/cached format, which we do not read
HEADER_BYTES = len(INDEX_MAGIC) + 8 + 1 + 8 + 8  # 34
DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float64),
    7: np.dtype(np.float32),
    8: np.dtype(np.uint16),
}
CODE_OF_DTYPE = {dtype: code for code, dtype in DTYPE_CODES.items()}
PathLike = Union[str, os.PathLike]


def index_path(prefix: PathLike) -> Path:
    return Path(f"{os.fspath(prefix)}.idx")


def data_path(prefix: PathLike) -> Path:
    return Path(f"{os.fspath(prefix)}.bin")


def dtype_code(dtype) -> int:
    """Megatron's numeric code of a numpy dtype (ValueError if it has none)."""
    try:
        return CODE_OF_DTYPE[np.dtype(dtype)]
    except (KeyError, TypeError) as err:
        names = ", ".join(d.name for d in DTYPE_CODES.values())
        raise ValueError(f"dtype {dtype!r} has no Megatron code; use one of {names}") from err


class IndexedDatasetWriter:
    """Writes ``PREFIX.bin`` / ``PREFIX.idx``, one sequence per document.

    Tokens stream to a temporary file next to the target; :meth:`finalize`
    renames ``.bin`` first and ``.idx`` last, so a reader that finds the
    ``.idx`` finds a complete dataset, a crash leaves no half-written one, and
    two processes writing the same dataset at once both leave a valid one.
    Use as a context manager to finalize on success and clean up on error.
    """

    def __init__(self, prefix: PathLike, dtype=np.uint8) -> None:
        self.prefix = Path(prefix)
        self.dtype = np.dtype(dtype)
        self._code = dtype_code(self.dtype)
        self._lengths: list[int] = []
        self.prefix.parent.mkdir(parents=True, exist_ok=True)
        self._bin_tmp = _temp_file_next_to(data_path(self.prefix))
        self._bin_file = open(self._bin_tmp, "wb")
        self._finished = False

    def add_document(self, tokens: Iterable[int]) -> None:
        """Append one document (a single sequence) of integer tokens."""
        if self._finished:
            raise RuntimeError(f"writer of {self.prefix} is already finalized")
        array = _as_token_array(tokens, self.dtype)
        self._bin_file.write(array.tobytes(order="C"))
        self._lengths.append(int(array.size))

    @property
    def num_documents(self) -> int:
        return len(self._lengths)

    @property
    def total_tokens(self) -> int:
        return sum(self._lengths)

    def finalize(self) -> tuple[Path, Path]:
        """Make the dataset visible under its final names; returns (bin, idx)."""
        if self._finished:
            raise RuntimeError(f"writer of {self.prefix} is already finalized")
        self._finished = True
        _close_durably(self._bin_file)
        idx_tmp = _temp_file_next_to(index_path(self.prefix))
        try:
            with open(idx_tmp, "wb") as stream:
                stream.write(encode_index(self._lengths, range(len(self._lengths) + 1), self.dtype))
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(self._bin_tmp, data_path(self.prefix))
            os.replace(idx_tmp, index_path(self.prefix))
        except BaseException:
            _unlink_quietly(idx_tmp)
            _unlink_quietly(self._bin_tmp)
            raise
        _fsync_directory(self.prefix.parent)
        return data_path(self.prefix), index_path(self.prefix)

    def abort(self) -> None:
        """Drop everything written so far; the final names are left untouched."""
        if not self._finished:
            self._finished = True
            self._bin_file.close()
            _unlink_quietly(self._bin_tmp)

    def __enter__(self) -> "IndexedDatasetWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finalize()
        else:
            self.abort()


def encode_index(lengths: Iterable[int], document_index: Iterable[int], dtype) -> bytes:
    """The bytes of a ``.idx`` file for sequences of ``lengths`` tokens."""
    lengths_arr = np.asarray(list(lengths), dtype=np.int32)
    doc_arr = np.asarray(list(document_index), dtype=np.int64)
    item = np.dtype(dtype).itemsize
    pointers = np.zeros(lengths_arr.size, dtype=np.int64)
    np.cumsum(lengths_arr[:-1].astype(np.int64) * item, out=pointers[1:])
    header = INDEX_MAGIC + struct.pack("<QBQQ", INDEX_VERSION, dtype_code(dtype), lengths_arr.size, doc_arr.size)
    return header + lengths_arr.tobytes() + pointers.tobytes() + doc_arr.tobytes()


class IndexedDataset:
    """Read-only, memory-mapped view of a Megatron indexed dataset.

    ``len()`` is the number of sequences (as in Megatron; with one sequence
    per document, also the number of documents). The ``.idx`` is validated on
    open; anything inconsistent raises :class:`DataError` naming the file.
    """

    def __init__(self, prefix: PathLike) -> None:
        self.prefix = Path(prefix)
        idx_file, bin_file = index_path(prefix), data_path(prefix)
        for path in (idx_file, bin_file):
            if not path.is_file():
                raise DataError(f"{path} not found; write the dataset with "
                                f"`runmgr prepare-data --input FILE --output-prefix {prefix}`")
        header = read_index_header(idx_file)
        self.dtype: np.dtype = header.dtype
        raw = np.memmap(idx_file, dtype=np.uint8, mode="r")  # shared pages, not a copy per rank
        offset = HEADER_BYTES
        self.sizes = np.frombuffer(raw, np.int32, header.sequence_count, offset)
        offset += self.sizes.nbytes
        self.pointers = np.frombuffer(raw, np.int64, header.sequence_count, offset)
        offset += self.pointers.nbytes
        self.document_indices = np.frombuffer(raw, np.int64, header.document_entries, offset)
        _check_index_arrays(idx_file, self.sizes, self.pointers, self.document_indices, self.dtype.itemsize)
        self.total_tokens = int(self.sizes.sum(dtype=np.int64))
        expected_bytes = self.total_tokens * self.dtype.itemsize
        actual_bytes = bin_file.stat().st_size
        if actual_bytes != expected_bytes:
            raise DataError(f"{bin_file} holds {actual_bytes} bytes but {idx_file} describes {expected_bytes}: "
                            "the pair is truncated or mismatched; rewrite it with trainer.data.prepare")
        # An empty file cannot be memory-mapped; an empty array behaves the same.
        self.tokens: np.ndarray = (np.memmap(bin_file, dtype=self.dtype, mode="r") if self.total_tokens
                                   else np.zeros(0, dtype=self.dtype))
        """Every token of the dataset, back to back, memory-mapped."""

    def __len__(self) -> int:
        return int(self.sizes.size)

    @property
    def num_documents(self) -> int:
        return int(self.document_indices.size - 1)

    def get(self, index: int) -> np.ndarray:
        """Tokens of sequence ``index`` (a read-only view)."""
        start = int(self.pointers[index]) // self.dtype.itemsize
        return self.tokens[start:start + int(self.sizes[index])]

    def get_document(self, document: int) -> np.ndarray:
        """Tokens of every sequence of ``document``, concatenated."""
        first, last = int(self.document_indices[document]), int(self.document_indices[document + 1])
        if first == last:
            return self.tokens[0:0]
        start = int(self.pointers[first]) // self.dtype.itemsize
        end = int(self.pointers[last - 1]) // self.dtype.itemsize + int(self.sizes[last - 1])
        return self.tokens[start:end]


@dataclass(frozen=True)
class IndexHeader:
    """The fixed-size start of a ``.idx`` file."""

    dtype: np.dtype
    """Type of the tokens in ``.bin``."""
    sequence_count: int
    """Number of sequences."""
    document_entries: int
    """Entries of the document index: number of documents + 1."""


def read_index_header(idx_file: PathLike) -> IndexHeader:
    """Read and check the header of ``idx_file`` (cheap: a few bytes and a stat)."""
    idx_file = Path(idx_file)
    with open(idx_file, "rb") as stream:
        head = stream.read(HEADER_BYTES)
    if head.startswith(LEGACY_MAGIC):
        raise DataError(f"{idx_file} is Megatron's legacy lazy/cached index, not the mmap format; "
                        "re-run preprocess_data.py with --dataset-impl mmap")
    if len(head) < HEADER_BYTES or head[:len(INDEX_MAGIC)] != INDEX_MAGIC:
        raise DataError(f"{idx_file} is not a Megatron indexed-dataset index (bad magic or too short); "
                        "rewrite it with `python -m trainer.data.prepare` or Megatron's preprocess_data.py")
    version, code, sequences, documents = struct.unpack("<QBQQ", head[len(INDEX_MAGIC):])
    if version != INDEX_VERSION:
        raise DataError(f"{idx_file} has index version {version}, only version 1 is supported; "
                        "rewrite it with trainer.data.prepare")
    if code not in DTYPE_CODES:
        raise DataError(f"{idx_file} has unknown dtype code {code} (known: 1-8); the file is corrupt, rewrite it")
    size = idx_file.stat().st_size
    body = HEADER_BYTES + sequences * (4 + 8) + documents * 8
    # Multimodal datasets append one int8 mode per sequence.
    if documents < 1 or size not in (body, body + sequences):
        raise DataError(f"{idx_file} is {size} bytes but its header ({sequences} sequences, "
                        f"{documents} document-index entries) needs {body}: the file is truncated or corrupt, rewrite it")
    return IndexHeader(DTYPE_CODES[code], sequences, documents)


def _check_index_arrays(idx_file: Path, sizes: np.ndarray, pointers: np.ndarray,
                        documents: np.ndarray, itemsize: int) -> None:
    if sizes.size and int(sizes.min()) < 0:
        raise DataError(f"{idx_file} has a negative sequence length: the file is corrupt, rewrite it")
    if documents[0] != 0 or documents[-1] != sizes.size or np.any(np.diff(documents) < 0):
        raise DataError(f"{idx_file} has a document index that does not run from 0 to {sizes.size} in order: "
                        "the file is corrupt, rewrite it")
    expected = np.zeros(sizes.size, dtype=np.int64)
    np.cumsum(sizes[:-1].astype(np.int64) * itemsize, out=expected[1:])
    if not np.array_equal(pointers, expected):
        raise DataError(f"{idx_file} has sequence pointers that do not match its lengths "
                        "(tokens are not back to back): the file is corrupt, rewrite it")


def _as_token_array(tokens: Iterable[int], dtype: np.dtype) -> np.ndarray:
    array = np.asarray(tokens if isinstance(tokens, np.ndarray) else list(tokens))
    if array.ndim != 1:
        raise ValueError(f"a document must be a 1-D sequence of tokens, got shape {array.shape}")
    if array.size and np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        low, high = array.min(), array.max()
        if low < info.min or high > info.max:
            raise ValueError(f"token values {low}..{high} do not fit dtype {dtype.name}; use a wider dtype")
    return array.astype(dtype, copy=False)


def _temp_file_next_to(target: Path) -> Path:
    # Unique per writer so that concurrent writers never share a temp file;
    # os.open with 0o666 (not mkstemp's 0o600) so the result honours the umask.
    path = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    return path


def _close_durably(stream) -> None:
    stream.flush()
    os.fsync(stream.fileno())
    stream.close()


def _fsync_directory(directory: Path) -> None:
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def _unlink_quietly(path: Optional[Path]) -> None:
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
