"""build_chaos: the schedules in conf/chaos, and what prepare() changes before launch."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from runmgr.chaos.build import build_chaos
from runmgr.config.chaos import FAULT_KINDS, OPT_RUN12_CLASSES
from runmgr.config.compose import load_run_config
from runmgr.errors import ConfigError
from tests.runmgr.chaos.test_garbage import Losses
from trainer.data import check_data_path
from trainer.distributed import DistEnv
from trainer.loop import train
from trainer.plan import ResumePlan

CONF = Path(__file__).resolve().parents[3] / "conf" / "chaos"
SMALL_DATA = "data.corpus_max_bytes=300000"


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_each_fault_kind_has_a_schedule_of_its_own_that_fits_the_demo(kind, tmp_path):
    config = load_run_config("demo", [f"chaos={kind}", f"run.dir={tmp_path}"])
    assert {f.kind for f in config.chaos.faults} == {kind}


def test_opt_run12_replays_every_fault_class_of_opts_run_12(tmp_path):
    config = load_run_config("demo", ["chaos=opt_run12", f"run.dir={tmp_path}"])
    kinds = {f.kind for f in config.chaos.faults}
    missing = {name: kind for name, kind in OPT_RUN12_CLASSES.items() if kind not in kinds}
    assert not missing
    assert (CONF / "opt_run12.yaml").read_text().count("12.") >= 8, "each fault says which sub-runs it replays"


def test_chaos_none_turns_the_demo_s_chaos_off(tmp_path):
    config = load_run_config("demo", [f"run.dir={tmp_path}", "chaos=none"])
    chaos = build_chaos(config)
    assert not chaos.enabled and chaos.prepare() == [] and chaos.tools_dir is None
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("faults, message", [
    # OmegaConf checks the kind (an enum) as it merges the list item, so it names the field only.
    ("[{kind: kill_wroker}]", "kind: Invalid value 'kill_wroker', expected one of [kill_worker, hang_rank,"),
    ("[{at_step: 3}]", "missing mandatory value: kind"),
    ("[{kind: kill_worker, steps: 5}]", "chaos.faults[0]: kill_worker does not use steps; remove it"),
    ("[{kind: pause_at_step, rank: 1}]", "chaos.faults[0]: pause_at_step does not use rank; remove it"),
    ("[{kind: pause_at_step, after_seconds: 2}]", "pause_at_step does not use after_seconds"),
    ("[{kind: garbage_data, at_step: 190, steps: 20}]", "reaches step 209 but training.train_iters is 200"),
    ("[{kind: slow_rank, factor: 0.5}]", "slow_rank needs factor > 1"),
    ("[{kind: recurring_instability, steps: 10, every_steps: 5}]", "every_steps > steps"),
])
def test_a_bad_schedule_fails_with_one_line_naming_the_fault(faults, message, tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_run_config("demo", [f"chaos.faults={faults}", f"run.dir={tmp_path}"])
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_prepare_points_the_run_at_the_garbage_copy_and_gives_a_relaunch_the_same(tmp_path):
    config = load_run_config("demo", ["chaos=garbage_data", f"run.dir={tmp_path}", SMALL_DATA])
    overrides = build_chaos(config).prepare()
    [override] = overrides
    assert override.startswith(f"data.data_path={tmp_path.resolve()}/chaos/data/garbage-")
    relaunched = load_run_config("demo", ["chaos=garbage_data", f"run.dir={tmp_path}", SMALL_DATA, *overrides])
    check_data_path(relaunched.data)
    assert build_chaos(relaunched).prepare() == overrides


def test_the_lr_blowup_config_really_diverges_the_run(tmp_path):
    faults = "[{kind: lr_blowup, at_step: 20, factor: 333}]"
    base = ["chaos.faults=" + faults, f"run.dir={tmp_path}", SMALL_DATA, "training.train_iters=25",
            "training.global_batch_size=4", "cluster.num_workers=1"]
    overrides = build_chaos(load_run_config("demo", base)).prepare()
    assert "optim.lr=0.999" in overrides and "optim.lr_warmup_iters=20" in overrides
    config = load_run_config("demo", base + overrides)
    assert build_chaos(config).prepare() == overrides, "a relaunch must not multiply the mistake again"
    trainer_config = replace(config.trainer_config(), checkpoint=replace(config.checkpoint, save=None))
    losses = Losses()
    train(trainer_config, ResumePlan(), losses, DistEnv())
    late = [losses.by_step[s] for s in range(15, 26)]
    # Uniform guessing over 256 bytes costs ln(256) = 5.5; a diverged model does far worse.
    assert min(late) > 1.5 * math.log(256), f"losses {late}"
