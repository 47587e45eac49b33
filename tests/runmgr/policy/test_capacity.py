"""Resizes count data-parallel replicas: a lost node takes whole replicas of
tensor x pipeline ranks away, and the size chosen keeps the global batch
divisible by micro batch x data parallel."""

from __future__ import annotations

from runmgr.policy.capacity import Capacity, fit_world
from runmgr.runners import data_parallel_sizes
from trainer.config import ParallelConfig, TrainerConfig, TrainingConfig


def test_a_lost_node_shrinks_data_parallel_to_the_largest_size_the_batch_divides_by():
    # 4 nodes of one rank, DP 4; one out: 3 ranks left, but global 8 / micro 2 allows only 4, 2, 1.
    config = TrainerConfig(training=TrainingConfig(micro_batch_size=2, global_batch_size=8))
    sizes = data_parallel_sizes(config, world_size=4)
    assert sizes == (4, 2, 1)
    resize = fit_world(Capacity({"a": 1, "b": 1, "c": 1, "d": 1}, sizes, current=4), avoid=["b"])
    assert resize.size == 2
    assert resize.note == ("data parallel shrinks 4 -> 2: the nodes left hold 3 rank(s) "
                           "(the global batch is kept by gradient accumulation)")


def test_with_tensor_parallel_a_size_counts_replicas_of_tp_ranks():
    # TP 2 x DP 4 on 4 nodes of 2 ranks: one node out leaves 6 ranks, 3 replicas; the batch allows 2.
    config = TrainerConfig(training=TrainingConfig(micro_batch_size=1, global_batch_size=8),
                           parallel=ParallelConfig(tensor_model_parallel_size=2))
    sizes = data_parallel_sizes(config, world_size=8)
    assert sizes == (4, 2, 1)
    capacity = Capacity({"a": 2, "b": 2, "c": 2, "d": 2}, sizes, current=4, ranks_per_replica=2)
    resize = fit_world(capacity, avoid=["a"])
    assert resize.size == 2 and "6 rank(s), 3 replica(s) of 2" in resize.note


def test_survivors_that_cannot_hold_one_replica_are_refused_in_one_line():
    capacity = Capacity({"a": 2, "b": 2}, (2, 1), current=2, ranks_per_replica=4)
    resize = fit_world(capacity, avoid=["a"])
    assert resize.size is None
    assert resize.note == ("the nodes left hold 2 rank(s), fewer than one data-parallel replica "
                           "(tensor x pipeline parallel = 4 ranks)")


def test_no_size_the_batch_divides_by_is_refused_in_one_line():
    # global 6 / micro 2: DP 3 or 1; DP 3 on 3 nodes, one out: 2 ranks hold DP 1 only.
    config = TrainerConfig(training=TrainingConfig(micro_batch_size=2, global_batch_size=6))
    sizes = data_parallel_sizes(config, world_size=3)
    assert sizes == (3, 1)
    assert fit_world(Capacity({"a": 1, "b": 1, "c": 1}, sizes, current=3), avoid=["a"]).size == 1
    none = fit_world(Capacity({"a": 1, "b": 1, "c": 1}, (3,), current=3), avoid=["a"])
    assert none.size is None and "\n" not in none.note
    assert none.note.startswith("the nodes left hold 2 rank(s) and the trainer needs data parallel 3")


def test_the_plan_is_checked_against_the_data_parallel_size_of_the_config_s_layout():
    from trainer.plan import ResumePlan

    config = TrainerConfig(parallel=ParallelConfig(tensor_model_parallel_size=2))
    plan = ResumePlan(subrun="3.01", data_parallel_size=2)
    assert plan.problems(config.layout(4)) == []
    assert plan.problems(config.layout(2)) == [
        "the plan of sub-run 3.01 asks for data parallel 2, but the 2 ranks started hold data parallel 1 "
        "(dp 1 x tp 2 x pp 1)"]
