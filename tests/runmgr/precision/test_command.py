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
