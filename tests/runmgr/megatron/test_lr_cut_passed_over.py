"""A Megatron job whose arguments give no ``--lr``, with the demo ladder's LR cut forced past lint:
the second instability in a row passes the ``lower_lr`` rung over to the optimizer reset, with its
reason, and no sub-run's command is ever asked to scale an LR. The runner and the judge are the
ones ``runmgr launch`` builds for ``trainer.kind=megatron`` (the abilities read from the job's own
arguments); the controller is stepped over fake groups with queued polls (no Ray, no process).
That a real stand-in's spikes are detected, rolled back with skips and run to the end is checked
end to end in tests/e2e/test_megatron_unattended.py (the skipped iterations) and the ladder's
flags reaching a real job in tests/e2e/test_megatron_standin_chaos.py."""

from __future__ import annotations

from pathlib import Path

from runmgr.config.compose import load_run_config
from runmgr.config.schema import RunConfig
from runmgr.controller.group import GroupPoll
from runmgr.controller.states import Launching, Restarting, Running
from runmgr.runners import megatron_runner
from runmgr.resume import ResumePoint
from tests.runmgr.controller.fakes import FakeGroup, make_controller, step_report
from tests.runmgr.megatron.test_remedies_reach_the_job import judge_of
from trainer.plan import ResumePlan

STANDIN = Path(__file__).parents[2] / "e2e" / "standin" / "pretrain_gpt.py"
ONSETS = (121, 181)  # the fake loss jumps from 2 to 6 at each and stays up: two persistent spikes


def no_lr_config(tmp_path: Path) -> RunConfig:
    """The stand-in as the e2e case launched it: no --lr in its arguments, the LR cut's lint ignored."""
    args = ["--save", str(tmp_path / "ckpt"), "--train-iters", "300", "--global-batch-size", "8",
            "--save-interval", "10", "--log-interval", "1"]
    return load_run_config("demo", [f"run.dir={tmp_path}", "chaos=none", "cluster.local_nodes=1",
                                    "cluster.num_workers=1", "trainer.kind=megatron", f"megatron.script={STANDIN}",
                                    "megatron.args=[" + ",".join(args) + "]", "lint.ignore=[remedy-lr-cut]"])


def spiking_group(subrun: str, first: int, onset: int) -> FakeGroup:
    """A sub-run's group: healthy steps from ``first`` up to ``onset``, then a loss that stays up."""
    healthy = [step_report(s, 2.0 + 0.01 * (s % 3), subrun) for s in range(first, onset)]
    return FakeGroup([GroupPoll(steps=healthy), *(GroupPoll(steps=[step_report(s, 6.0, subrun)])
                                                  for s in range(onset, onset + 80))])


def run_to_restart(controller) -> Launching:
    """Step ``controller`` until a sub-run ends in a restart; the launch that follows."""
    while isinstance(controller.state, (Launching, Running)):
        controller.step()
    assert isinstance(controller.state, Restarting), controller.state
    launching = controller.step()
    assert isinstance(launching, Launching), launching
    return launching


def test_a_forced_lr_cut_on_a_job_without_lr_is_passed_over_with_its_reason(tmp_path):
    config = no_lr_config(tmp_path)
    runner = megatron_runner(config, "cpu", None)
    assert not runner.abilities.lower_lr  # read from the job's own arguments
    plan = ResumePlan(subrun="1.00", data_parallel_size=runner.data_parallel_sizes[0])
    groups = [spiking_group("1.00", 1, ONSETS[0]), spiking_group("1.01", 21, ONSETS[1]), FakeGroup([])]
    controller, recorder = make_controller(groups, plan=plan, points={20: ResumePoint("/ck/step_00000020", 20)})
    controller.judge = judge_of(config, runner)
    commands = [runner.make_group().make_commands(plan, "127.0.0.1", 29500, 1)]
    for _ in ONSETS:
        launching = run_to_restart(controller)
        commands.append(runner.make_group().make_commands(launching.plan, "127.0.0.1", 29500, 1))
    climbed = [j.decision for j in recorder.judgements if j.decision is not None and j.decision.action != "ignore"]
    assert [d.action for d in climbed] == ["rollback_skip", "reset_optimizer"]
    assert "rung 2 (lower_lr, LR x 0.67) passed over: the job's arguments give no --lr" in climbed[1].reason
    assert climbed[1].lr_factor == 1.0
    for (command,) in commands:
        assert "--lr" not in command.argv  # no sub-run was ever asked to scale one
    assert "--no-load-optim" in commands[-1][0].argv  # the rung it climbed to reaches the job instead
