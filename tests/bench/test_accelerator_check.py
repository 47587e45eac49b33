"""bench/accelerator_check.py, the check prepared for a lent GPU (issue 31): its dry run takes
every stage's code path on CPU (gloo, tiny sizes, the stand-in Megatron script), so that the
script still works the day a GPU is at hand; the GPU's own sizes compose."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from tests import cli

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "accelerator_check.py"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def check():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        yield importlib.import_module("accelerator_check")
    finally:
        sys.path.remove(str(SCRIPT.parent))


def test_the_dry_run_takes_every_stage_on_cpu_and_leaves_its_figures_in_files(tmp_path, shared_ray):
    out = tmp_path / "report"
    # `python bench/accelerator_check.py ...` as a process of its own, forked from the session's CLI
    # fork server (tests/cli.py: torch and the CLI imported once), not a new Python.
    done = cli.runmgr("--out", str(out), "--dry-run", "--ray-address", shared_ray.address, script=SCRIPT, cwd=ROOT,
                      timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    stages = report["stages"]
    assert list(stages) == ["health", "demo", "throughput", "warm_state", "megatron", "warm_nccl"]
    assert {name: s["status"] for name, s in stages.items()} == dict.fromkeys(stages, "ok"), stages
    markdown = (out / "report.md").read_text()
    assert all(f"## {name}: ok" in markdown for name in stages)

    assert stages["health"]["figures"]["exit_code"] == 0 and stages["health"]["figures"]["admitted"]
    # The one-rank story, each fault at its own step: killed -> restart, hang -> stacks and restart,
    # garbage -> a rollback past it; the resumes repeat the unbroken run's losses up to the skip.
    demo = stages["demo"]["figures"]
    assert demo["exit_codes"] == [0, 0]
    assert demo["incidents"][:3] == ["1.00 worker_death", "1.01 hang", "1.02 loss_spike"], \
        (demo, (out / "demo_chronicle.txt").read_text()[-4000:])
    assert demo["decisions"][:3] == ["1.00 restart", "1.01 dump_and_restart", "1.02 rollback_skip"], demo
    assert demo["identical_losses_until_step"] is not None
    assert 20 < demo["identical_losses_until_step"] <= demo["garbage_at_stream_step"]
    assert "worker_death" in (out / "demo_chronicle.txt").read_text()

    throughput = stages["throughput"]["figures"]
    assert throughput["micro_batch"] == 4 and throughput["tokens_per_s"] > 0 and throughput["mfu"] is None
    assert throughput["dry_run_estimate"].startswith("memory/device") and throughput["peak_memory_gib"] > 0
    warm_state = stages["warm_state"]["figures"]
    assert warm_state["pageable"]["state_gb"] > 0 and warm_state["link"]["pageable_gbps"] > 0
    cost = warm_state["pageable"]["cost_per_step"]
    assert cost["1"] == pytest.approx(10 * cost["10"]) == pytest.approx(100 * cost["100"])

    megatron = stages["megatron"]["figures"]
    # What happened, where it was not what a kill makes: the chronicle and the driver's output.
    story = (out / "megatron_chronicle.txt").read_text()[-4000:] + (out / "megatron.log").read_text()[-3000:]
    assert megatron["incidents"] == ["1.00 worker_death"] and megatron["subruns"] == 2, story
    commands = json.loads((out / "megatron_commands.json").read_text())
    assert [c["subrun"] for c in commands] == ["1.00", "1.01"] and "--save" in commands[1]["argv"]
    warm = stages["warm_nccl"]["figures"]
    assert warm["resumed_from"] == "memory" and warm["steps_lost"] == 0 and warm["replaced_ranks"] == [1], warm
    assert 0 < warm["kill_to_incident_s"] <= warm["kill_to_first_step_s"]


def test_without_a_gpu_and_without_dry_run_it_says_so_in_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the check would run")
    done = cli.runmgr("--out", str(tmp_path), script=SCRIPT, cwd=ROOT, timeout=120)  # forked, as above
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and "--dry-run" in done.stderr


def test_the_gpu_sizes_compose_into_a_one_billion_parameter_llama(check, tmp_path):
    from trainer.shapes import parameter_count

    ctx = check.Context(tmp_path, check.GPU, False, "127.0.0.1:1", None, 1, 0.0)
    config = check.trainer_config_for(ctx, 8, tmp_path / "scratch")
    model = config.model
    assert (model.num_layers, model.hidden_size, model.seq_length) == (22, 2048, 2048)
    assert config.precision.bf16 and config.device.value == "cuda"
    assert 0.9e9 < parameter_count(model) < 1.2e9  # TinyLlama's shape (0.97 B with the byte corpus's 256 tokens)
    schedule, waits = check.paused_schedule(check.GPU.faults)
    from runmgr.config.compose import load_run_config

    run = load_run_config("demo", [schedule, *check.device_overrides(check.GPU), "precision.bf16=true"])
    assert run.cluster.devices_per_worker == 1  # a rank that reserves no GPU sees none
    assert [f.kind.value for f in run.chaos.faults] == ["pause_at_step", "kill_worker", "pause_at_step", "hang_rank",
                                                         "pause_at_step", "garbage_data"]
    assert waits == {"0:pause_at_step@25": "1:kill_worker@25", "2:pause_at_step@45": "3:hang_rank@45",
                     "4:pause_at_step@70": "5:garbage_data@70"}
