"""Bad input, every kind, through the real command: one line on stderr, exit
code 2, no traceback, and nothing written (no run directory, no file changed
in the folder it runs in).

Each case is a real process of its own: `python -m runmgr ...` forked from one
that imported runmgr's CLI once (the session's CLI fork server, tests/cli.py: a
second of Python's and the imports' start-up per case was most of this module's
time), two at a time once for the module; each case is then its own test item. A few cases
(:data:`SUBPROCESS_CASES`) also run as a plain `python -m runmgr` subprocess,
the command exactly as a user types it."""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from logbook import LOGBOOK_FILENAME
from tests import cli
from tests.faults.test_damaged_logbook import garble, write_lineage

ROOT = Path(__file__).resolve().parents[2]
CASE_TIMEOUT_S = 120  # a refusal takes about a second; this bounds a loaded machine
NAN_INF = [f"{key}={value}" for key, value in [
    ("optim.lr", "nan"), ("optim.lr", "inf"), ("optim.adam_eps", "nan"), ("optim.min_lr", "nan"),
    ("optim.clip_grad", "nan"), ("optim.weight_decay", "-inf"), ("optim.adam_beta2", "nan"),
    ("optim.lr_warmup_fraction", "nan"), ("model.norm_epsilon", "nan"), ("model.rotary_base", "inf"),
    ("model.init_method_std", "-inf"), ("model.hidden_dropout", "nan"), ("precision.initial_loss_scale", "inf"),
    ("precision.min_loss_scale", "nan"), ("parallel.dist_timeout_s", "inf"), ("cluster.cpus_per_worker", "nan"),
    ("cluster.cpus_per_worker", "inf"), ("controller.poll_interval_s", "nan"), ("controller.worker_lease_s", "inf"),
    ("controller.start_timeout_s", "-inf"), ("watcher.loss_spike.z_threshold", "inf"),
    ("watcher.hang.step.max_s", "nan"), ("watcher.straggler.ratio", "-inf"),
    ("policy.restarts.launch_retry_wait_s", "inf"), ("policy.hardware.straggler_window_s", "nan"),
    ("health.poll_interval_s", "-inf"), ("health.node_timeout_s", "nan"), ("health.fleet.mad_k", "inf"),
]] + ["chaos.faults=[{kind: slow_rank, at_step: 5, duration_s: nan}]",
      "chaos.faults=[{kind: slow_rank, at_step: 5, factor: inf}]"]
NEGATIVE_OR_ZERO = ["training.train_iters=-1", "training.micro_batch_size=0", "training.global_batch_size=-8",
                    "model.hidden_size=-64", "model.num_layers=0", "cluster.num_workers=0", "cluster.local_nodes=-1",
                    "checkpoint.keep_last=-1", "checkpoint.save_interval=-5", "data.corpus_max_bytes=-1",
                    "training.log_interval=0", "training.seed=-1", "run.number=-1", "cluster.local_num_cpus=0",
                    "optim.lr_decay_iters=-5", "controller.poll_interval_s=0", "run.number=99999999999999999999",
                    "chaos.seed=-1"]
WRONG_TYPES_AND_KEYS = ["training.train_iters=abc", "training.train_iters=1.5", "optim.lr=fast",
                        "training.deterministic=maybe", "model.family=gpt", "device=tpu",
                        "cluster.placement_strategy=RANDOM", "cluster.num_workers=[1,2]", "watcher.loss_spike=3",
                        "optim.learning_rate=1", "nosuchsection.x=1", "watcher.loss_spike.zz=1", "+foo=1",
                        "~optim.lr", "optim.lr", "chaos.faults=[{kind: nope}]", "model=nope"]
NAMES_AND_PATHS = ["run.name=..", "run.name=.", "run.name=a\nb", "run.name=a/b", "run.name=", "run.name=-x",
                   "run.name=.hidden", "run.dir=/proc/x", "run.dir={ws}/afile", "checkpoint.save=/proc/x",
                   "data.data_path=/nonexistent/x", "cluster.address=foo"]

SHORT_RUN = ["chaos=none", "health.skip=true", "cluster.local_nodes=1", "training.train_iters=2"]
"""Before each bad setting (the last one given wins): should runmgr ever accept it, the run it
starts is short and its case fails on the exit code instead of timing out."""

