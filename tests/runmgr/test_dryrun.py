"""``runmgr launch --dry-run`` plans a Megatron job as its own flags describe it (not the
conf's model sections), says which value came from where, and decides a local cluster's
capacity from the config, node by node, without Ray; a layout no node can place is named
with the node that comes closest."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from runmgr.config.compose import load_run_config
from runmgr.dryrun import ClusterView, NodeView, build_plan, node_shortfall
from tests.runmgr.without_ray import RAY_IMPORTED_EXIT, runmgr_without_ray

# The job: 3 layers of width 96, 6 query heads in 2 key/value groups (GQA) of 16, a SwiGLU MLP of
# 256, RMSNorm, rotary positions, no linear biases, an untied output, a vocabulary of 1000 that
# Megatron pads to a multiple of 128, bf16. The demo conf's model is another (hidden 128, fp32).
LAYERS, HIDDEN, HEADS, GROUPS, FFN, VOCAB, SEQ = 3, 96, 6, 2, 256, 1000, 128
JOB_ARGS = ["--num-layers", str(LAYERS), "--hidden-size", str(HIDDEN), "--num-attention-heads", str(HEADS),
            "--group-query-attention", "--num-query-groups", str(GROUPS), "--ffn-hidden-size", str(FFN),
            "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--disable-bias-linear",
            "--untie-embeddings-and-output-weights", "--seq-length", str(SEQ), "--max-position-embeddings", "256",
            "--vocab-size", str(VOCAB), "--tokenizer-type", "NullTokenizer", "--global-batch-size", "16",
            "--train-iters", "10", "--lr", "1.0e-3", "--bf16", "--use-distributed-optimizer"]


def expected_parameters() -> int:
    """The layer formula of Megatron's GPT model, written out for the job's flags."""
    head = HIDDEN // HEADS
    padded_vocab = math.ceil(VOCAB / 128) * 128  # --make-vocab-size-divisible-by 128 x TP 1
    embeddings = padded_vocab * HIDDEN  # rotary positions: no position weights
    attention = HIDDEN * (HEADS * head + 2 * GROUPS * head) + HEADS * head * HIDDEN  # qkv (GQA) + output projection
    mlp = HIDDEN * 2 * FFN + FFN * HIDDEN  # SwiGLU: gate and up projections, then down
    norms = 2 * HIDDEN  # RMSNorm before attention and before the MLP: one weight each
    final_norm = HIDDEN
    output = padded_vocab * HIDDEN  # untied
    return embeddings + LAYERS * (attention + mlp + norms) + final_norm + output


def job_overrides(tmp_path: Path, *extra: str) -> list[str]:
    script = tmp_path / "pretrain_gpt.py"
    script.write_text("raise SystemExit('a dry run never runs the job')\n")
    args = [*JOB_ARGS, "--save", str(tmp_path / "ckpt")]
    return [f"run.dir={tmp_path / 'run'}", "chaos=none", "trainer.kind=megatron", f"megatron.script={script}",
            "megatron.args=[" + ",".join(args) + "]", *extra]


def plan_field(stdout: str, name: str) -> str:
    """The text after ``name`` on its line of the plan."""
    line = next(line for line in stdout.splitlines() if line.strip().startswith(name))
    return line.strip()[len(name):].strip()


def test_the_dry_run_of_a_megatron_job_prints_its_own_model_without_ray(tmp_path):
    done, wall_s = runmgr_without_ray(tmp_path, "launch", "conf=demo", *job_overrides(tmp_path), "--dry-run")
    print(f"dry-run of the Megatron job: {wall_s:.2f} s wall, exit {done.returncode}")
    assert done.returncode != RAY_IMPORTED_EXIT, done.stderr
    assert done.returncode == 0, done.stderr
    out = done.stdout
    counted = int(plan_field(out, "parameters").split("(")[0].replace(",", ""))
    print(f"parameters printed {counted:,}, by the layer formula {expected_parameters():,}")
    assert counted == expected_parameters()
    model = plan_field(out, "model")
    assert f"{LAYERS} layers, hidden {HIDDEN}, {HEADS} heads ({GROUPS} kv groups of {HIDDEN // HEADS}), ffn {FFN}" \
        in model
    assert "vocab 1024" in model and "RMSNorm, SwiGLU MLP, rope positions, no linear biases, untied output" in model
    assert "hidden 128" not in out  # the demo conf's model is not the job's
    assert "; bf16;" in plan_field(out, "training")
    assert "distributed optimizer over DP" in plan_field(out, "parallelism")
    assert "decided from the config without starting Ray" in plan_field(out, "cluster")
    # Which is which: the flags, Megatron's defaults for flags left out, the conf for what neither says.
    assert "model.hidden_size=96 (--hidden-size)" in plan_field(out, "from flags")
    assert "parallel.tensor_model_parallel_size=1 (no --tensor-model-parallel-size)" in plan_field(out, "defaults")
    assert "training.micro_batch_size=4 (no --micro-batch-size)" in plan_field(out, "from conf")  # the demo's 4


def test_a_flag_runmgr_must_read_but_cannot_parse_is_one_line(tmp_path):
    overrides = job_overrides(tmp_path)
    overrides[-1] = overrides[-1].replace(f"--hidden-size,{HIDDEN}", "--hidden-size,wide")
    done, _ = runmgr_without_ray(tmp_path, "launch", "conf=demo", *overrides, "--dry-run")
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0] == "runmgr: error: megatron.args: --hidden-size must be a positive whole number, got 'wide'"


def test_a_remote_cluster_is_only_asked_whether_it_answers(tmp_path):
    done, _ = runmgr_without_ray(tmp_path, "launch", "conf=demo", *job_overrides(tmp_path),
                                 "cluster.address=127.0.0.1:1", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "Ray cluster at 127.0.0.1:1: NOT reachable" in plan_field(done.stdout, "cluster")
    assert plan_field(done.stdout, "verdict").startswith("capacity not checked")


def test_the_same_job_with_moe_is_planned_without_a_parameter_count(tmp_path):
    config = load_run_config("demo", job_overrides(tmp_path))
    config.megatron.args += ["--num-experts", "8"]
    from runmgr.megatron.job import aligned

    plan = build_plan(aligned(config), ClusterView("test", 8, 2**40))
    assert plan.parameters is None and plan.memory is None


REMOTE = {"gpu-a 10.0.0.1 (aaaa)": {"CPU": 16.0, "GPU": 4.0}, "gpu-b 10.0.0.2 (bbbb)": {"CPU": 16.0, "GPU": 8.0}}


def remote_job(tmp_path: Path, *overrides: str):
    return load_run_config("demo", [f"run.dir={tmp_path}", "chaos=none", "device=cuda",
                                    "training.global_batch_size=64", *overrides])


@pytest.mark.parametrize("overrides, expected", [
    (["trainer.kind=megatron", "megatron.nproc_per_node=16", "cluster.num_workers=16",
      "cluster.devices_per_worker=1", "cluster.cpus_per_worker=1"],
     "no node can hold one node of megatron.nproc_per_node=16 ranks (CPU 16, GPU 16 on one node = 16 x "
     "cluster.cpus_per_worker 1 and cluster.devices_per_worker 1): the closest, gpu-b 10.0.0.2 (bbbb), has CPU 16, "
     "GPU 8; set megatron.nproc_per_node=8, or lower cluster.cpus_per_worker / cluster.devices_per_worker, or add "
     "nodes that have CPU 16, GPU 16"),
    (["cluster.num_workers=2", "cluster.devices_per_worker=2", "cluster.cpus_per_worker=32"],
     "no node can hold one rank (CPU 32, GPU 2 on one node): the closest, gpu-a 10.0.0.1 (aaaa), has CPU 16, GPU 4; "
     "lower cluster.cpus_per_worker / cluster.devices_per_worker, or add nodes that have CPU 32, GPU 2"),
])
def test_a_bundle_no_node_holds_is_named_with_the_closest_node(tmp_path, overrides, expected):
    assert node_shortfall(remote_job(tmp_path, *overrides), REMOTE, "cuda") == expected


def test_bundles_that_fit_are_no_shortfall_and_too_few_are_counted(tmp_path):
    fours = remote_job(tmp_path, "trainer.kind=megatron", "megatron.nproc_per_node=4", "cluster.num_workers=8",
                       "cluster.devices_per_worker=1")
    assert node_shortfall(fours, REMOTE, "cuda") is None  # one node of 4 ranks on each
    eights = remote_job(tmp_path, "trainer.kind=megatron", "megatron.nproc_per_node=8", "cluster.num_workers=16",
                        "cluster.devices_per_worker=1")
    assert node_shortfall(eights, REMOTE, "cuda").startswith("the nodes hold 1 of the 2 nodes the run needs")


def test_warm_spares_need_room_beside_the_ranks_from_the_first_sub_run(tmp_path):
    """The first sub-run places the spares with the ranks (a bundle each): a cluster that holds the
    ranks but not their spares is refused before the placement, not after its timeout."""
    spared = ["cluster.num_workers=2", "cluster.devices_per_worker=4", "cluster.cpus_per_worker=4",
              "checkpoint.memory_interval=1"]
    assert node_shortfall(remote_job(tmp_path, *spared, "controller.warm_spares=1"), REMOTE, "cuda") is None
    line = node_shortfall(remote_job(tmp_path, *spared, "controller.warm_spares=2"), REMOTE, "cuda")
    assert line == ("the nodes hold 3 of the 4 ranks and warm spares (2 + 2) the run needs (CPU 4, GPU 4 each, on "
                    "one node); lower cluster.cpus_per_worker / cluster.devices_per_worker, or fewer "
                    "controller.warm_spares, or add nodes that have CPU 4, GPU 4")


def test_the_local_cluster_is_seen_node_by_node_from_the_config(tmp_path, monkeypatch):
    from runmgr.dryrun import inspect_cluster

    if "ray" in sys.modules:  # an earlier test of this process may have left Ray connected
        monkeypatch.setattr(sys.modules["ray"], "is_initialized", lambda: False)
    config = load_run_config("demo", [f"run.dir={tmp_path}", "chaos=none"])
    view = inspect_cluster(config.cluster, connect=False)
    assert view.local and [n.name for n in view.nodes] == [f"local node {i} of 3" for i in (1, 2, 3)]
    assert all(n.resources["CPU"] == 1.0 for n in view.nodes)
    assert isinstance(view.nodes[0], NodeView)
