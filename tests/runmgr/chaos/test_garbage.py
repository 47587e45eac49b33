"""Garbage windows: exactly the mapped samples change, and training on them really spikes the loss."""

from __future__ import annotations

import numpy as np

from runmgr.chaos.garbage import SampleWindow, mapped_samples, write_garbage_copy
from trainer.config import DataConfig, ModelConfig, OptimConfig, TrainerConfig, TrainingConfig
from trainer.data import build_sample_stream
from trainer.data.corpus import corpus_tokens
from trainer.data.indexed import IndexedDataset
from trainer.distributed import DistEnv
from trainer.loop import train
from trainer.plan import ResumePlan

CORPUS = DataConfig(corpus_max_bytes=300_000)
SEQ, SEED = 64, 1234


def test_the_copy_differs_from_the_data_exactly_at_the_samples_of_the_window(tmp_path):
    window = SampleWindow.of_steps(at_step=11, steps=3, global_batch_size=8)  # positions [80, 104)
    prefix = write_garbage_copy(CORPUS, SEQ, SEED, 256, [window], chaos_seed=7, out_dir=tmp_path)
    original = build_sample_stream(CORPUS, SEQ, SEED)
    broken = build_sample_stream(DataConfig(data_path=str(prefix)), SEQ, SEED)
    assert broken.num_samples == original.num_samples
    differ = np.nonzero(corpus_tokens(CORPUS.corpus_max_bytes) != IndexedDataset(prefix).tokens)[0]
    # Sample k holds tokens [k*SEQ, k*SEQ + SEQ]; only its inner tokens may change.
    assert all(i % SEQ != 0 for i in differ), "a token shared with a neighbouring sample changed"
    changed = set(((differ - 1) // SEQ).tolist())
    assert changed == set(mapped_samples(CORPUS, SEQ, SEED, [window]).tolist())
    assert changed == {original.dataset_index(p) for p in range(80, 104)}
    # The same positions map to the same samples: the run's order is untouched.
    assert all(original.dataset_index(p) == broken.dataset_index(p) for p in range(0, 500, 7))
    sample = broken.decode(85)
    assert sample != original.decode(85) and ("\\u00" in sample or "\x1b[" in sample or "\\x1b" in sample)


def test_a_second_launch_reuses_the_copy(tmp_path):
    window = SampleWindow(8, 16)
    first = write_garbage_copy(CORPUS, SEQ, SEED, 256, [window], 0, tmp_path)
    stamp = first.with_suffix(".bin").stat().st_mtime_ns
    assert write_garbage_copy(CORPUS, SEQ, SEED, 256, [window], 0, tmp_path) == first
    assert first.with_suffix(".bin").stat().st_mtime_ns == stamp
    assert write_garbage_copy(CORPUS, SEQ, SEED, 256, [SampleWindow(8, 24)], 0, tmp_path) != first


class Losses:
    def __init__(self) -> None:
        self.by_step: dict[int, float] = {}

    def step(self, report) -> None:
        self.by_step[report.step] = report.loss

    def checkpoint(self, report) -> None: ...

    def local_norms(self, report) -> None: ...

    def heartbeat(self, beat) -> None: ...

    def started(self, report) -> None: ...


def small_config(data: DataConfig, iters: int) -> TrainerConfig:
    return TrainerConfig(
        model=ModelConfig(num_layers=2, hidden_size=64, ffn_hidden_size=172, num_attention_heads=4,
                          seq_length=SEQ, max_position_embeddings=SEQ),
        optim=OptimConfig(lr=3e-3, min_lr=3e-4, lr_warmup_iters=5),
        data=data, training=TrainingConfig(micro_batch_size=8, global_batch_size=8, train_iters=iters, seed=SEED),
        device="cpu")


def test_training_on_the_window_really_raises_the_loss_for_as_long_as_it_lasts(tmp_path):
    window = SampleWindow.of_steps(at_step=31, steps=8, global_batch_size=8)
    prefix = write_garbage_copy(CORPUS, SEQ, SEED, 256, [window], 0, tmp_path)
    losses = Losses()
    train(small_config(DataConfig(data_path=str(prefix)), 38), ResumePlan(), losses, DistEnv())
    before = np.mean([losses.by_step[s] for s in range(24, 31)])
    during = [losses.by_step[s] for s in range(31, 39)]
    assert before < 3.5, "the model should have learned the corpus before the window"
    assert min(during) > 1.4 * before, f"loss {before:.2f} before the window, {during} inside it"
