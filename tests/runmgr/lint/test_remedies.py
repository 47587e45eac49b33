"""remedy-lr-cut: a ladder that lowers the LR, for a Megatron job that gives no --lr, is told
at launch; forced with lint.ignore, the policy passes those rungs over (tests/runmgr/policy)."""

from __future__ import annotations

from pathlib import Path

from runmgr.config.compose import load_run_config
from runmgr.lint.run import lint_config
from tests.runmgr.lint.test_launch import runmgr_without_ray

STANDIN = Path(__file__).resolve().parents[2] / "e2e" / "standin" / "pretrain_gpt.py"


def job(tmp_path: Path, *args: str) -> list[str]:
    flags = ["--save", str(tmp_path / "ckpt"), "--train-iters", "40", "--global-batch-size", "8", *args]
    return [f"run.dir={tmp_path}", "chaos=none", "trainer.kind=megatron", f"megatron.script={STANDIN}",
            "megatron.args=[" + ",".join(flags) + "]"]


def rules(tmp_path: Path, *overrides: str) -> list[str]:
    return [f.rule for f in lint_config(load_run_config("demo", [*job(tmp_path), *overrides])).errors]


def test_a_job_without_lr_under_a_ladder_that_cuts_it_is_an_error(tmp_path):
    (finding,) = [f for f in lint_config(load_run_config("demo", job(tmp_path))).errors if f.rule == "remedy-lr-cut"]
    assert "rung 2 (lower_lr, LR x 0.67)" in finding.message and "no --lr" in finding.message


def test_a_job_with_lr_or_a_ladder_without_cuts_is_not(tmp_path):
    assert "remedy-lr-cut" not in [f.rule for f in lint_config(load_run_config(
        "demo", [*job(tmp_path)[:-1], "megatron.args=[--save,/c,--train-iters,40,--global-batch-size,8,--lr,1e-4]"]
    )).errors]
    no_cut = ("policy.instability.ladder=[{action: rollback_skip, max_uses: 3, skip_data: true, lr_factor: 1.0, "
              "clip_grad: null, rewarmup_iters: 0}]")
    assert "remedy-lr-cut" not in rules(tmp_path, no_cut)


def test_launch_refuses_it_in_one_line_before_ray_and_lint_ignore_forces_it(tmp_path):
    refused = runmgr_without_ray("launch", "conf=demo", *job(tmp_path))
    assert refused.returncode == 2 and "ray started" not in refused.stderr
    assert refused.stderr.startswith("runmgr: error: lint error remedy-lr-cut: ")
    assert len(refused.stderr.strip().splitlines()) == 1
    forced = runmgr_without_ray("launch", "conf=demo", *job(tmp_path), "lint.ignore=[remedy-lr-cut]")
    assert "ray started" in forced.stderr  # past the lint: the launch goes on to start Ray