CASES: dict[str, list[str]] = {
    **{f"launch {o}": ["launch", "conf=demo", *SHORT_RUN, o] for o in NAN_INF + NEGATIVE_OR_ZERO
       + WRONG_TYPES_AND_KEYS + NAMES_AND_PATHS},
    "launch --dry-run optim.lr=nan": ["launch", "--dry-run", "conf=demo", "optim.lr=nan"],
    "launch conf=nope": ["launch", "conf=nope"],
    "launch without conf": ["launch", "optim.lr=1"],
    "launch two confs": ["launch", "conf=demo", "conf=demo"],
    "launch missing --config-dir": ["launch", "conf=demo", "--config-dir", "/nonexistent"],
    "launch YAML syntax error": ["launch", "conf=yamlerr", "--config-dir", "{ws}/conf"],
    "launch YAML list": ["launch", "conf=listy", "--config-dir", "{ws}/conf"],
    "launch YAML unknown key": ["launch", "conf=unknownkey", "--config-dir", "{ws}/conf"],
    "launch YAML wrong type": ["launch", "conf=wrongtype", "--config-dir", "{ws}/conf"],
    "launch YAML error in a group": ["launch", "conf=demo", "health=broken", "--config-dir", "{ws}/conf"],
    "launch damaged logbook": ["launch", "conf=demo", "run.dir={ws}/runs/damaged", "chaos=none"],
    "launch --bogus": ["launch", "conf=demo", "--bogus"],
    "status damaged status.json": ["status", "{ws}/runs/status_bad"],
    "status status.json a list": ["status", "{ws}/runs/status_list"],
    "status status.json bad pid": ["status", "{ws}/runs/status_pid", "--json"],
    "status no such run": ["status", "nope"],
    "status without run": ["status"],
    **{f"logbook {a} damaged": ["logbook", a, "{ws}/runs/damaged"]
       for a in ("show", "metrics", "events", "list", "skipped")},
    "logbook show not sqlite": ["logbook", "show", "{ws}/runs/notsqlite"],
    "logbook show no such run": ["logbook", "show", "nope"],
    "logbook metrics without run": ["logbook", "metrics"],
    "logbook salvage not sqlite": ["logbook", "salvage", "{ws}/runs/notsqlite"],
    "logbook salvage healthy": ["logbook", "salvage", "{ws}/runs/healthy"],
    "logbook salvage no such run": ["logbook", "salvage", "nope"],
    "logbook list no folder": ["logbook", "list", "{ws}/nope"],
    "logbook frob": ["logbook", "frob", "x"],
    "logbook show --bogus": ["logbook", "show", "{ws}/runs/healthy", "--bogus"],
    "logbook skipped --limit abc": ["logbook", "skipped", "{ws}/runs/healthy", "--limit", "abc"],
    "watch replay missing file": ["watch", "replay", "/nonexistent.jsonl"],
    "watch replay empty file": ["watch", "replay", "{ws}/empty.jsonl"],
    "watch replay binary file": ["watch", "replay", "{ws}/garbage.bin"],
    "watch replay unknown conf": ["watch", "replay", "{ws}/empty.jsonl", "conf=nope"],
    "watch replay nan threshold": ["watch", "replay", "{ws}/empty.jsonl", "conf=demo",
                                   "watcher.loss_spike.z_threshold=nan"],
    "watch without subcommand": ["watch"],
    "watch frob": ["watch", "frob"],
    "prepare-data missing input": ["prepare-data", "--input", "/nonexistent", "--output-prefix", "{ws}/out/x"],
    "prepare-data without options": ["prepare-data"],
    "health-check --bogus": ["health-check", "--bogus"],
    "health-check YAML syntax error": ["health-check", "conf=yamlerr", "--config-dir", "{ws}/conf"],
    "unknown subcommand": ["frobnicate"],
    "no subcommand": [],
}


SUBPROCESS_CASES = ["launch optim.lr=nan", "launch run.name=..", "launch --bogus", "status no such run",
                    "logbook show damaged", "no subcommand"]
"""Also run as a plain `python -m runmgr` subprocess: one of each way a refusal is made."""


def write_workspace(ws: Path) -> None:
    """The folder the commands run in: bad config files, damaged run files, odd inputs."""
    conf = ws / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (conf / "yamlerr.yaml").write_text("defaults:\n  - model: tiny_llama\noptim: {lr: [1, \n")
    (conf / "listy.yaml").write_text("- 1\n- 2\n")
    (conf / "unknownkey.yaml").write_text("optim:\n  lrr: 1\n")
    (conf / "wrongtype.yaml").write_text("training:\n  train_iters: many\n")
    (conf / "health" / "broken.yaml").write_text("poll_interval_s: [\n")
    runs = ws / "runs"
    for name, text in {"status_bad": '{"state": "runn', "status_list": "[1, 2]",
                       "status_pid": '{"state": "running", "driver_pid": "abc", "workers": []}'}.items():
        (runs / name).mkdir(parents=True)
        (runs / name / "status.json").write_text(text)
    (runs / "notsqlite").mkdir()
    (runs / "notsqlite" / LOGBOOK_FILENAME).write_bytes(b"not a logbook " * 100)
    write_lineage(runs / "healthy")
    write_lineage(runs / "damaged")
    garble(runs / "damaged" / LOGBOOK_FILENAME)
    (ws / "afile").write_text("a file, not a directory\n")
    (ws / "empty.jsonl").write_text("")
    (ws / "garbage.bin").write_bytes(bytes(range(256)) * 16)


