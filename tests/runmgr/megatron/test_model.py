"""A Megatron job as its own flags describe it: the effective config, Megatron-LM's defaults
for flags left out, the conf only where neither says, and one line for what cannot be read."""

from __future__ import annotations

from pathlib import Path

import pytest

from runmgr.config.compose import load_run_config
from runmgr.errors import ConfigError
from runmgr.megatron.job import aligned
from runmgr.megatron.model import FROM_CONF, FROM_DEFAULT, FROM_FLAGS, parameter_count, read_job

REQUIRED = ["--train-iters", "10", "--global-batch-size", "16"]


def job(tmp_path: Path, *args: str, script: str | None = None, workers: int = 2):
    if script is None:
        (tmp_path / "pretrain_gpt.py").write_text("")
        script = str(tmp_path / "pretrain_gpt.py")
    listed = ",".join([*REQUIRED, "--save", str(tmp_path / "ckpt"), *args])
    return load_run_config("demo", [f"run.dir={tmp_path}", "chaos=none", "trainer.kind=megatron",
                                    f"cluster.num_workers={workers}", f"megatron.script={script}",
                                    f"megatron.args=[{listed}]"])


def sources(reading_job) -> dict[str, str]:
    return {reading.key: reading.source for reading in reading_job.readings}


def test_the_flags_are_the_config_and_megatron_defaults_fill_what_they_leave_out(tmp_path):
    read = read_job(job(tmp_path, "--num-layers", "6", "--hidden-size", "256", "--num-attention-heads", "8",
                        "--seq-length", "512", "--tensor-model-parallel-size", "2", "--fp16"))
    m, par, p = read.config.model, read.config.parallel, read.config.precision
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.seq_length) == (6, 256, 8, 512)
    assert m.ffn_hidden_size == 4 * 256 and m.num_query_groups is None  # Megatron's: 4h without --swiglu, no GQA
    assert m.max_position_embeddings == 512 and m.untie_embeddings_and_output_weights is False
    assert par.tensor_model_parallel_size == 2 and p.fp16 and not p.bf16
    assert read.architecture.normalization == "LayerNorm" and read.architecture.bias_linear  # Megatron's defaults
    assert m.vocab_size == 256  # the demo's 256 padded to a multiple of 128 x TP 2: 256
    said = sources(read)
    assert said["model.hidden_size"] == FROM_FLAGS and said["model.ffn_hidden_size"] == FROM_DEFAULT
    assert said["model.vocab_size"] == FROM_CONF and said["training.micro_batch_size"] == FROM_CONF
    assert aligned(job(tmp_path, "--hidden-size", "256")).model.hidden_size == 256  # what launch and lint read


def test_swiglu_sizes_the_ffn_as_megatron_and_the_vocabulary_is_padded(tmp_path):
    read = read_job(job(tmp_path, "--hidden-size", "4096", "--num-attention-heads", "32", "--swiglu",
                        "--vocab-size", "32001", "--tensor-model-parallel-size", "2"))
    assert read.config.model.ffn_hidden_size == 10880  # Megatron: int(4h x 2/3 / 64) x 64 (LLaMA-7B passes 11008)
    assert read.config.model.vocab_size == 32256  # the next multiple of 128 x TP 2
    padded = read_job(job(tmp_path, "--padded-vocab-size", "32000", "--tensor-model-parallel-size", "2"))
    assert padded.config.model.vocab_size == 32000  # MindSpeed-LLM's flag is taken as given
    dialect = read_job(job(tmp_path, "--vocab-size", "300", script="-m trainer"))
    assert dialect.config.model.vocab_size == 300  # the built-in trainer's dialect pads nothing


def test_megatron_llama_7b_has_its_published_parameter_count(tmp_path):
    read = read_job(job(tmp_path, "--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32",
                        "--ffn-hidden-size", "11008", "--swiglu", "--normalization", "RMSNorm",
                        "--position-embedding-type", "rope", "--disable-bias-linear",
                        "--untie-embeddings-and-output-weights", "--padded-vocab-size", "32000"))
    assert parameter_count(read.config.model, read.architecture) == 6_738_415_616  # LLaMA-7B


def test_gpt2_small_with_biases_layernorm_and_learned_positions(tmp_path):
    read = read_job(job(tmp_path, "--num-layers", "12", "--hidden-size", "768", "--num-attention-heads", "12",
                        "--seq-length", "1024", "--max-position-embeddings", "1024", "--padded-vocab-size", "50257"))
    assert parameter_count(read.config.model, read.architecture) == 124_439_808  # GPT-2 small, tied


@pytest.mark.parametrize("args, said", [
    (("--num-layers", "many"), "megatron.args: --num-layers must be a positive whole number, got 'many'"),
    (("--lr", "fast"), "megatron.args: --lr must be a number, got 'fast'"),
    (("--normalization", "ScaleNorm"), "megatron.args: --normalization ScaleNorm is not one runmgr can plan with"),
    (("--num-query-groups", "2"), "--num-query-groups takes effect only with --group-query-attention"),
    (("--tensor-model-parallel-size", "4"), "TP 4 x PP 1 x CP 1 = 4 ranks per replica do not divide "
                                             "cluster.num_workers (2)"),
    (("--micro-batch-size", "3"), "--global-batch-size 16 is not a multiple of --micro-batch-size 3 x data parallel 2"),
    (("--hidden-size", "100", "--num-attention-heads", "3"), "--hidden-size 100 is not a multiple of "
                                                             "--num-attention-heads 3"),
])
def test_what_runmgr_cannot_read_is_one_line(tmp_path, args, said):
    with pytest.raises(ConfigError) as caught:
        read_job(job(tmp_path, *args))
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_context_parallel_splits_a_replica(tmp_path):
    read = read_job(job(tmp_path, "--context-parallel-size", "2", "--micro-batch-size", "2", workers=4))
    assert read.architecture.context_parallel == 2 and read.data_parallel == 2
