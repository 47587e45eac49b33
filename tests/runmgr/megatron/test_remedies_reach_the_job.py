"""A loss spike's rollback on a Megatron job, from the decision to the node's command line: the
runner that ``runmgr launch`` builds for ``trainer.kind=megatron`` gives the judge the flavor's
abilities, and the next sub-run's torchrun argv (that runner's own ``make_commands``) carries the
plan as the flavor's flags. The controller is stepped over fake groups with queued polls (no Ray
cluster, no process): what a real launch adds is checked once end to end in
tests/e2e/test_megatron_job.py (Megatron-LM's skip) and tests/e2e/test_megatron_standin_chaos.py."""

from __future__ import annotations

from pathlib import Path

from runmgr.config.compose import load_run_config
from runmgr.config.schema import RunConfig
from runmgr.controller.group import GroupPoll
from runmgr.controller.judge import Judge
from runmgr.controller.states import Restarting, Running
from runmgr.megatron.flags import iterations_to_skip
from runmgr.resume import ResumePoint
from runmgr.runners import Runner, megatron_runner
from runmgr.wiring import build_judge
from tests.runmgr.controller.fakes import CHECKPOINTS, FakeGroup, make_controller, step_report
from trainer.plan import ResumePlan

ONSET = 121  # the fake loss jumps from 2 to 6 here and stays up: a persistent spike


def megatron_config(tmp_path: Path, flavor: str) -> RunConfig:
    """The demo as a Megatron job of the built-in trainer (its conf spelled as Megatron's flags)."""
    return load_run_config("demo", [f"run.dir={tmp_path}", "chaos=none", "cluster.local_nodes=1",
                                    "trainer.kind=megatron", f"megatron.flavor={flavor}"])


def judge_of(config: RunConfig, runner: Runner) -> Judge:
    """The judge as the launch builds it (runmgr/wiring.py: the runner's abilities), over the fake
    controller's checkpoints instead of the run directory's."""
    built = build_judge(config, runner, "cpu", None, None)
    return Judge(config.watcher, config.policy, lambda max_step: [c for c in CHECKPOINTS if c.step <= max_step],
                 abilities=built.abilities)


def rolled_back(tmp_path: Path, flavor: str) -> tuple[dict, ResumePlan, tuple[str, ...], int]:
    """A spike met by the demo policy on ``flavor``: the next sub-run's evidence (its decision and
    incident), its plan, the argv of its node and its start step."""
    config = megatron_config(tmp_path, flavor)
    runner = megatron_runner(config, "cpu", None)
    healthy = [step_report(s, 2.0 + 0.01 * (s % 3)) for s in range(1, ONSET)]
    spiking = [GroupPoll(steps=[step_report(s, 6.0)]) for s in range(ONSET, 200)]
    plan = ResumePlan(subrun="1.00", data_parallel_size=runner.data_parallel_sizes[0])
    controller, _ = make_controller([FakeGroup([GroupPoll(steps=healthy), *spiking]), FakeGroup([])], plan=plan,
                                    points={20: ResumePoint("/ck/step_00000020", 20)})
    controller.judge = judge_of(config, runner)
    controller.step()
    while isinstance(controller.state, Running):
        controller.step()
    assert isinstance(controller.state, Restarting), controller.state
    launching = controller.step()
    (command,) = runner.make_group().make_commands(launching.plan, "127.0.0.1", 29500, 1)
    return launching.evidence, launching.plan, command.argv, launching.start_step


def values(argv: tuple[str, ...], name: str) -> list[str]:
    """The values after ``name`` up to the next flag (none when it is absent)."""
    if name not in argv:
        return []
    after = argv[argv.index(name) + 1:]
    return list(after[:next((i for i, item in enumerate(after) if item.startswith("--")), len(after))])


def test_mindspeed_rolls_back_without_a_skip_says_why_and_its_command_resumes_the_checkpoint(tmp_path):
    evidence, plan, argv, start = rolled_back(tmp_path, "mindspeed_llm")
    decision = evidence["decision"]
    assert decision["action"] == "rollback_skip" and plan.skip_ranges == ()
    assert "MindSpeed-LLM" in decision["reason"] and "never reads it" in decision["reason"], decision["reason"]
    assert "--iterations-to-skip" not in argv
    assert values(argv, "--ckpt-step") == [str(start)] == ["20"] and values(argv, "--load") == ["/ck"]


def test_megatron_lm_skips_the_spike_s_samples_as_the_iterations_that_hold_them(tmp_path):
    evidence, plan, argv, start = rolled_back(tmp_path, "megatron_lm")
    assert evidence["decision"]["action"] == "rollback_skip" and plan.skip_ranges
    batch = int(values(argv, "--global-batch-size")[0])
    skipped = [int(i) for i in values(argv, "--iterations-to-skip")]
    assert skipped == iterations_to_skip(plan.skip_ranges, batch, until=int(values(argv, "--train-iters")[0]))
    # Iteration J trains on samples [(J-1) x B, J x B): the onset's is skipped, none the checkpoint trained past.
    assert evidence["incident"]["onset_sample"] // batch + 1 in skipped and min(skipped) > start
    assert values(argv, "--ckpt-step") == [str(start)] and values(argv, "--load") == ["/ck"]
