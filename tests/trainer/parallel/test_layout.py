"""The layout's rank order: tensor parallel fastest, pipeline slowest (Megatron's)."""

from trainer.config import ParallelConfig, TrainerConfig
from trainer.parallel.layout import Coords, Layout, Sharding


def test_tensor_parallel_ranks_are_neighbours_and_stages_are_blocks_of_ranks():
    layout = Layout(dp=2, tp=2, pp=2)
    assert [layout.coords(rank) for rank in range(4)] == [
        Coords(pp=0, dp=0, tp=0), Coords(pp=0, dp=0, tp=1), Coords(pp=0, dp=1, tp=0), Coords(pp=0, dp=1, tp=1)]
    assert layout.coords(7) == Coords(pp=1, dp=1, tp=1)
    assert [layout.holds_loss(rank) for rank in range(8)] == [False] * 4 + [True] * 4


def test_the_config_names_its_layout():
    config = TrainerConfig(parallel=ParallelConfig(tensor_model_parallel_size=2, use_distributed_optimizer=True))
    layout = config.layout(8)
    assert layout == Layout(dp=4, tp=2, pp=1, sharding=Sharding.zero1)
    assert layout.describe() == "dp 4 x tp 2 x pp 1, zero1" and not layout.plain
    assert TrainerConfig().layout(4).plain


def test_both_sharded_optimizers_at_once_is_a_config_problem():
    config = TrainerConfig(parallel=ParallelConfig(use_distributed_optimizer=True, use_torch_fsdp2=True))
    assert any("choose one" in line for line in config.problems(2))
