"""Tensor parallelism on 4 real CPU ranks (gloo): TP 2 x DP 2 of the tiny
model against plain data parallel on 4 ranks, a rank killed mid-run and the
run resumed bit for bit, and the sizes tensor parallelism refuses.

Measured (tiny llama, 25 steps, fp32, this machine): the largest relative
loss difference from data parallel was 2.1e-05 and of the gradient norm
2.2e-02, at the step-22 spike (the first step's norm agrees to 1.7e-7: same weights, gradients
up to the order of float sums, since a row-parallel layer adds its halves in
another order; later steps amplify those last bits in the norm more than in
the loss). The asserted tolerances leave a few times that. OPT tied with
sequence parallel, 10 steps: 1.2e-07 (loss), 6.3e-07 (gradient norm); checked over the first 5
of them since issue 28 (its two launches of 4 ranks, 5 steps fewer each).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.trainer.parallel.conftest import (
    PARALLEL_STEPS, RESUME_STEP, RESUMED_UNTIL, SCHEDULE_STEPS, checkpoint_of, grad_norms, max_relative,
)
from trainer.manifest import read_manifest

pytestmark = pytest.mark.slow  # several ranks training for minutes: run first under xdist

TP2 = {"tensor_model_parallel_size": 2}
LOSS_RTOL = 2e-3
NORM_RTOL = 1e-1
OPT_STEPS = 5
OPT = {"family": "opt", "untie_embeddings_and_output_weights": False, "hidden_dropout": 0.0,
       "attention_dropout": 0.0}


@pytest.fixture(scope="module")
def tensor_parallel_run(launch_layout):
    """TP 2 x DP 2 of the tiny llama, uninterrupted, checkpoints at 20 and 25."""
    ranks = launch_layout(TP2)
    return {"ranks": ranks, "results": ranks.wait(timeout=900)}


def test_tp2_dp2_matches_data_parallel_losses_and_gradient_norms(tensor_parallel_run, data_parallel_run):
    tp, dp = tensor_parallel_run["results"], data_parallel_run["results"]
    losses, reference = tp[0]["losses"], dp[0]["losses"]
    assert len(losses) == PARALLEL_STEPS and all(r["losses"] == losses for r in tp)  # every rank reports one loss
    loss_diff = max_relative(losses, reference)
    norms, reference_norms = grad_norms(tensor_parallel_run["ranks"]), grad_norms(data_parallel_run["ranks"])
    norm_diffs = [max_relative([a], [b]) for a, b in zip(norms, reference_norms)]
    norm_diff = max(norm_diffs)
    print(f"TP 2 x DP 2 vs DP 4, {PARALLEL_STEPS} steps: max relative loss difference {loss_diff:.2e}, "
          f"gradient norm {norm_diff:.2e} (step {norm_diffs.index(norm_diff) + 1}), first step {norm_diffs[0]:.2e}")
    assert len(norms) == len(reference_norms) == PARALLEL_STEPS
    assert loss_diff < LOSS_RTOL and norm_diff < NORM_RTOL
    # The first step's gradients come from identical weights: only the order of sums differs.
    assert norm_diffs[0] < 1e-5


def test_checkpoints_record_the_global_shapes(tensor_parallel_run):
    manifest = read_manifest(checkpoint_of(tensor_parallel_run["ranks"]))
    shapes = manifest["parameters"]
    assert shapes["embedding.weight"] == [256, 64] and shapes["output.weight"] == [256, 64]
    assert shapes["blocks.0.attn.qkv.weight"] == [128, 64]  # 4 query heads + 2 x (k, v) of 2 groups, 16 wide
    assert shapes["blocks.0.mlp.down.weight"] == [64, 128]


def test_opt_tied_with_sequence_parallel_matches_data_parallel(launch_layout):
    """OPT (biases, learned positions, LayerNorm, the output tied to the
    vocabulary-parallel embedding) under TP 2 with sequence-parallel norms."""
    training = {"train_iters": OPT_STEPS}
    reference = launch_layout({}, model=OPT, training=training)
    tp = launch_layout({**TP2, "sequence_parallel": True}, model=OPT, training=training)
    expected, got = reference.wait(timeout=900)[0]["losses"], tp.wait(timeout=900)[0]["losses"]
    loss_diff = max_relative(got, expected)
    norm_diff = max_relative(grad_norms(tp), grad_norms(reference))
    print(f"OPT tied, TP 2 (sequence parallel) x DP 2 vs DP 4, {OPT_STEPS} steps: max relative loss difference "
          f"{loss_diff:.2e}, gradient norm {norm_diff:.2e}")
    assert len(got) == OPT_STEPS and loss_diff < LOSS_RTOL and norm_diff < NORM_RTOL


def wait_for(condition, ranks, what: str, limit: float = 900) -> None:
    """Poll the run's own events until ``condition()``; the limit bounds the
    wait on a dead run, it is no claim about speed."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"never saw {what}"
        assert all(proc.poll() is None for proc in ranks.procs), f"a rank ended before {what}"
        time.sleep(0.1)


def test_a_killed_rank_resumes_from_the_last_checkpoint_bit_for_bit(tensor_parallel_run, launch_layout,
                                                                    resume_layout):
    """Sub-run 0.01 starts from the unbroken run's checkpoint of step 20 and
    loses rank 3 to kill -9 at step 22; sub-run 0.02 resumes from that
    checkpoint, its last, and trains steps 21-22 as the unbroken run did."""
    checkpoint = checkpoint_of(tensor_parallel_run["ranks"])
    # Set to train on to step 50 (the same LR schedule), its next checkpoint at 40: the kill
    # lands long before it, however late the poll sees step 22.
    killed = launch_layout(TP2, plan={"subrun": "0.01", "start_checkpoint": checkpoint},
                           training={"train_iters": SCHEDULE_STEPS})
    later = lambda: [e for e in killed.events(3, "heartbeat") if e["step"] >= RESUME_STEP + 2]  # noqa: E731
    wait_for(later, killed, f"rank 3 at step {RESUME_STEP + 2}")
    os.kill(killed.procs[3].pid, signal.SIGKILL)
    for proc in killed.procs[:3]:
        proc.wait(timeout=300)  # the survivors fail on the lost peer
        assert proc.returncode != 0
    assert killed.events(0, "started")[0]["start_step"] == RESUME_STEP
    assert not killed.events(0, "checkpoint")  # nothing newer than step 20 was written
    results = resume_layout(TP2, checkpoint, subrun="0.02").wait(timeout=900)
    assert results[0]["start_step"] == RESUME_STEP
    expected = tensor_parallel_run["results"][0]["losses"][RESUME_STEP:RESUMED_UNTIL]
    assert results[0]["losses"] == expected  # exact float equality, not approx
