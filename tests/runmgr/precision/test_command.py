"""Bad input to ``runmgr precision-check``: one line on stderr, exit code 2, nothing run."""

from __future__ import annotations

from pathlib import Path

import pytest

from runmgr.cli import main

FIXTURES = Path(__file__).with_name("fixtures")
ITERATION = (" [2026-01-01 00:00:0{s}] iteration {i:8d}/      10 | consumed samples: {c:12d} | learning rate: "
             "3.000000E-03 | global batch size:     4 | lm loss: 5.470516E+00 | loss scale: 1.0 | grad norm: 1.096 |")


def refused(capsys, *args: str) -> str:
    assert main(["precision-check", *args]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def log(tmp_path: Path, *iterations: int) -> str:
    path = tmp_path / "job.log"
    path.write_text("".join(ITERATION.format(s=n % 10, i=i, c=4 * i) + "\n" for n, i in enumerate(iterations)))
    return str(path)


def test_the_other_side_must_be_named(capsys):
    assert "name the other side: --against conf=B" in refused(capsys, "conf=demo")


def test_the_reference_must_name_one_config(capsys):
    assert "the reference (before --against) must name exactly one config" in refused(
        capsys, "model.num_layers=2", "--against", "conf=demo")


def test_against_and_against_log_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["precision-check", "conf=demo", "--against", "conf=demo", "--against-log", "x.log"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not allowed with argument" in err


def test_steps_must_be_positive(capsys):
    assert "--steps must be a positive number" in refused(capsys, "conf=demo", "--against", "conf=demo",
                                                         "--steps", "0")


def test_an_unknown_conf_is_named(capsys):
    assert "unknown conf 'nope'" in refused(capsys, "conf=demo", "--against", "conf=nope", "--steps", "1")


def test_a_pinned_key_is_refused(capsys):
    assert "pins model.num_layers=2" in refused(capsys, "conf=demo", "model.num_layers=4", "--against", "conf=demo")


def test_a_missing_log(capsys, tmp_path):
    assert "no such file" in refused(capsys, "conf=demo", "--against-log", str(tmp_path / "none.log"))


def test_a_log_without_iteration_lines(capsys, tmp_path):
    (tmp_path / "empty.log").write_text("building GPT model ...\n")
    assert "holds no Megatron iteration line" in refused(capsys, "conf=demo", "--against-log",
                                                         str(tmp_path / "empty.log"))


def test_a_log_that_skips_iterations_needs_log_interval_1(capsys, tmp_path):
    assert "--log-interval 1" in refused(capsys, "conf=demo", "--against-log", log(tmp_path, 1, 3))


def test_a_log_that_starts_after_iteration_1(capsys, tmp_path):
    assert "starts at iteration 5, not 1" in refused(capsys, "conf=demo", "--against-log", log(tmp_path, 5, 6))


def test_a_log_with_two_runs_at_an_lr(capsys, tmp_path):
    assert "give at most one of each" in refused(capsys, "conf=demo", "--against-log", log(tmp_path, 1, 2, 1, 2))


def parsed(*args: str):
    from runmgr.cli import build_parser

    return build_parser().parse_args(["precision-check", "conf=demo", *args])


def test_thorough_is_the_guides_1000_steps_and_the_default_stays_short():
    from runmgr.precision.command import long_run_steps

    assert long_run_steps(parsed("--against", "conf=demo", "--thorough")) == 1000
    assert long_run_steps(parsed("--against", "conf=demo")) is None  # the default's 100
    assert long_run_steps(parsed("--against", "conf=demo", "--steps", "7")) == 7


def test_thorough_beside_steps_or_a_log_is_refused(capsys, tmp_path):
    assert "give --thorough or --steps 10, not both" in refused(capsys, "conf=demo", "--against", "conf=demo",
                                                                 "--thorough", "--steps", "10")
    assert "--thorough is for --against" in refused(capsys, "conf=demo", "--against-log", log(tmp_path, 1, 2),
                                                   "--thorough")


def test_the_long_runs_report_progress_each_tenth_with_the_time_left():
    from runmgr.precision.check import StepProgress

    lines, now = [], [0.0]
    progress = StepProgress(40, lines.append, clock=lambda: now[0])
    for _ in range(40):
        now[0] += 1.0  # a second a step
        progress.step()
    assert len(lines) == 10 and lines[0].startswith("precision-check: 4/40 steps at LR 0 done (")
    assert lines[0].endswith("about 36 s left)")  # 4 s for 4 steps: 36 s for the 36 left
    assert lines[-1].startswith("precision-check: 40/40 steps") and lines[-1].endswith("about 0 s left)")
