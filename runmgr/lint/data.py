"""The data rules, on a decoded sample of the real dataset taken through the
trainer's own path: its sample stream (windows in the order it reads them) and
its split of a window into inputs and labels
(:func:`trainer.data.windows.inputs_and_labels`), so the check runs the code
the trainer runs. Gathering the sample reads the data; the rules are pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from runmgr.config.schema import RunConfig
from runmgr.lint.findings import Finding
from runmgr.lint.rules import RULES
from trainer.data import build_sample_stream
from trainer.data.windows import inputs_and_labels

Split = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
"""Windows -> (inputs, labels), as the trainer splits them."""


@dataclass(frozen=True)
class DataSample:
    """What the data rules read: sampled windows and a scan of the token ids."""

    source: str
    """Where the tokens come from (the stream's own description)."""
    windows: np.ndarray
    """(n, seq_length + 1) tokens of the stream's first ``n`` samples, int64."""
    scanned_tokens: int
    """Tokens scanned from the dataset's start for ``scanned_min`` / ``scanned_max``."""
    scanned_min: int
    scanned_max: int


def read_sample(config: RunConfig) -> DataSample:
    """The first ``lint.data_sample_windows`` samples of the trainer's stream and the min/max
    token id of the dataset's first ``lint.data_scan_tokens`` tokens (a memory-mapped read)."""
    stream = build_sample_stream(config.data, config.model.seq_length, config.training.seed)
    count = min(config.lint.data_sample_windows, stream.num_samples)
    windows = stream.batch(list(range(count))).astype(np.int64, copy=False)
    tokens = stream.all_tokens()[:config.lint.data_scan_tokens]
    low, high = (int(tokens.min()), int(tokens.max())) if tokens.size else (0, 0)
    return DataSample(stream.source, windows, int(tokens.size), low, high)


def token_range(sample: DataSample, vocab_size: int) -> Optional[Finding]:
    """Any token id of the sample or the scan outside [0, vocab_size)."""
    low = min(sample.scanned_min, int(sample.windows.min()) if sample.windows.size else 0)
    high = max(sample.scanned_max, int(sample.windows.max()) if sample.windows.size else 0)
    if 0 <= low and high < vocab_size:
        return None
    bad = high if high >= vocab_size else low
    where = (f"{sample.windows.shape[0]} sampled windows and the first {sample.scanned_tokens:,} tokens "
             f"of {sample.source}")
    return RULES["token-range"].finding(
        f"token id {bad} is outside [0, model.vocab_size={vocab_size}) ({where}: ids {low}..{high})",
        "set model.vocab_size to the tokenizer's vocabulary size (`runmgr prepare-data` prints it), or rebuild "
        "the dataset with the model's tokenizer")


def label_shift(sample: DataSample, split: Split = inputs_and_labels) -> Optional[Finding]:
    """The labels ``split`` gives must be the inputs shifted by one: label t = input t + 1."""
    windows = sample.windows
    inputs, labels = split(windows)
    seq = windows.shape[-1] - 1
    if inputs.shape != labels.shape or inputs.shape[-1] != seq:
        return RULES["label-shift"].finding(
            f"the trainer's split of windows of {seq + 1} tokens gives inputs {tuple(inputs.shape)} and labels "
            f"{tuple(labels.shape)}; both should be (n, {seq})",
            "fix trainer/data/windows.py inputs_and_labels: inputs = window[..., :-1], labels = window[..., 1:]")
    wrong = np.flatnonzero((labels[..., :-1] != inputs[..., 1:]).any(axis=-1) | (labels[..., -1] != windows[..., -1]))
    if wrong.size == 0:
        return None
    return RULES["label-shift"].finding(
        f"in {wrong.size} of {windows.shape[0]} sampled windows the labels are not the inputs shifted by one "
        f"(first: sample {int(wrong[0])} of {sample.source})",
        "fix trainer/data/windows.py inputs_and_labels: inputs = window[..., :-1], labels = window[..., 1:]")


def check_data(sample: DataSample, vocab_size: int, split: Split = inputs_and_labels) -> list[Finding]:
    """Both data rules' findings."""
    return [f for f in (token_range(sample, vocab_size), label_shift(sample, split)) if f is not None]