def snapshot(ws: Path) -> dict[str, str]:
    """Every path under ``ws`` with a hash of its contents ('dir' for folders)."""
    return {str(p.relative_to(ws)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(ws.rglob("*"))}


def run_case(ws: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """The command in its own session, so that whatever it started goes with it on a timeout."""
    env = {k: v for k, v in os.environ.items() if k != "RUNMGR_CONF_DIR"}  # the repository's conf/ by default
    args = [sys.executable, "-m", "runmgr", *[a.replace("{ws}", str(ws)) for a in argv]]
    proc = subprocess.Popen(args, cwd=ws, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=CASE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n(test: still running after {CASE_TIMEOUT_S} s: accepted and started?)"
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def run_forked_cases(ws: Path, cases: dict[str, list[str]]) -> dict[str, subprocess.CompletedProcess]:
    """Every case as its own process forked by the session's CLI fork server (tests/cli.py), two at a time."""
    env = {k: v for k, v in os.environ.items() if k != "RUNMGR_CONF_DIR"}  # the repository's conf/ by default
    argvs = {name: [a.replace("{ws}", str(ws)) for a in argv] for name, argv in cases.items()}
    codes = cli.runmgr_all(list(argvs.values()), ws, env, CASE_TIMEOUT_S)
    results = {}
    for i, (name, argv) in enumerate(argvs.items()):
        out_path, err_path = cli.output_paths(ws, i)
        out, err = out_path.read_text(), err_path.read_text()
        if codes[i] is None:
            err += f"\n(test: still running after {CASE_TIMEOUT_S} s: accepted and started?)"
        results[name] = subprocess.CompletedProcess(["runmgr", *argv], codes[i], out, err)
    return results


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict:
    ws = tmp_path_factory.mktemp("workspace")
    write_workspace(ws)
    before = snapshot(ws)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:  # beside the forked ones
        plain = pool.map(lambda name: run_case(ws, CASES[name]), SUBPROCESS_CASES)
        results = run_forked_cases(ws, CASES)
        subprocess_results = dict(zip(SUBPROCESS_CASES, plain))
    return {"results": results, "subprocess_results": subprocess_results, "before": before, "after": snapshot(ws),
            "ws": ws}


def test_there_are_at_least_70_kinds_of_bad_input():
    assert len(CASES) >= 70


def assert_one_line_and_exit_2(result: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:], result.stdout[-2000:])
    assert len(result.stderr.splitlines()) == 1 and result.stderr.strip(), result.stderr
    assert result.stdout == "", result.stdout


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_exit_2(outcomes, case):
    assert_one_line_and_exit_2(outcomes["results"][case])


@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_bad_input_through_a_plain_python_m_runmgr(outcomes, case):
    """The same as a user's own `python -m runmgr` process, and the same line as the forked case's."""
    result = outcomes["subprocess_results"][case]
    assert_one_line_and_exit_2(result)
    assert result.stderr == outcomes["results"][case].stderr


def test_nothing_is_written(outcomes):
    before, after = outcomes["before"], outcomes["after"]
    assert sorted(set(after) - set(before)) == [], "created"
    assert sorted(set(before) - set(after)) == [], "removed"
    assert [p for p in before if before[p] != after[p]] == [], "changed"


@pytest.mark.parametrize("steps", [10, 150], ids=["output-in-one-buffer", "output-beyond-the-pipe"])
def test_a_reader_that_went_away_is_no_error(tmp_path, steps):
    """`runmgr logbook metrics RUN | head`: the reader is gone before the output
    ends; runmgr stops quietly with 141 (128 + SIGPIPE), as `cat` would."""
    from logbook import Logbook

    with Logbook.open(tmp_path) as book:
        book.start_subrun("1.00", "launch", {}, None, 0, {}, {})
        book.record_metrics("1.00", [{"step": s, "loss": 1.0 / s, "tokens": 512, "step_time": 0.1}
                                     for s in range(1, steps + 1)])
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone already: every write to the pipe fails
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout buffered, as for a user
    try:
        proc = subprocess.run([sys.executable, "-m", "runmgr", "logbook", "metrics", str(tmp_path)], cwd=ROOT,
                              env=env, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr
