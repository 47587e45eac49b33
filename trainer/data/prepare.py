"""Turn text or JSONL files into a Megatron indexed dataset.

    runmgr prepare-data --input FILE [--input FILE ...] --output-prefix PREFIX \\
        [--json-key text] [--split-paragraphs] [--tokenizer PATH_OR_NAME [--eod-token TOKEN]]

(``python -m trainer.data.prepare`` takes the same options.) Text files give
one document per file (or per blank-line-separated paragraph with
``--split-paragraphs``); ``.jsonl`` / ``.json`` files give one document per
line, the string under ``--json-key``.

Tokens: without ``--tokenizer``, the document's UTF-8 bytes followed by a NUL
byte (end of document), stored as uint8 (vocabulary 256). With a Hugging Face
tokenizer (a ``tokenizer.json``, a directory holding one, or a model name in
the local Hugging Face cache; see trainer/data/tokenizer.py), its token ids
followed by its end-of-document token, stored as uint16 below 65500 tokens
of vocabulary and int32 above, as Megatron's ``preprocess_data.py`` does.
Megatron-LM and MindSpeed-LLM read the result as is. The summary line gives
the vocabulary size, which ``model.vocab_size`` must reach. Bad input prints
one line on stderr and exits with code 2, writing nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np

from trainer.data.corpus import END_OF_DOCUMENT
from trainer.data.errors import DataError
from trainer.data.indexed import IndexedDatasetWriter
from trainer.data.tokenizer import TextTokenizer, load_tokenizer

JSONL_SUFFIXES = (".jsonl", ".json")
BYTE_VOCAB_SIZE = 256
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


@dataclass(frozen=True)
class PrepareOptions:
    """How input files become documents."""

    inputs: tuple[Path, ...]
    """Text or JSONL files, read in the order given."""
    output_prefix: Path
    """Writes ``PREFIX.bin`` and ``PREFIX.idx``."""
    json_key: str = "text"
    """JSONL: the field that holds each document's text."""
    split_paragraphs: bool = False
    """Text: one document per blank-line-separated paragraph instead of per file."""
    tokenizer: Optional[str] = None
    """A Hugging Face tokenizer (file, directory, or cached model name); None: byte tokens."""
    eod_token: Optional[str] = None
    """The tokenizer's end-of-document token, when its files do not name one."""


@dataclass
class PrepareSummary:
    """What was written."""

    documents: int = 0
    """Documents written."""
    tokens: int = 0
    """Tokens written (end-of-document markers included)."""
    vocab_size: int = BYTE_VOCAB_SIZE
    """Vocabulary size of the tokens: model.vocab_size must be at least this."""
    dtype: str = "uint8"
    """Numpy dtype of the tokens on disk."""
    empty_skipped: int = 0
    """Empty documents left out."""
    files: tuple[Path, ...] = field(default_factory=tuple)
    """The ``.bin`` and ``.idx`` written."""


def prepare(options: PrepareOptions) -> PrepareSummary:
    """Write the dataset; raises :class:`DataError` on bad input, leaving no output."""
    for path in options.inputs:
        if not path.is_file():
            raise DataError(f"--input {path}: file not found")
    tokenizer = load_tokenizer(options.tokenizer, options.eod_token) if options.tokenizer else None
    summary = PrepareSummary()
    if tokenizer is not None:
        summary.vocab_size, summary.dtype = tokenizer.vocab_size, tokenizer.dtype.name
    with IndexedDatasetWriter(options.output_prefix, np.dtype(summary.dtype)) as writer:
        for path in options.inputs:
            for text in iter_documents(path, options.json_key, options.split_paragraphs):
                if not text:
                    summary.empty_skipped += 1
                    continue
                writer.add_document(tokenizer.encode(text) if tokenizer else encode_document(text, path))
        if writer.num_documents == 0:
            raise DataError("no non-empty documents in the inputs: nothing to write; check --input and --json-key")
        summary.documents, summary.tokens = writer.num_documents, writer.total_tokens
    summary.files = (Path(f"{options.output_prefix}.bin"), Path(f"{options.output_prefix}.idx"))
    return summary


