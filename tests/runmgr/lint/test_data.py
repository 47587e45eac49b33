"""The data rules read a sample of the real dataset through the trainer's own
stream and its own input/label split: an id at or past the vocabulary size is
an error, and so is a split whose labels are not the inputs shifted by one."""

from __future__ import annotations

import numpy as np
import pytest

from runmgr.config.compose import load_run_config
from runmgr.lint.data import check_data, label_shift, read_sample, token_range
from trainer.data.indexed import IndexedDatasetWriter
from trainer.data.windows import inputs_and_labels

SMALL = ["model.seq_length=32", "model.max_position_embeddings=32"]


def dataset(prefix, documents, dtype=np.uint16):
    with IndexedDatasetWriter(prefix, dtype=dtype) as writer:
        for tokens in documents:
            writer.add_document(tokens)
    return prefix


def config_for(prefix, *overrides):
    return load_run_config("demo", [f"data.data_path={prefix}", *SMALL, *overrides])


def test_a_token_id_at_the_vocabulary_size_is_an_error_naming_it(tmp_path):
    rng = np.random.default_rng(0)
    documents = [rng.integers(0, 256, 500) for _ in range(20)]
    documents[13][7] = 300  # one id past model.vocab_size=256, deep in the file
    config = config_for(dataset(tmp_path / "bad", documents))
    found = check_data(read_sample(config), config.model.vocab_size)
    assert [(f.rule, f.severity) for f in found] == [("token-range", "error")]
    assert "token id 300 is outside [0, model.vocab_size=256)" in found[0].message
    assert "vocab_size" in found[0].fix


def test_the_same_data_with_a_vocabulary_that_holds_it_passes(tmp_path):
    rng = np.random.default_rng(0)
    documents = [rng.integers(0, 256, 500) for _ in range(20)]
    documents[13][7] = 300
    config = config_for(dataset(tmp_path / "ok", documents), "model.vocab_size=512")
    assert check_data(read_sample(config), config.model.vocab_size) == []


def test_the_embedded_corpus_through_the_trainers_split_passes():
    config = load_run_config("demo", [*SMALL, "data.corpus_max_bytes=200000", "lint.data_sample_windows=8"])
    sample = read_sample(config)
    assert sample.windows.shape == (8, 33)
    assert check_data(sample, config.model.vocab_size) == []


@pytest.mark.parametrize("broken", [
    lambda w: (w[..., :-1], w[..., :-1]),      # labels are the inputs: nothing to predict
    lambda w: (w[..., 1:], w[..., 1:]),        # shifted both
    lambda w: (w[..., :-1], w[..., :-1][..., ::-1]),
], ids=["labels-are-inputs", "both-shifted", "reversed"])
def test_labels_that_are_not_the_inputs_shifted_by_one_are_an_error(broken):
    config = load_run_config("demo", [*SMALL, "data.corpus_max_bytes=200000", "lint.data_sample_windows=4"])
    sample = read_sample(config)
    finding = label_shift(sample, broken)
    assert finding is not None and finding.rule == "label-shift" and finding.severity == "error"
    assert label_shift(sample, inputs_and_labels) is None


def test_an_id_below_zero_is_out_of_range_too(tmp_path):
    config = load_run_config("demo", [*SMALL, "data.corpus_max_bytes=200000", "lint.data_sample_windows=2"])
    sample = read_sample(config)
    negative = type(sample)(sample.source, sample.windows, sample.scanned_tokens, -1, sample.scanned_max)
    assert token_range(negative, 256).rule == "token-range"
