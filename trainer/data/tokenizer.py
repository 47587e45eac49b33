"""Hugging Face tokenizers for ``prepare-data --tokenizer``, found offline.

What ``--tokenizer`` accepts, without any download (this tool never reaches
the network):

- a ``tokenizer.json`` file (what ``tokenizers.Tokenizer.save`` and
  ``transformers``' ``save_pretrained`` write);
- a directory holding one (a saved tokenizer or a model checkout);
- a Hugging Face model name (``gpt2``, ``meta-llama/Llama-2-7b-hf``) that is
  already in the local Hugging Face cache (``$HF_HUB_CACHE``, else
  ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``), as Megatron's
  ``--tokenizer-model NAME`` would load it.

Anything else is one line saying where it looked and how to get the file.
The end-of-document token is ``eos_token`` of a ``tokenizer_config.json``
beside the file, else the first of :data:`EOD_CANDIDATES` the vocabulary has,
else the caller's ``--eod-token``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from trainer.data.errors import DataError

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
"""End-of-document tokens of common tokenizers (GPT-2, LLaMA/T5, Gemma, LLaMA 3)."""
UINT16_VOCAB_LIMIT = 65500
"""Megatron's rule (``DType.optimal_dtype``): uint16 tokens below this vocabulary size, int32 above."""


@dataclass(frozen=True)
class TextTokenizer:
    """A loaded tokenizer and the end-of-document token appended to each document."""

    tokenizer: object
    """A ``tokenizers.Tokenizer``."""
    source: Path
    """The ``tokenizer.json`` it was read from."""
    eod_id: int
    """Token id appended after each document."""
    vocab_size: int
    """Vocabulary size, added tokens included: the model's vocab_size must be at least this."""

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint16 if self.vocab_size < UINT16_VOCAB_LIMIT else np.int32)

    def encode(self, text: str) -> np.ndarray:
        """The document's token ids followed by the end-of-document id."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return np.asarray([*ids, self.eod_id], dtype=self.dtype)


def hub_cache() -> Path:
    """Where ``huggingface_hub`` keeps downloaded models on this machine."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    return home / "hub"


def cached_snapshot(name: str, cache: Path) -> Optional[Path]:
    """The cached snapshot of model ``name`` (its ``main`` revision, else any), if present."""
    model_dir = cache / ("models--" + name.replace("/", "--"))
    ref = model_dir / "refs" / "main"
    if ref.is_file():
        snapshot = model_dir / "snapshots" / ref.read_text().strip()
        if (snapshot / TOKENIZER_FILE).is_file():
            return snapshot
    snapshots = sorted((model_dir / "snapshots").glob(f"*/{TOKENIZER_FILE}"))
    return snapshots[-1].parent if snapshots else None


def find_tokenizer_file(spec: str) -> Path:
    """The ``tokenizer.json`` that ``--tokenizer spec`` means, or DataError."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        if (path / TOKENIZER_FILE).is_file():
            return path / TOKENIZER_FILE
        raise DataError(f"--tokenizer {spec}: the directory has no {TOKENIZER_FILE}; pass the file or a "
                        "directory written by save_pretrained")
    cache = hub_cache()
    snapshot = cached_snapshot(spec, cache)
    if snapshot is not None:
        return snapshot / TOKENIZER_FILE
    raise DataError(
        f"--tokenizer {spec}: not a file, a directory, or a model in the Hugging Face cache ({cache}); "
        f"nothing is downloaded here: save the tokenizer where there is network "
        f"(AutoTokenizer.from_pretrained('{spec}').save_pretrained(DIR)) and pass DIR")


def load_tokenizer(spec: str, eod_token: Optional[str] = None) -> TextTokenizer:
    """Load ``spec`` (see the module docstring); DataError with one line when it cannot be used."""
    from tokenizers import Tokenizer

    source = find_tokenizer_file(spec)
    try:
        tokenizer = Tokenizer.from_file(str(source))
    except Exception as err:  # the Rust library raises plain Exception for any malformed file
        raise DataError(f"--tokenizer {spec}: {source} is not a tokenizers JSON file ({err})") from None
    eod = eod_token or _configured_eos(source.parent) or next(
        (token for token in EOD_CANDIDATES if tokenizer.token_to_id(token) is not None), None)
    if eod is None:
        raise DataError(f"--tokenizer {spec}: no end-of-document token found (no eos_token in "
                        f"{TOKENIZER_CONFIG}, none of {', '.join(EOD_CANDIDATES)}); pass --eod-token TOKEN")
    eod_id = tokenizer.token_to_id(eod)
    if eod_id is None:
        raise DataError(f"--eod-token {eod!r} is not in the tokenizer's vocabulary ({source})")
    return TextTokenizer(tokenizer, source, eod_id, tokenizer.get_vocab_size(with_added_tokens=True))


def _configured_eos(directory: Path) -> Optional[str]:
    config = directory / TOKENIZER_CONFIG
    if not config.is_file():
        return None
    try:
        eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return None
    if isinstance(eos, dict):  # transformers writes AddedToken objects as {"content": ...}
        eos = eos.get("content")
    return eos if isinstance(eos, str) else None
