"""Tensor parallel within pipeline stages (TP 2 x PP 2 of the tiny model, 4
real rank processes, sequence parallel on: the stream crosses a stage
boundary as each rank's slice of the sequence, to the next stage's rank of the
same tensor-parallel coordinate): it trains as plain data parallel does, and
its checkpoint resumes at its own layout bit for bit.

Measured on CPU (gloo, fp32; only the order of float sums differs): over 50
steps the losses of TP 2 x PP 2 differ from plain DP 4's by at most
MEASURED_LOSS relative (assert: 1e-4, as for the pipeline alone).
"""

from __future__ import annotations

import math

import pytest

from tests.trainer.parallel.conftest import PARALLEL_STEPS

LOSS_TOLERANCE = 1e-4
"""Max relative loss difference from data parallel (measured MEASURED_LOSS)."""
CALM_STEPS, CALM_NORM_TOLERANCE = 21, 1e-4
"""Gradient norms before the run's step-22 spike (see test_pipeline_parallel; measured MEASURED_NORM)."""
TENSOR_PIPELINE = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "sequence_parallel": True}
RESUME_STEP = 25  # tiny_config saves every 25 steps


def _relative(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def _grad_norms(ranks) -> list[float]:
    return [event["grad_norm"] for event in ranks.events(0, "step")]


@pytest.fixture(scope="module")
def tensor_pipeline_run(launch_layout):
    """TP 2 x PP 2 on 4 ranks for 50 steps (checkpoints at 25 and 50)."""
    ranks = launch_layout(TENSOR_PIPELINE)
    return {"ranks": ranks, "results": ranks.wait(timeout=1200)}


def test_tensor_parallel_stages_train_as_data_parallel_does(tensor_pipeline_run, data_parallel_run):
    results = tensor_pipeline_run["results"]
    losses, reference = results[0]["losses"], data_parallel_run["results"][0]["losses"]
    assert len(losses) == PARALLEL_STEPS and all(math.isfinite(x) for x in losses)
    assert all(result["losses"] == losses for result in results)  # the last stage's loss reaches every rank
    loss_difference = _relative(losses, reference)
    norms, reference_norms = _grad_norms(tensor_pipeline_run["ranks"]), _grad_norms(data_parallel_run["ranks"])
    calm_difference = _relative(norms[:CALM_STEPS], reference_norms[:CALM_STEPS])
    print(f"TP 2 x PP 2 vs DP 4 over {PARALLEL_STEPS} steps: max relative loss difference {loss_difference:.2e}, "
          f"grad norm {calm_difference:.2e} over the first {CALM_STEPS} steps, "
          f"{_relative(norms, reference_norms):.2e} over all")
    assert loss_difference < LOSS_TOLERANCE
    assert calm_difference < CALM_NORM_TOLERANCE


def test_a_tensor_pipeline_checkpoint_resumes_at_its_own_layout_bit_for_bit(launch_layout, tensor_pipeline_run):
    checkpoint = tensor_pipeline_run["ranks"].out / "checkpoints" / f"step_{RESUME_STEP:08d}"
    resumed = launch_layout(TENSOR_PIPELINE, plan={"start_checkpoint": str(checkpoint)}).wait(timeout=1200)
    assert resumed[0]["start_step"] == RESUME_STEP
    assert resumed[0]["losses"] == tensor_pipeline_run["results"][0]["losses"][RESUME_STEP:]
