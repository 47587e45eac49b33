"""Bad input is one line naming the problem, exit code 2, no traceback; and
``--dry-run`` tells the truth about the 175B plan on this machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import cli

ROOT = Path(__file__).resolve().parents[2]


def runmgr(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return cli.runmgr(*args, cwd=cwd, timeout=120)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["conf=demo", "training.bogus=1"], "unknown config key 'training.bogus'"),
        (["conf=demo", "training.train_iters=many"], "training.train_iters"),
        (["conf=demo", "model.hidden_size=-8"], "model.hidden_size must be a positive integer"),
        (["conf=demo", "training.global_batch_size=12"], "must be divisible by micro_batch_size x data-parallel size"),
        (["conf=demo", "data.data_path=/nonexistent/corpus"], "/nonexistent/corpus"),
        (["conf=nosuchconf"], "unknown conf 'nosuchconf'"),
        (["conf=demo", "cluster.address=127.0.0.1:1"], "cannot reach the Ray cluster at 127.0.0.1:1"),
        (["conf=demo", "model=nosuchmodel"], "unknown model 'nosuchmodel'"),
        (["run.name=x"], "name exactly one config"),
        (["conf=demo", "training.train_iters"], "write overrides as key=value"),
        (["conf=demo", "policy.instability.ladder.1.lr_factor=0.1"],
         "policy.instability.ladder is a list, set it whole, e.g. policy.instability.ladder=[...]"),
        (["conf=demo", "kubernetes.replace_excluded_nodes=true"],
         "kubernetes.replace_excluded_nodes=true needs the run on a KubeRay cluster"),
        (["conf=demo", "kubernetes.replacement_timeout_s=0"], "kubernetes.replacement_timeout_s must be"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args, expected, tmp_path):
    result = runmgr("launch", *args, f"run.dir={tmp_path / 'run'}")
    assert_one_line_error(result, expected)
    assert not (tmp_path / "run").exists()  # nothing was started or written


def test_an_unknown_subcommand_is_one_line():
    assert_one_line_error(runmgr("lanch", "conf=demo"), "invalid choice")


def assert_one_line_error(result: subprocess.CompletedProcess, expected: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]
    assert "Traceback" not in result.stderr + result.stdout


def test_dry_run_of_run12_prints_the_175b_plan_and_says_it_cannot_run_here():
    result = runmgr("launch", "conf=run12", "--dry-run")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "world size 992 = TP 8 x PP 1 x DP 124" in out
    params = int(out.split("parameters")[1].split("(")[0].replace(",", "").strip())
    assert 170e9 < params < 180e9
    assert "GiB per cuda device" in out
    assert "CANNOT run on the cluster in view" in out and "992" in out


def test_dry_run_of_the_demo_fits_this_machine():
    result = runmgr("launch", "conf=demo", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "accumulation 2" in result.stdout and "fits" in result.stdout


def test_status_of_an_unknown_run_is_one_line(tmp_path):
    assert_one_line_error(runmgr("status", "nosuchrun", "--json", cwd=tmp_path), "no run 'nosuchrun'")


def test_watch_replay_of_a_megatron_log_with_a_spike_prints_the_incident_and_the_decision():
    fixtures = ROOT / "tests" / "runmgr" / "watch" / "fixtures"
    spiky = runmgr("watch", "replay", str(fixtures / "megatron_spike.log"))
    assert spiky.returncode == 0, spiky.stderr
    assert "loss_spike at step 4211" in spiky.stdout and "-> rollback_skip" in spiky.stdout
    clean = runmgr("watch", "replay", str(fixtures / "megatron_clean.log"))
    assert clean.returncode == 0, clean.stderr
    assert "no incidents" in clean.stdout and "->" not in clean.stdout


def test_watch_replay_of_a_missing_file_is_one_line():
    assert_one_line_error(runmgr("watch", "replay", "/nonexistent/train.log"), "/nonexistent/train.log")


# ---- what a new user following the README met --------------------------------------------------


def test_version():
    result = runmgr("--version")
    assert result.returncode == 0 and result.stdout.strip() == "runmgr 0.1.0"


def test_dry_run_may_come_anywhere_on_the_line():
    result = runmgr("launch", "conf=demo", "--dry-run", "training.train_iters=40", "chaos=none")
    assert result.returncode == 0, result.stderr
    assert "verdict" in result.stdout and "40" in result.stdout


def test_items_after_a_flag_keep_their_order_and_stray_flags_are_refused():
    from runmgr.cli import build_parser, parse_args

    args = parse_args(build_parser(), ["launch", "conf=demo", "a=1", "--dry-run", "a=2", "b=3"])
    assert args.dry_run and args.items == ["conf=demo", "a=1", "a=2", "b=3"]  # the later a= wins in Hydra
    assert_one_line_error(runmgr("launch", "conf=demo", "--dry-run", "--bogus"), "unrecognized arguments: --bogus")
    assert_one_line_error(runmgr("status", "x", "extra"), "unrecognized arguments: extra")


def test_prepare_data_takes_the_options_the_readme_gives(tmp_path):
    (tmp_path / "a.txt").write_text("hello\n", encoding="utf-8")
    result = runmgr("prepare-data", "--input", str(tmp_path / "a.txt"), "--output-prefix", str(tmp_path / "ds"))
    assert result.returncode == 0, result.stderr
    assert "1 documents" in result.stdout and "model.vocab_size=256" in result.stdout
    assert (tmp_path / "ds.bin").read_bytes() == b"hello\n\x00"
    assert_one_line_error(runmgr("prepare-data", "--input", str(tmp_path / "a.txt")),
                          "the following arguments are required: --output-prefix")


@pytest.fixture
def logbook_run(tmp_path):
    from tests.logbook.conftest import write_controller_run

    return write_controller_run(tmp_path / "runs" / "demo").run_dir


def test_logbook_list_takes_a_run_or_a_folder_of_runs(logbook_run):
    runs = logbook_run.parent
    subruns = runmgr("logbook", "list", "demo", cwd=runs.parent)  # as the README writes it
    assert subruns.returncode == 0, subruns.stderr
    lines = subruns.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["1.00", "1.01", "1.02"]
    assert "restarting" in lines[0] and "failed" in lines[2] and "worker_death" in lines[1]
    for where in ([], [str(runs)]):
        folder = runmgr("logbook", "list", *where, cwd=runs.parent)
        assert folder.returncode == 0 and folder.stdout.split()[:4] == ["demo", "failed", "3", "sub-runs"]


def test_logbook_list_and_show_json_and_the_flags_they_refuse(logbook_run):
    import json

    runs = logbook_run.parent
    listed = runmgr("logbook", "list", str(runs), "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout)["last_step"] == 36
    shown = runmgr("logbook", "show", str(logbook_run), "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["state"] == "failed"
    assert_one_line_error(runmgr("logbook", "list", str(logbook_run), "--json"), "`list --json` lists the runs")
    assert_one_line_error(runmgr("logbook", "show", str(logbook_run), "--json", "--full"),
                          "`show --json` is always whole")


def test_logbook_events_is_text_and_json_only_when_asked(logbook_run):
    import json

    text = runmgr("logbook", "events", str(logbook_run))
    assert text.returncode == 0, text.stderr
    assert not any(line.startswith("{") for line in text.stdout.splitlines())
    assert "1.00   incident worker_death: rank 1 on" in text.stdout
    assert "1.02   end: failed at step 36" in text.stdout
    jsonl = runmgr("logbook", "events", str(logbook_run), "--json")
    events = [json.loads(line) for line in jsonl.stdout.splitlines()]
    assert len(events) == len(text.stdout.splitlines()) and events[0]["type"] == "subrun_start"


@pytest.mark.parametrize("command", [["show"], ["show", "--full"], ["events"], ["events", "--json"],
                                     ["metrics", "--json"], ["list"]])
def test_a_reader_that_goes_away_ends_the_command_quietly(logbook_run, command):
    # `runmgr logbook show RUN | head`: a pipe whose reader is gone before the first write.
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "-m", "runmgr", "logbook", command[0], str(logbook_run),
                                 *command[1:]], stdout=write_end, stderr=subprocess.PIPE, text=True,
                                cwd=ROOT, timeout=120)
    finally:
        os.close(write_end)
    assert result.stderr == "" and result.returncode == 141


def test_logbook_norms_needs_its_step_and_its_flags_belong_to_it_alone(logbook_run):
    assert_one_line_error(runmgr("logbook", "norms", str(logbook_run)), "needs the step to look around: --step N")
    assert_one_line_error(runmgr("logbook", "show", str(logbook_run), "--step", "5"),
                          "runmgr logbook show: error: unrecognized arguments: --step 5; --step is for "
                          "`runmgr logbook norms`")
    # This logbook was written without local norms: one line saying how they are recorded.
    assert_one_line_error(runmgr("logbook", "norms", str(logbook_run), "--step", "5"), "no local norms in the logbook")


LOGBOOK_OPTIONS = {
    "show": {"--full", "--json"},
    "events": {"--json"},
    "metrics": {"--json", "--all"},
    "list": {"--json"},
    "skipped": {"--limit", "--chars"},
    "salvage": set(),
    "plot": {"--metric", "--out", "--html", "--x"},
    "export": {"--format", "--out"},
    "serve": {"--host", "--port"},
    "compare": {"--baseline", "--plot", "--json"},
    "norms": {"--step", "--threshold", "--subrun", "--json"},
}
"""Each ``runmgr logbook`` action and the options it takes, besides ``-h/--help``."""


def help_options(*command: str) -> set[str]:
    import contextlib
    import io
    import re

    from runmgr.cli import build_parser

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
        build_parser().parse_args([*command, "--help"])
    assert stop.value.code == 0
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", out.getvalue())) - {"--help"}


def test_logbook_has_these_actions_and_no_option_of_its_own(capsys):
    import re

    assert help_options("logbook") == set()
    with pytest.raises(SystemExit):
        main_in_process(["logbook", "frob"])
    (choices,) = re.findall(r"choose from (.*?)\)", capsys.readouterr().err)
    assert set(re.findall(r"'(\w+)'", choices)) == set(LOGBOOK_OPTIONS)


def main_in_process(argv: list[str]) -> int:
    from runmgr.cli import main

    return main(argv)


@pytest.mark.parametrize("action", list(LOGBOOK_OPTIONS))
def test_each_logbook_action_s_help_lists_only_its_own_options(action):
    assert help_options("logbook", action) == LOGBOOK_OPTIONS[action]


@pytest.mark.parametrize("action, stray", [(action, stray) for action, own in LOGBOOK_OPTIONS.items()
                                           for stray in sorted(set().union(*LOGBOOK_OPTIONS.values()) - own)])
def test_an_option_of_another_logbook_action_is_one_line_naming_it_and_who_takes_it(action, stray, capsys):
    runs = {"compare": ["runs/a", "runs/b"], "list": [], "serve": []}.get(action, ["runs/a"])
    with pytest.raises(SystemExit) as stop:
        main_in_process(["logbook", action, *runs, stray])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"runmgr logbook {action}: error: ") and stray in err, err
    owners = [other for other, own in LOGBOOK_OPTIONS.items() if stray in own]
    assert f"{stray} is for `runmgr logbook {owners[0]}`" in err, err
    assert err.rstrip().endswith(f"(see `runmgr logbook {action} --help`)"), err


def test_a_stray_option_as_a_user_types_it(logbook_run):
    result = runmgr("logbook", "list", str(logbook_run.parent), "--full")
    assert_one_line_error(result, "runmgr logbook list: error: unrecognized arguments: --full; --full is for "
                                  "`runmgr logbook show`")
    assert_one_line_error(runmgr("logbook", "show", str(logbook_run), str(logbook_run)),
                          "runmgr logbook show: error: unrecognized arguments: ")
    assert_one_line_error(runmgr("logbook", "compare", str(logbook_run)),
                          "runmgr logbook compare: error: the following arguments are required: RUN_B")
    assert_one_line_error(runmgr("logbook", "frob", str(logbook_run)), "argument action: invalid choice: 'frob'")
