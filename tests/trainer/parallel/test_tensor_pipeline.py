"""Tensor parallel within pipeline stages (TP 2 x PP 2 of the tiny model, 4
real rank processes, sequence parallel on: the stream crosses a stage
boundary as each rank's slice of the sequence, to the next stage's rank of the
same tensor-parallel coordinate): it trains as plain data parallel does, and
its checkpoint resumes at its own layout bit for bit.

Measured on CPU (gloo, fp32; only the order of float sums differs), TP 2 x
PP 2 against plain DP 4: for the first 21 steps the losses differ by at most
1.2e-7 relative (assert: 1e-6) and the gradient norms by 8.7e-6 (assert:
1e-4). Step 22 is the run's gradient spike (norm 4.3 among ~1-2, clipped at
1.0): it amplifies the sum-order noise to 7.3e-3 in the norms (assert: 1e-1
at every step), and the losses after it stay within 6.9e-6 (assert: 3e-4 over
all 25 steps; the 50-step run measured 6.0e-5 and 2.7e-2). Without sequence parallel (the stream replicated over
tp at the boundary) the first 4 steps measured 6.6e-8, by hand.
"""

from __future__ import annotations

import math

import pytest

from tests.trainer.parallel.conftest import (
    PARALLEL_STEPS, RESUME_STEP, RESUMED_UNTIL, checkpoint_of, grad_norms, max_relative,
)

pytestmark = pytest.mark.slow  # several ranks training for minutes: run first under xdist

LOSS_TOLERANCE, NORM_TOLERANCE = 3e-4, 1e-1
"""Max relative differences from data parallel over 25 steps (measured 6.9e-6 and 7.3e-3, the spike's)."""
CALM_STEPS, CALM_LOSS_TOLERANCE, CALM_NORM_TOLERANCE = 21, 1e-6, 1e-4
"""Before the run's step-22 spike (measured 1.2e-7 and 8.7e-6)."""
TENSOR_PIPELINE = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "sequence_parallel": True}


@pytest.fixture(scope="module")
def tensor_pipeline_run(launch_layout):
    """TP 2 x PP 2 on 4 ranks for 25 steps (checkpoints at 20 and 25)."""
    ranks = launch_layout(TENSOR_PIPELINE)
    return {"ranks": ranks, "results": ranks.wait(timeout=1200)}


def test_tensor_parallel_stages_train_as_data_parallel_does(tensor_pipeline_run, data_parallel_run):
    results = tensor_pipeline_run["results"]
    losses, reference = results[0]["losses"], data_parallel_run["results"][0]["losses"]
    assert len(losses) == PARALLEL_STEPS and all(math.isfinite(x) for x in losses)
    assert all(result["losses"] == losses for result in results)  # the last stage's loss reaches every rank
    loss_difference = max_relative(losses, reference)
    calm_loss = max_relative(losses[:CALM_STEPS], reference[:CALM_STEPS])
    norms, reference_norms = grad_norms(tensor_pipeline_run["ranks"]), grad_norms(data_parallel_run["ranks"])
    norm_difference = max_relative(norms, reference_norms)
    calm_norm = max_relative(norms[:CALM_STEPS], reference_norms[:CALM_STEPS])
    print(f"TP 2 x PP 2 vs DP 4 over {PARALLEL_STEPS} steps: max relative loss difference {loss_difference:.2e} "
          f"({calm_loss:.2e} over the first {CALM_STEPS} steps), grad norm {norm_difference:.2e} ({calm_norm:.2e})")
    assert calm_loss < CALM_LOSS_TOLERANCE and loss_difference < LOSS_TOLERANCE
    assert calm_norm < CALM_NORM_TOLERANCE and norm_difference < NORM_TOLERANCE


def test_a_tensor_pipeline_checkpoint_resumes_at_its_own_layout_bit_for_bit(resume_layout, tensor_pipeline_run):
    resumed = resume_layout(TENSOR_PIPELINE, checkpoint_of(tensor_pipeline_run["ranks"])).wait(timeout=1200)
    assert resumed[0]["start_step"] == RESUME_STEP
    assert resumed[0]["losses"] == tensor_pipeline_run["results"][0]["losses"][RESUME_STEP:RESUMED_UNTIL]
