"""Fixed windows of seq_length + 1 tokens."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.data import DataError
from trainer.data.windows import FixedWindows


def test_windows_follow_the_formula_and_share_one_boundary_token():
    tokens = np.arange(23, dtype=np.uint8)
    windows = FixedWindows(tokens, seq_length=5, source="test")
    assert windows.num_samples == (23 - 1) // 5 == 4
    for k in range(4):
        window = windows.window(k)
        assert window.dtype == np.int64 and window.flags.writeable
        assert window.tolist() == list(range(5 * k, 5 * k + 6))
    with pytest.raises(IndexError):
        windows.window(4)


def test_too_little_data_names_the_source_and_the_fix():
    with pytest.raises(DataError, match=r"mydata holds 8 tokens, fewer than one sample of seq_length \+ 1 = 9"):
        FixedWindows(np.zeros(8, dtype=np.uint8), seq_length=8, source="mydata")
