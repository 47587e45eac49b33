"""Fixed windows: a token stream cut into training samples.

Sample ``k`` is ``tokens[k*L : k*L + L + 1]`` for sequence length ``L``: the
model reads the first ``L`` tokens and predicts the last ``L``, and
consecutive samples share one boundary token so that no token is wasted.
Documents run across windows, separated by their end-of-document token,
as in Megatron's GPT dataset.
"""

from __future__ import annotations

import numpy as np

from trainer.data.errors import DataError


class FixedWindows:
    """``num_samples = (len(tokens) - 1) // seq_length`` windows of ``seq_length + 1`` tokens."""

    def __init__(self, tokens: np.ndarray, seq_length: int, source: str) -> None:
        if seq_length <= 0:
            raise DataError(f"model.seq_length must be a positive integer, got {seq_length}")
        self.tokens = tokens
        self.seq_length = seq_length
        self.num_samples = max(0, (int(tokens.size) - 1) // seq_length)
        if self.num_samples == 0:
            raise DataError(f"{source} holds {tokens.size} tokens, fewer than one sample of "
                            f"seq_length + 1 = {seq_length + 1}; use more data or a smaller model.seq_length")

    def window(self, index: int) -> np.ndarray:
        """Tokens of sample ``index`` as int64 (a copy, safe to hand to torch)."""
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample {index} out of range [0, {self.num_samples})")
        start = index * self.seq_length
        return np.array(self.tokens[start:start + self.seq_length + 1], dtype=np.int64)


def inputs_and_labels(window):
    """The model's inputs and the labels it is trained to predict, from windows of
    ``seq_length + 1`` tokens (the last axis; a NumPy array or a torch tensor):
    label ``t`` is input ``t + 1``, the next token. The trainer's step and
    ``runmgr lint``'s label-shift rule both split windows here."""
    return window[..., :-1], window[..., 1:]
