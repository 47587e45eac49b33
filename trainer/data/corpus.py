"""The embedded default corpus: the Python standard library's own source.

Every Python install carries it, so a demo trains without a download. The
recipe makes it identical on every rank and every machine with the same
Python build: the stdlib's ``.py`` files (test suites, site-packages and
build-specific files left out), sorted by relative path, each as UTF-8 bytes
followed by a NUL byte (token 0, end of document), cut at ``max_bytes``.
Tokens are bytes: vocabulary 256.

The result is cached as an indexed dataset (one document per file) under a
cache directory keyed by the Python build and ``max_bytes``; ranks then
memory-map the same pages instead of each re-reading ~700 files.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import sys
import sysconfig
import tempfile
import tokenize
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from trainer.data.errors import DataError
from trainer.data.indexed import IndexedDataset, IndexedDatasetWriter, index_path

END_OF_DOCUMENT = 0
"""Token that ends every document (the NUL byte)."""
VOCAB_SIZE = 256
"""Byte-level tokens."""
CACHE_DIR_ENV = "TRAINER_DATA_CACHE"
"""Environment variable that overrides where the corpus cache lives."""
RECIPE_VERSION = 1
"""Bump when the recipe changes so that old caches are not reused."""

# Directories that are test suites, third-party code or build-specific.
_EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})
_EXCLUDED_DIR_PREFIXES = ("config-",)  # holds python-config.py with this machine's paths
_EXCLUDED_FILE_PREFIXES = ("_sysconfigdata",)  # build flags and install paths

logger = logging.getLogger(__name__)


def stdlib_dir() -> Path:
    """Directory of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_source_files(root: Optional[Path] = None) -> list[str]:
    """Relative POSIX paths of the corpus's ``.py`` files under ``root``, sorted."""
    root = root or stdlib_dir()
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in _EXCLUDED_DIRS and not d.startswith(_EXCLUDED_DIR_PREFIXES)]
        rel_dir = Path(directory).relative_to(root)
        found += [(rel_dir / f).as_posix() for f in files
                  if f.endswith(".py") and not f.startswith(_EXCLUDED_FILE_PREFIXES)]
    return sorted(found)


def iter_corpus_documents(max_bytes: int, root: Optional[Path] = None) -> Iterator[bytes]:
    """The corpus's documents (source + NUL), the last one cut so that the
    total is ``min(max_bytes, size of all files)``. Reads only what it needs."""
    root = root or stdlib_dir()
    remaining = max_bytes
    for relative in stdlib_source_files(root):
        if remaining <= 0:
            return
        document = _source_as_utf8(root / relative) + bytes([END_OF_DOCUMENT])
        yield document[:remaining]
        remaining -= len(document)


def corpus_tokens(max_bytes: int, cache_dir: Optional[Path] = None) -> np.ndarray:
    """Every token of the corpus (uint8), memory-mapped from the cache.

    Builds the cache on first use. Safe for several processes at once: each
    writes its own temporary files and renames them into place, and the
    contents are identical whoever wins. If the cache directory cannot be
    written, the corpus is built in memory instead.
    """
    if max_bytes <= 0:
        raise DataError(f"data.corpus_max_bytes must be a positive number of bytes, got {max_bytes}")
    prefix = (cache_dir or default_cache_dir()) / cache_name(max_bytes)
    if index_path(prefix).exists():
        try:
            return IndexedDataset(prefix).tokens
        except DataError as err:  # a damaged cache is rebuilt, never trusted
            logger.warning("rebuilding the corpus cache: %s", err)
    try:
        _write_corpus(prefix, max_bytes)
    except OSError as err:
        logger.warning("corpus cache %s not writable (%s); building the corpus in memory", prefix, err)
        return np.frombuffer(b"".join(iter_corpus_documents(max_bytes)), dtype=np.uint8)
    return IndexedDataset(prefix).tokens


def default_cache_dir() -> Path:
    """``$TRAINER_DATA_CACHE``, else ``<temp dir>/trainer-data-cache``."""
    return Path(os.environ.get(CACHE_DIR_ENV) or Path(tempfile.gettempdir()) / "trainer-data-cache")


def cache_name(max_bytes: int) -> str:
    """File prefix of the cache: the Python build, recipe version and size."""
    build = hashlib.sha256(f"{sys.version}|{RECIPE_VERSION}".encode()).hexdigest()[:12]
    version = "".join(str(part) for part in sys.version_info[:3])
    return f"stdlib-{sys.implementation.name}{version}-{build}-{max_bytes}"


def _write_corpus(prefix: Path, max_bytes: int) -> None:
    with IndexedDatasetWriter(prefix, np.uint8) as writer:
        for document in iter_corpus_documents(max_bytes):
            writer.add_document(np.frombuffer(document, dtype=np.uint8))


def _source_as_utf8(path: Path) -> bytes:
    """The file as UTF-8 without NUL bytes (NUL is reserved for end of document).

    Honours a PEP 263 coding cookie, since a few sources may not be UTF-8.
    """
    raw = path.read_bytes()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
        raw = raw.decode(encoding, errors="replace").encode("utf-8")
    return raw.replace(b"\x00", b"")
