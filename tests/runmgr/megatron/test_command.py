"""One node's torchrun command: argv, the device layer's environment under the user's, secrets masked."""

from __future__ import annotations

import pytest

from runmgr.config.megatron import MegatronConfig, MegatronFlavor
from runmgr.megatron.command import node_command


def test_the_argv_starts_torchrun_on_the_nodes_rank_with_the_subruns_rendezvous(tmp_path):
    job = MegatronConfig(script=str(tmp_path / "pretrain_gpt.py"), nproc_per_node=4)
    command = node_command(job, ["--save", "/ckpt"], nnodes=2, node_rank=1, master_addr="10.0.0.1",
                           master_port=29500, device_kind="cpu", python="/py")
    assert command.argv == ("/py", "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", "1",
                            "--nproc-per-node", "4", "--master-addr", "10.0.0.1", "--master-port", "29500",
                            "--max-restarts", "0", str(tmp_path / "pretrain_gpt.py"), "--save", "/ckpt")


@pytest.mark.parametrize("script, target", [(None, ("-m", "trainer")), ("-m megatron_job", ("-m", "megatron_job"))])
def test_a_module_runs_with_dash_m(script, target):
    command = node_command(MegatronConfig(script=script), [], 1, 0, "127.0.0.1", 1, "cpu", python="/py")
    assert command.argv[-2:] == target


def test_the_environment_is_the_device_layers_then_the_users():
    job = MegatronConfig(flavor=MegatronFlavor.mindspeed_llm, env={"HCCL_CONNECT_TIMEOUT": "600", "X": "1"})
    env = node_command(job, [], 1, 0, "127.0.0.1", 1, "npu").env
    assert env["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True" and env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert env["HCCL_CONNECT_TIMEOUT"] == "600" and env["X"] == "1"  # the user's value wins
    assert node_command(MegatronConfig(), [], 1, 0, "127.0.0.1", 1, "cuda").env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def test_a_node_rank_outside_the_job_is_refused():
    with pytest.raises(ValueError, match="node rank 2"):
        node_command(MegatronConfig(), [], 2, 2, "127.0.0.1", 1, "cpu")


def test_masked_hides_secret_variables_and_argument_values_but_nothing_else():
    job = MegatronConfig(env={"WANDB_API_KEY": "k1", "HF_TOKEN": "t", "AWS_SECRET_ACCESS_KEY": "s",
                              "NCCL_DEBUG": "WARN"})
    args = ["--wandb-api-key", "abc", "--hub-token=xyz", "--save", "/ckpt", "--lr", "1e-4"]
    masked = node_command(job, args, 1, 0, "127.0.0.1", 1, "cpu", python="/py").masked()
    assert masked["env"] == {"WANDB_API_KEY": "***", "HF_TOKEN": "***", "AWS_SECRET_ACCESS_KEY": "***",
                             "NCCL_DEBUG": "WARN"}
    assert masked["argv"][-7:] == ["--wandb-api-key", "***", "--hub-token=***", "--save", "/ckpt", "--lr", "1e-4"]
    assert masked["node_rank"] == 0 and "abc" not in str(masked) and "xyz" not in str(masked)


def test_each_rank_runs_its_share_of_the_nodes_cpus_unless_the_user_says_otherwise(tmp_path):
    # Ray sets the node actor's OMP_NUM_THREADS to the whole node's CPUs and torchrun keeps it:
    # two ranks of 2 CPUs each would each run 4 threads on the node's 4 CPUs.
    from runmgr.config.compose import load_run_config
    from runmgr.runners import megatron_runner
    from trainer.plan import ResumePlan

    def commands(*overrides: str):
        config = load_run_config("demo", [f"run.dir={tmp_path}", "chaos=none", "trainer.kind=megatron",
                                          "cluster.num_workers=2", "megatron.nproc_per_node=2",
                                          "cluster.cpus_per_worker=2", *overrides])
        return megatron_runner(config, "cpu", None).make_group().make_commands(ResumePlan(), "127.0.0.1", 29500, 1)

    (command,) = commands()
    assert command.env["OMP_NUM_THREADS"] == "2"
    (command,) = commands("megatron.env.OMP_NUM_THREADS=8")
    assert command.env["OMP_NUM_THREADS"] == "8"
    assert "OMP_NUM_THREADS" not in node_command(MegatronConfig(), [], 1, 0, "127.0.0.1", 1, "cpu").env
