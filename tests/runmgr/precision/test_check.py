"""The check run for real on a small config: the trainer's own steps on this
CPU, against another config or against a pinned Megatron log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runmgr.cli import main
from runmgr.precision.protocol import Side, pinned_config
from runmgr.precision.runner import run_stages
from trainer import DistEnv, train

from tests.runmgr.precision.fixtures.make_logs import LONG_STEPS, TINY

FIXTURES = Path(__file__).with_name("fixtures")


def check(capsys, *args: str) -> tuple[int, dict]:
    code = main(["precision-check", "conf=demo", *TINY, *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def verdicts(report: dict) -> dict[str, str]:
    return {stage["stage"]: stage["verdict"] for stage in report["stages"]}


def test_the_runner_takes_the_trainers_own_steps():
    config = pinned_config(Side("demo", TINY), 2, None)
    stages = run_stages(config)
    assert train(config, dist_env=DistEnv()).losses == (stages.loss_step1, stages.loss_step2)


def test_a_config_against_itself_is_the_same_at_every_stage(capsys):
    code, report = check(capsys, "--against", "conf=demo", *TINY, "--steps", "4")
    assert code == 0 and report["first_difference"] is None and report["weights"] == []
    assert verdicts(report) == {"forward": "same", "backward": "same", "optimizer": "same", "long-run": "same"}
    assert len(report["band"]["loss"]) == 4 and report["band"]["source"].startswith("the reference's LR-0 run twice")


def test_weight_decay_on_biases_and_1d_weights_first_differs_at_the_optimizer(capsys):
    code, report = check(capsys, "--against", "conf=demo", *TINY, "optim.decay_1d_weights=true", "--steps", "4")
    assert code == 1 and report["first_difference"] == "optimizer"
    # LR 0 makes the decay 0 too: the long run cannot tell them apart.
    assert verdicts(report) == {"forward": "same", "backward": "same", "optimizer": "differs", "long-run": "same"}
    assert report["weights"] and all(w["measure"] == "update" and "norm" in w["name"] for w in report["weights"])


def test_an_embedding_kept_in_bf16_first_differs_at_the_forward_pass(capsys):
    code, report = check(capsys, "--against", "conf=demo", *TINY, "precision.embedding_bf16=true", "--steps", "4")
    assert code == 1 and report["first_difference"] == "forward"
    assert verdicts(report)["long-run"] == "differs"
    # What to look at: the one weight held in another dtype.
    assert report["dtypes_apart"] == [{"name": "embedding.weight", "a": "float32", "b": "bfloat16"}]


def test_the_table_names_the_first_difference_and_the_weights(capsys):
    code = main(["precision-check", "conf=demo", *TINY, "--against", "conf=demo", *TINY,
                 "optim.decay_1d_weights=true", "--steps", "2"])
    text = capsys.readouterr().out
    assert code == 1
    assert "first difference: optimizer (step-2 loss)" in text and "step-1 update" in text
    assert "another dtype" not in text  # both sides hold every weight in float32
    header = next(line for line in text.splitlines() if line.startswith("stage"))
    assert header.split() == ["stage", "A", "B", "verdict"]


def test_a_megatron_log_of_the_pinned_config_is_the_same_as_printed(capsys):
    code, report = check(capsys, "--against-log", str(FIXTURES / "megatron_pinned.log"))
    assert code == 0 and report["steps"] == LONG_STEPS
    assert verdicts(report) == {"forward": "same", "backward": "same", "optimizer": "same", "long-run": "same"}
    assert all(stage["detail"].startswith("as printed") for stage in report["stages"])


def test_a_megatron_log_with_another_lr_first_differs_at_the_optimizer(capsys):
    code, report = check(capsys, "--against-log", str(FIXTURES / "megatron_lr_0.002.log"))
    assert code == 1 and report["first_difference"] == "optimizer"
    assert verdicts(report) == {"forward": "same", "backward": "same", "optimizer": "differs",
                                "long-run": "not compared"}


def test_steps_shorten_the_logs_long_run(capsys):
    code, report = check(capsys, "--against-log", str(FIXTURES / "megatron_pinned.log"), "--steps", "3")
    assert code == 0 and report["steps"] == 3 and len(report["band"]["loss"]) == 3


@pytest.mark.parametrize("tamper", ["lm loss: 5.470516E+00", "grad norm: 1.065"])
def test_a_log_whose_long_run_moves_differs_there(tmp_path, capsys, tamper):
    text = (FIXTURES / "megatron_pinned.log").read_text()
    lines = text.splitlines()
    # the LR-0 run's first or second iteration, nudged beyond the printing precision
    index = max(i for i, line in enumerate(lines) if tamper in line)
    lines[index] = lines[index].replace(tamper, "lm loss: 5.470600E+00" if "loss" in tamper else "grad norm: 1.070")
    (tmp_path / "moved.log").write_text("\n".join(lines) + "\n")
    code, report = check(capsys, "--against-log", str(tmp_path / "moved.log"))
    assert code == 1 and verdicts(report)["long-run"] == "differs"
