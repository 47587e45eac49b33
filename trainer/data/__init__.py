"""Training data: Megatron indexed datasets, the embedded corpus, and a
sample stream whose order is a pure function of (seed, stream position)."""

from trainer.data.errors import DataError
from trainer.data.stream import SampleStream, build_sample_stream, check_data_path

__all__ = ["DataError", "SampleStream", "build_sample_stream", "check_data_path"]