def iter_documents(path: Path, json_key: str, split_paragraphs: bool) -> Iterator[str]:
    """The documents of one input file, as text."""
    if path.suffix.lower() in JSONL_SUFFIXES:
        yield from _jsonl_documents(path, json_key)
        return
    text = _read_utf8(path)
    if split_paragraphs:
        yield from (paragraph.strip("\n") for paragraph in _PARAGRAPH_BREAK.split(text))
    else:
        yield text


def encode_document(text: str, source: Path) -> np.ndarray:
    """UTF-8 bytes of ``text`` plus the end-of-document byte."""
    data = text.encode("utf-8")
    if b"\x00" in data:
        raise DataError(f"{source}: a document contains a NUL byte, which marks end of document here; "
                        "remove NUL bytes from the input")
    return np.frombuffer(data + bytes([END_OF_DOCUMENT]), dtype=np.uint8)


def _jsonl_documents(path: Path, json_key: str) -> Iterator[str]:
    with open(path, "rb") as stream:
        for number, raw in enumerate(stream, start=1):
            line = _decode_line(raw, path, number)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{number}: bad JSON ({err.msg} at column {err.colno}); "
                                "each line must be one JSON object") from None
            if not isinstance(record, dict) or json_key not in record:
                raise DataError(f"{path}:{number}: no key {json_key!r} in this line; "
                                "pass the right field name with --json-key")
            value = record[json_key]
            if not isinstance(value, str):
                raise DataError(f"{path}:{number}: {json_key!r} is a {type(value).__name__}, not a string")
            yield value


def _decode_line(raw: bytes, path: Path, number: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}:{number}: not UTF-8 (byte {err.start}); convert the file to UTF-8") from None


def _read_utf8(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text (bad byte at offset {err.start}); "
                        "convert it to UTF-8 or check that it is a text file") from None


class _OneLineParser(argparse.ArgumentParser):
    """Usage mistakes are one line and exit code 2, like bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options, shared by ``runmgr prepare-data`` and ``python -m trainer.data.prepare``."""
    parser.add_argument("--input", action="append", required=True, type=Path,
                        help="text or .jsonl file; repeat for several")
    parser.add_argument("--output-prefix", required=True, type=Path, help="writes PREFIX.bin and PREFIX.idx")
    parser.add_argument("--json-key", default="text", help="JSONL field holding the text (default: text)")
    parser.add_argument("--split-paragraphs", action="store_true",
                        help="text files: one document per blank-line-separated paragraph")
    parser.add_argument("--tokenizer", default=None, metavar="PATH_OR_NAME",
                        help="a Hugging Face tokenizer: tokenizer.json, a directory holding one, or a model "
                             "name already in the local Hugging Face cache (nothing is downloaded); "
                             "default: UTF-8 byte tokens")
    parser.add_argument("--eod-token", default=None, metavar="TOKEN",
                        help="with --tokenizer: the end-of-document token, when tokenizer_config.json "
                             "names no eos_token")


def options_from(args: argparse.Namespace) -> PrepareOptions:
    return PrepareOptions(tuple(args.input), args.output_prefix, args.json_key, args.split_paragraphs,
                          args.tokenizer, args.eod_token)


def parse_args(argv: Optional[Sequence[str]]) -> PrepareOptions:
    parser = _OneLineParser(prog="python -m trainer.data.prepare", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return options_from(parser.parse_args(argv))


def run(options: PrepareOptions) -> int:
    """Write the dataset and print what was written; bad input is one line on stderr, exit 2."""
    try:
        summary = prepare(options)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: {err.filename or options.output_prefix}: {err.strerror}", file=sys.stderr)
        return 2
    files = ", ".join(str(path) for path in summary.files)
    skipped = f" ({summary.empty_skipped} empty skipped)" if summary.empty_skipped else ""
    tokens = "uint8 bytes" if options.tokenizer is None else summary.dtype
    print(f"wrote {summary.documents} documents{skipped}, {summary.tokens} tokens ({tokens}) to {files}")
    print(f"vocabulary {summary.vocab_size}: train with data.data_path={options.output_prefix} "
          f"model.vocab_size={summary.vocab_size} (or larger)")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run(parse_args(argv))  # parse_args exits 2 with one line on bad usage


if __name__ == "__main__":
    sys.exit(main())
