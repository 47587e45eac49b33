"""Every command line README.md shows, run as written against a small run.

The lines are read from the README itself: its ``sh`` blocks, the first
column of its commands table, and the ``runmgr ...`` / ``make ...`` commands
quoted in its prose. Each has a case below; a line without one fails
:func:`test_every_command_line_of_the_readme_has_a_case`, so a README change
cannot skip this test.

Placeholders take small values: ``NAME`` is ``demo``, ``RUN`` a 30-step
demo run without chaos on the session's shared Ray (``[key=value ...]`` are those
tiny overrides and ``cluster.address=``: the table's launch line *is* that run), ``FILE`` / ``P`` a
text file and a prefix, or the run's exported metrics for ``watch replay``.
Optional ``[...]`` parts are run with and without. Decided otherwise, and
why:

- ``make demo`` / ``make test`` are checked with ``make -n`` (the recipe, and
  that runmgr parses the lines it would run): the demo trains 200 steps
  through every fault for minutes and tests/e2e checks what it does; running
  the suite from inside the suite would recurse.
- ``kill -9 <a worker pid>`` is not runmgr's: tests/faults/test_checkpoint_faults.py
  kills a worker of a live run and checks the new sub-run.
- ``--k8s-label`` runs as written with no Kubernetes API in reach (the one
  line that says so, exit 2): pointed at a real cluster it would label its
  nodes. tests/runmgr/healthcheck/test_k8s.py runs it against a local fake.
- ``health-check`` probes the session's shared Ray (``cluster.address=``, as the small run
  does): a Ray of its own adds nothing the probes see; a health check that starts its own local
  Ray is tests/runmgr/healthcheck/test_command.py's (one node) and test_shared_host.py's.
- ``torchrun ...`` is torchrun's own entry point (``python -m torch.distributed.run``, what the
  ``torchrun`` script calls) forked from the tests' CLI fork server, so that its launcher
  imports no torch of its own; its two ranks are the new processes it starts, as written.
- ``torchrun ... conf=demo`` trains 4 steps instead of 200; so does the
  ``trainer.kind=megatron`` launch, on one local Ray node and without probes (the small run's launch
  probes this machine, as written), with the line's ``megatron.script=PATH megatron.args=[...]``: a
  user's script, the stand-in ``pretrain_gpt.py`` of tests/e2e/standin (Megatron's lines, no torch
  in its ranks: two imports of torch and the trainer fewer, about 15 CPU-seconds; the built-in
  trainer as a Megatron job, no script and no args, is tests/e2e/test_megatron_job.py's launch); it
  starts its own local Ray (on the
  session's shared one a launch whose ranks are torchrun jobs was seen to
  have an actor cancelled before it ran, under CI's load: not yet understood).
- ``watch score tests/data/detectors`` runs once a session, in the repository's root as
  the README writes it (tests/conftest.py ``detectors_score``): tests/runmgr/score/test_corpus.py
  compares the same output with docs/detectors.md's table, where each scored the corpus itself.
- Commands that run beside the test (the follower and the player, ``logbook serve``) and
  ``watch follow -`` fork from the tests' CLI fork server like the rest (tests/cli.py), their
  output in files the test reads as they write them, standard input from a file.
- ``runmgr simulate ettr`` simulates 2,048 devices, not 16,384 (over a minute of
  sweeps); tests/runmgr/simulate checks the simulator itself.
- The "Running on Kubernetes" lines (docker, kind, kubectl) need a Docker
  engine or a Kubernetes API, which the test machines lack: their cases are in
  tests/k8s/readme_cases.py (offline dry runs, the rendered manifests, and the
  names each line uses checked against the manifests and the Dockerfile).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import pytest

from tests import cli
from tests.k8s.readme_cases import CASES as KUBERNETES_CASES

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RUN = "readme"
TRAIN_ITERS = 30
TINY = ["chaos=none", f"training.train_iters={TRAIN_ITERS}", "cluster.local_nodes=1", "checkpoint.save_interval=10"]
"""The ``[key=value ...]`` of the small run: no faults, 30 steps, one Ray node (the launch and
the health check add ``cluster.address=`` the session's shared Ray: they neither kill nor
reconfigure it)."""
MEGATRON_ITERS = 4
MEGATRON_TINY = ["chaos=none", f"training.train_iters={MEGATRON_ITERS}", "checkpoint.save_interval=2",
                 "health.skip=true", "cluster.local_nodes=1"]
STANDIN = ROOT / "tests" / "e2e" / "standin" / "pretrain_gpt.py"
"""The user's script of the Megatron launch: a stand-in that prints Megatron's lines (tests/e2e/standin)."""
"""The Megatron launch's: its torchrun job to step 4 on one local Ray node (one torchrun of both
ranks: tests/e2e runs one per node), the probes skipped (the small run's launch probed this
machine)."""


def normalise(command: str) -> str:
    return " ".join(command.replace("\\|", "|").split())


def readme_command_lines(text: str) -> list[str]:
    """The README's command lines, in order, each once."""
    found: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.splitlines():
            command = re.split(r"\s{2,}#", line)[0].strip()  # "cmd   # what it does"
            if command:
                found.append(command)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for row in re.findall(r"^\| `(.+?)` \|", prose, re.M):
        found.append(row)
    prose = re.sub(r"^\|.*$", "", prose, flags=re.M)
    for span in re.findall(r"`([^`]+)`", prose):
        words = span.split()
        # `runmgr launch` alone names the command in a sentence; a command line has its arguments.
        if (words[0] == "runmgr" and len(words) >= 3) or (words[0] == "make" and len(words) >= 2):
            found.append(span)
    unique: list[str] = []
    for command in map(normalise, found):
        if command not in unique:
            unique.append(command)
    return unique


@dataclass
class Context:
    """Where the commands run: a folder with the repository's conf/ and the small run."""

    cwd: Path
    text: Path
    metrics: Path
    tokenizer: Path
    score_corpus: Callable[[], subprocess.CompletedProcess]
    """``runmgr watch score tests/data/detectors`` run in the repository's root, as the README
    writes it: once a session, its output shared with tests/runmgr/score/test_corpus.py."""
    cluster: str = ""
    """``cluster.address=`` the session's shared Ray, which the small run and the health check join."""
    beside: Optional[dict] = None
    """What "Try it beside a running job" printed, once its lines ran (they share one story)."""

    def runmgr(self, *args: str, env: dict | None = None, stdin: Path | None = None) -> subprocess.CompletedProcess:
        return cli.runmgr(*args, cwd=self.cwd, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                          stdin=stdin)

    def ok(self, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        result = self.runmgr(*args, env=env)
        assert result.returncode == 0, (args, result.stderr[-3000:])
        assert "Traceback" not in result.stdout + result.stderr and "\x1b[" not in result.stdout
        return result


def save_tokenizer(directory: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(["a small corpus for a small tokenizer"],
                                  trainers.WordLevelTrainer(special_tokens=["<unk>", "</s>"]))
    directory.mkdir()
    tokenizer.save(str(directory / "tokenizer.json"))


@pytest.fixture(scope="module")
def ctx(tmp_path_factory, detectors_score, shared_ray) -> Context:
    """The table's ``runmgr launch conf=NAME [key=value ...]``, run once: the small run."""
    cwd = tmp_path_factory.mktemp("readme")
    (cwd / "conf").symlink_to(ROOT / "conf")
    (cwd / "tests").mkdir()
    (cwd / "tests" / "data").symlink_to(ROOT / "tests" / "data")  # the logs "Try it beside a running job" plays
    (cwd / "notes.txt").write_text("A first paragraph.\n\nA second one.\n", encoding="utf-8")
    save_tokenizer(cwd / "tokenizer")
    context = Context(cwd, cwd / "notes.txt", cwd / "metrics.jsonl", cwd / "tokenizer", detectors_score,
                      f"cluster.address={shared_ray.address}")
    launched = context.ok("launch", "conf=demo", f"run.name={RUN}", *TINY, context.cluster)
    assert "finished" in launched.stdout and f"logbook: runmgr logbook show runs/{RUN}" in launched.stdout
    context.metrics.write_text(context.ok("logbook", "metrics", RUN, "--json").stdout)
    return context


# ---- the cases ----------------------------------------------------------------------------------


def make_dry_run(*args: str) -> str:
    result = subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def runmgr_lines_parse(recipe: str) -> list[list[str]]:
    """The runmgr command lines a make recipe would run, parsed by runmgr's own parser."""
    from runmgr.cli import build_parser, parse_args

    lines = [line.split()[1:] for line in recipe.splitlines() if line.split()[:1] == [".venv/bin/runmgr"]]
    for argv in lines:
        parse_args(build_parser(), argv)  # exits 2 on a line it would refuse
    return lines


def case_make_demo(ctx: Context) -> None:
    lines = runmgr_lines_parse(make_dry_run("demo"))
    assert [argv[:2] for argv in lines] == [["launch", "conf=demo"], ["logbook", "show"]]
    assert lines[0][2].startswith("run.name=demo-") and lines[1][2] == lines[0][2].split("=")[1]


def case_make_test(ctx: Context) -> None:
    assert "-m pytest" in make_dry_run("test")


def case_make_demo_npu(ctx: Context) -> None:
    # uv by default, pip with INSTALLER=pip: each installs the package with the npu extra.
    assert "-e '.[test,npu]'" in make_dry_run("demo", "EXTRAS=test,npu")
    assert '-e ".[test,npu]"' in make_dry_run("demo", "EXTRAS=test,npu", "INSTALLER=pip")


def case_make_demo_no_chaos(ctx: Context) -> None:
    (launch, _) = runmgr_lines_parse(make_dry_run("demo", "DEMO_ARGS=chaos=none"))
    assert launch[-1] == "chaos=none"


def case_status(ctx: Context) -> None:
    assert "state finished" in ctx.ok("status", RUN).stdout
    status = json.loads(ctx.ok("status", RUN, "--json").stdout)
    assert status["state"] == "finished" and status["step"] == TRAIN_ITERS


def case_kill_a_worker(ctx: Context) -> None:
    assert "def test_a_killed" in (ROOT / "tests" / "faults" / "test_checkpoint_faults.py").read_text()


def case_launch_again(ctx: Context) -> None:
    again = ctx.ok("launch", "conf=demo", f"run.name={RUN}", *TINY, ctx.cluster)  # the fixture ran it once
    assert f"run {RUN} already finished at step {TRAIN_ITERS}" in again.stdout


def case_dry_run(ctx: Context) -> None:
    assert "verdict" in ctx.ok("launch", "conf=demo", "--dry-run").stdout


def case_rehearse(ctx: Context) -> None:
    # The dry run only: the rehearsal itself runs in tests/e2e/test_rehearsal.py (a slow run of its own).
    mapping = ctx.ok("launch", "conf=run12", "--rehearse", "--dry-run").stdout
    assert "Rehearsal of run12" in mapping and "parallel.tensor_model_parallel_size        8 -> 2" in mapping


def case_lint(ctx: Context) -> None:
    assert "no findings" in ctx.ok("lint", "conf=demo").stdout
    warned = ctx.ok("lint", "conf=demo", *TINY, "optim.adam_beta2=0.999").stdout
    assert "adam-beta2" in warned and "fix:     set optim.adam_beta2=0.95" in warned and "case report 000" in warned


def case_health_check(ctx: Context) -> None:
    checked = ctx.runmgr("health-check", "--json", ctx.cluster)
    assert checked.returncode in (0, 1), checked.stderr[-3000:]  # 1: a node excluded
    assert json.loads(checked.stdout)["summary"]["nodes"] == 1
    no_api = {"KUBECONFIG": str(ctx.cwd / "no-kubeconfig"), "KUBERNETES_SERVICE_HOST": ""}
    labelled = ctx.runmgr("health-check", "conf=demo", "--k8s-label", env=no_api)
    lines = labelled.stderr.strip().splitlines()
    assert labelled.returncode == 2 and len(lines) == 1 and "no Kubernetes API" in lines[0]


def case_watch_replay(ctx: Context) -> None:
    for extra in ([], ["--json"]):
        ctx.ok("watch", "replay", str(ctx.metrics), *extra)


def case_watch_replay_with_config(ctx: Context) -> None:
    for extra in ([], ["conf=demo", "watcher.loss_spike.grace_steps=5", "--json"]):
        ctx.ok("watch", "replay", str(ctx.metrics), *extra)


def case_logbook_show(ctx: Context) -> None:
    text = ctx.ok("logbook", "show", RUN).stdout
    assert text.startswith(f"{RUN} — run 1") and f"finished at step {TRAIN_ITERS}" in text
    assert "ETTR" in ctx.ok("logbook", "show", RUN, "--full").stdout


def case_logbook_events_json(ctx: Context) -> None:
    events = [json.loads(line) for line in ctx.ok("logbook", "events", RUN, "--json").stdout.splitlines()]
    assert events[0]["type"] == "subrun_start" and events[-1]["type"] == "subrun_end"


def case_logbook_events(ctx: Context) -> None:
    lines = ctx.ok("logbook", "events", RUN).stdout.splitlines()
    assert "start from step 0: launch" in lines[0] and not any(line.startswith("{") for line in lines)


def case_logbook_metrics(ctx: Context) -> None:
    rows = [json.loads(line) for line in ctx.ok("logbook", "metrics", RUN, "--json").stdout.splitlines()]
    assert [row["step"] for row in rows] == list(range(1, TRAIN_ITERS + 1))


def case_logbook_skipped(ctx: Context) -> None:
    assert "no skip ranges" in ctx.ok("logbook", "skipped", RUN).stdout


def case_logbook_list(ctx: Context) -> None:
    assert ctx.ok("logbook", "list", RUN).stdout.split()[0] == "1.00"
    listed = {line.split()[0]: line.split()[:4] for line in ctx.ok("logbook", "list").stdout.splitlines()}
    assert listed[RUN] == [RUN, "finished", "1", "sub-runs"]  # beside the shadow runs of "Try it beside ..."


def case_logbook_salvage(ctx: Context) -> None:
    # A healthy logbook is refused (tests/faults/test_damaged_logbook.py salvages a damaged one).
    result = ctx.runmgr("logbook", "salvage", RUN)
    assert result.returncode == 2 and "nothing to salvage" in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr


def case_logbook_any(ctx: Context) -> None:
    for case in (case_logbook_show, case_logbook_events, case_logbook_metrics, case_logbook_skipped,
                 case_logbook_list):
        case(ctx)


def case_logbook_plot(ctx: Context) -> None:
    drawn = ctx.ok("logbook", "plot", RUN, "--metric", "loss,lr", "--x", "tokens", "--html", "loss.html").stdout.split()
    assert (ctx.cwd / drawn[0]).read_bytes()[:4] == b"\x89PNG" and (ctx.cwd / "loss.html").is_file()


def case_logbook_export(ctx: Context) -> None:
    written = Path(ctx.ok("logbook", "export", RUN, "--format", "md", "--out", "notes.md").stdout.strip())
    text = (ctx.cwd / written).read_text(encoding="utf-8")
    assert text.startswith("# ") and "## 1.00" in text and "![loss](notes.plots/loss.png)" in text


def case_logbook_compare(ctx: Context) -> None:
    # The small run against itself: bit for bit the same (tests/e2e/test_compare_runs.py
    # compares real runs that differ, against a real baseline pair).
    assert ctx.ok("logbook", "compare", RUN, RUN).stdout.splitlines()[-1] == "verdict: identical"
    judged = json.loads(ctx.ok("logbook", "compare", RUN, RUN, "--baseline", RUN, RUN, "--plot", "diff.png",
                               "--json").stdout)
    assert judged["verdict"] == "identical" and judged["metrics"]["loss"]["steps"] == list(range(1, TRAIN_ITERS + 1))
    assert (ctx.cwd / "diff.png").read_bytes()[:4] == b"\x89PNG"


def case_logbook_norms(ctx: Context) -> None:
    # The demo records every weight's norm at every step: a run without faults moves none of them.
    text = ctx.ok("logbook", "norms", RUN, "--step", "20").stdout
    assert text.startswith("local norms around step 20") and "embedding.weight" in text
    answer = json.loads(ctx.ok("logbook", "norms", RUN, "--step", "20", "--threshold", "50", "--json").stdout)
    assert answer["first"] == [] and answer["threshold"] == 50.0 and len(answer["weights"]) > 3


def case_logbook_serve(ctx: Context) -> None:
    import urllib.request

    log = ctx.cwd.parent / f"{ctx.cwd.name}-serve.log"
    server = cli.start_runmgr(["logbook", "serve", "--port", "0"], ctx.cwd, {**os.environ, "PYTHONPATH": str(ROOT)},
                              log)
    try:
        said = cli.lines_of(log, server, lambda line: "http://127.0.0.1:" in line)
        url = next(word for word in said[-1].split() if word.startswith("http://127.0.0.1:"))
        with urllib.request.urlopen(url, timeout=30) as answer:
            assert RUN in answer.read().decode()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def case_prepare_data(ctx: Context) -> None:
    plain = ctx.ok("prepare-data", "--input", str(ctx.text), "--output-prefix", "data/notes")
    assert "model.vocab_size=256" in plain.stdout and (ctx.cwd / "data" / "notes.idx").is_file()
    tokens = ctx.ok("prepare-data", "--input", str(ctx.text), "--output-prefix", "data/notes_tok",
                    "--tokenizer", str(ctx.tokenizer))
    assert re.search(r"vocabulary \d+: train with data.data_path=data/notes_tok model.vocab_size=\d+", tokens.stdout)


def case_version(ctx: Context) -> None:
    assert ctx.ok("--version").stdout.startswith("runmgr ")


def torchrun(ctx: Context, *args: str) -> subprocess.CompletedProcess:
    """``torchrun ARGS``: the entry point the ``torchrun`` script calls, forked from the CLI fork
    server (torch imported once); the ranks it starts are new processes."""
    assert "torch.distributed.run" in (Path(sys.executable).parent / "torchrun").read_text()
    return cli.runmgr(*args, module="torch.distributed.run", cwd=ctx.cwd, timeout=600,
                      env={**os.environ, "PYTHONPATH": str(ROOT)})


def case_torchrun(ctx: Context) -> None:
    result = torchrun(ctx, "--nproc_per_node=2", "-m", "trainer", "conf=demo", "training.train_iters=4")
    assert result.returncode == 0, result.stderr[-3000:]


def case_launch_megatron(ctx: Context) -> None:
    run = f"{RUN}-megatron"
    args = ["--save", str(ctx.cwd / "runs" / f"{run}-ckpt"), "--train-iters", str(MEGATRON_ITERS), "--lr", "1e-3",
            "--min-lr", "1e-4", "--global-batch-size", "8", "--micro-batch-size", "4", "--save-interval", "2",
            "--log-interval", "1"]
    launched = ctx.ok("launch", "conf=demo", "trainer.kind=megatron", f"megatron.script={STANDIN}",
                      "megatron.args=[" + ",".join(args) + "]", f"run.name={run}", *MEGATRON_TINY)
    assert f"sub-run 1.00 reached step {MEGATRON_ITERS}" in launched.stdout
    events = [json.loads(line) for line in ctx.ok("logbook", "events", run, "--json").stdout.splitlines()]
    commands = [e["data"]["argv"] for e in events if e["type"] == "event" and e["kind"] == "command"]
    assert commands and all("torch.distributed.run" in argv and str(STANDIN) in argv for argv in commands)


def case_torchrun_megatron_dialect(ctx: Context) -> None:
    result = torchrun(ctx, "--nproc_per_node=2", "-m", "trainer", "--num-layers", "1", "--hidden-size", "32",
                      "--num-attention-heads", "2", "--seq-length", "32", "--max-position-embeddings", "32",
                      "--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
                      "--disable-bias-linear", "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3",
                      "--train-iters", "3", "--log-interval", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "iteration        3/       3 | consumed samples:           12 |" in result.stdout


def case_simulate_ettr(ctx: Context) -> None:
    line = ["simulate", "ettr", "--devices", "2048", "--intervals", "25,400", "--restart-scales", "0.5,2"]
    text = ctx.ok(*line).stdout
    assert "2048 devices (256 nodes of 8)" in text and "best warm restart: ETTR" in text
    report = json.loads(ctx.ok(*line, "--json").stdout)
    assert report["best"]["warm"]["ettr"] > report["best"]["cold"]["ettr"]


def case_precision_check(ctx: Context) -> None:
    from tests.runmgr.precision.fixtures.make_logs import TINY  # the small config its pinned Megatron log is of

    other = ctx.runmgr("precision-check", "conf=demo", *TINY, "--against", "conf=demo", *TINY,
                       "optim.decay_1d_weights=true", "--steps", "3")
    assert other.returncode == 1, other.stderr[-3000:]  # 1: a stage differs
    assert "first difference: optimizer (step-2 loss)" in other.stdout and "Traceback" not in other.stderr
    log = ROOT / "tests" / "runmgr" / "precision" / "fixtures" / "megatron_pinned.log"
    for extra in ([], ["--steps", "2", "--json"]):
        same = ctx.ok("precision-check", "conf=demo", *TINY, "--against-log", str(log), *extra)
        assert ("first difference: none" in same.stdout) if not extra else \
            json.loads(same.stdout)["first_difference"] is None


LIVE_LOG = "tests/data/live/megatron_spikes_and_hang.log"


def try_it_beside(ctx: Context) -> dict:
    """The section's first three lines as written: the stand-in job played into train.log, the
    follower on it until it has called the hang (its own output says so), Ctrl-C, the logbook.
    Both commands fork from the tests' CLI fork server (tests/cli.py), their output in files."""
    if ctx.beside is not None:
        return ctx.beside
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out, errors = ctx.cwd.parent / f"{ctx.cwd.name}-follow.out", ctx.cwd.parent / f"{ctx.cwd.name}-follow.err"
    follower = cli.start_runmgr(["watch", "follow", "train.log", "run.dir=runs/beside", "watcher.hang.step.min_s=2"],
                                ctx.cwd, env, out, errors=errors)
    player = cli.start_runmgr(["watch", "play", LIVE_LOG, "train.log", "--speed", "300"], ctx.cwd, env,
                              ctx.cwd.parent / f"{ctx.cwd.name}-play.log")
    stuck = threading.Timer(300, follower.kill)  # a follower that never calls the hang: its output ends
    stuck.start()
    try:
        cli.lines_of(out, follower, lambda line: "hang at step 360" in line)
        follower.send_signal(signal.SIGINT)
        follower.wait(timeout=120)
        assert player.wait(timeout=120) == 0
    finally:
        stuck.cancel()
        for process in (follower, player):
            if process.poll() is None:
                process.kill()
                process.wait()
    assert follower.returncode == 0, errors.read_text()[-3000:]
    ctx.beside = {"follow": out.read_text(), "show": ctx.ok("logbook", "show", "runs/beside").stdout}
    return ctx.beside


def case_beside_play(ctx: Context) -> None:
    try_it_beside(ctx)
    assert (ctx.cwd / "train.log").read_text() == (ROOT / LIVE_LOG).read_text()


def case_beside_follow(ctx: Context) -> None:
    printed = try_it_beside(ctx)["follow"]
    assert re.search(r"loss_spike at step 150: .* -> ignore\n", printed)
    assert re.search(r"loss_spike at step 300: .* -> rollback_skip \(not acted on \(shadow\)\)", printed)
    assert re.search(r"hang at step 360: .* -> dump_and_restart \(not acted on \(shadow\)\)", printed)
    assert "stopped following" in printed


def case_beside_show(ctx: Context) -> None:
    shown = try_it_beside(ctx)["show"]
    assert "incidents 3 (hang 1, loss_spike 2)" in shown
    assert "not acted on (shadow): runmgr would rollback_skip from" in shown and "checkpoint at step 200" in shown


def case_score_corpus(ctx: Context) -> None:
    done = ctx.score_corpus()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr and "\x1b[" not in done.stdout
    scored = done.stdout
    assert scored.startswith("runmgr watch score tests/data/detectors (conf=shadow): 18 logs")
    assert re.search(r"^spike_persistent +2 +2 +2 +0 ", scored, re.M) and "clean runs: 5 logs" in scored


def case_follow_row(ctx: Context) -> None:
    log = ROOT / LIVE_LOG
    for extra in ([], ["conf=shadow", "run.dir=runs/row-follow"]):
        followed = ctx.runmgr("watch", "follow", "-", *extra, stdin=log)
        assert followed.returncode == 0, followed.stderr[-3000:]
        assert "-> rollback_skip (not acted on (shadow))" in followed.stdout
        assert "the followed stream ended" in followed.stdout
    shown = ctx.ok("logbook", "show", "runs/row-follow").stdout
    assert "stopped" in shown and "loss_spike 2" in shown


def case_play_row(ctx: Context) -> None:
    played = ctx.ok("watch", "play", LIVE_LOG, "-", "--speed", "1000000").stdout
    assert played == (ROOT / LIVE_LOG).read_text()
    ctx.ok("watch", "play", LIVE_LOG, "played.log", "--speed", "1000000")  # 30 minutes of stamps in 2 ms
    assert (ctx.cwd / "played.log").read_text() == played
    refused = ctx.runmgr("watch", "play", LIVE_LOG, "-", "--speed", "0")
    assert refused.returncode == 2 and "--speed must be a number above 0" in refused.stderr


def case_score_row(ctx: Context) -> None:
    few = ctx.cwd / "few"
    few.mkdir(exist_ok=True)
    for name in ("spike_recovering_mindspeed_bf16_i10", "clean_mindspeed_bf16_i1"):
        for suffix in (".log", ".labels.yaml"):
            (few / f"{name}{suffix}").write_text((ROOT / "tests/data/detectors" / f"{name}{suffix}").read_text())
    default = ctx.ok("watch", "score", "few").stdout
    assert re.search(r"^spike_recovering +1 +1 +1 +0 .* 1/1 +ignore x1$", default, re.M)
    short = json.loads(ctx.ok("watch", "score", "few", "conf=shadow", "watcher.loss_spike.grace_steps=20",
                              "--json").stdout)
    (row,) = short["classes"]
    assert row["class"] == "spike_recovering" and row["right_decision"] == 0  # rolled back after a 20-step grace


def case_approve_decline(ctx: Context) -> None:
    # The small run holds no remedy: one line, exit 2 (tests/e2e/test_approval.py approves a held one).
    for verb in ("approve", "decline"):
        refused = ctx.runmgr(verb, RUN)
        assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
        assert "Traceback" not in refused.stderr


CASES: dict[str, Callable[[Context], None]] = {
    "make demo": case_make_demo,
    "make test": case_make_test,
    ".venv/bin/runmgr status demo-YYYYmmdd-HHMMSS --json": case_status,
    "kill -9 <a worker pid>": case_kill_a_worker,
    "runmgr logbook show RUN": case_logbook_show,
    "runmgr logbook events RUN": case_logbook_events,
    "runmgr logbook events RUN --json": case_logbook_events_json,
    "runmgr logbook metrics RUN --json": case_logbook_metrics,
    "runmgr logbook skipped RUN": case_logbook_skipped,
    "runmgr logbook list RUN": case_logbook_list,
    "runmgr logbook salvage RUN": case_logbook_salvage,
    "runmgr launch conf=NAME [key=value ...]": case_launch_again,
    "runmgr launch conf=NAME --dry-run": case_dry_run,
    "runmgr launch conf=NAME --rehearse [--dry-run] [rehearse.train_iters=300 ...]": case_rehearse,
    "runmgr lint conf=NAME [key=value ...]": case_lint,
    "runmgr launch conf=NAME trainer.kind=megatron [megatron.script=PATH megatron.args=[...]]": case_launch_megatron,
    "runmgr status RUN [--json]": case_status,
    "runmgr health-check [conf=NAME] [--json] [--k8s-label]": case_health_check,
    "runmgr watch replay FILE [--json]": case_watch_replay,
    "runmgr watch replay FILE [conf=NAME] [key=value ...] [--json]": case_watch_replay_with_config,
    "runmgr logbook show|events|metrics|skipped|list RUN": case_logbook_any,
    "runmgr logbook plot RUN [--metric loss,grad_norm,lr,loss_scale] [--x step|tokens|wall] [--html FILE.html]":
        case_logbook_plot,
    "runmgr logbook export RUN --format md [--out FILE.md]": case_logbook_export,
    "runmgr logbook compare RUN_A RUN_B [--baseline RUN_C RUN_D] [--plot FILE] [--json]": case_logbook_compare,
    "runmgr logbook serve [RUN_OR_FOLDER] [--host 127.0.0.1] [--port N]": case_logbook_serve,
    "runmgr logbook norms RUN --step N [--threshold X] [--json]": case_logbook_norms,
    "runmgr prepare-data --input FILE --output-prefix P [--tokenizer PATH_OR_NAME]": case_prepare_data,
    "runmgr precision-check conf=A [key=value ...] (--against conf=B [key=value ...] | --against-log FILE) "
    "[--steps N | --thorough] [--json]": case_precision_check,
    "runmgr simulate ettr [--devices N] [--intervals K1,K2,...] [--restart-scales X1,X2,...] [--thorough] "
    "[--json]":
        case_simulate_ettr,
    "runmgr --version": case_version,
    "torchrun --nproc_per_node=2 -m trainer conf=demo": case_torchrun,
    "torchrun --nproc_per_node=2 -m trainer --num-layers N --hidden-size H ...": case_torchrun_megatron_dialect,
    "make demo EXTRAS=test,npu": case_make_demo_npu,
    "make demo DEMO_ARGS=chaos=none": case_make_demo_no_chaos,
    f".venv/bin/runmgr watch play {LIVE_LOG} train.log --speed 300 &": case_beside_play,
    ".venv/bin/runmgr watch follow train.log run.dir=runs/beside watcher.hang.step.min_s=2": case_beside_follow,
    ".venv/bin/runmgr logbook show runs/beside": case_beside_show,
    ".venv/bin/runmgr watch score tests/data/detectors": case_score_corpus,
    "runmgr watch follow FILE|DIR|- [conf=NAME] [key=value ...]": case_follow_row,
    "runmgr watch play LOG DEST|- [--speed X]": case_play_row,
    "runmgr watch score DIR [conf=NAME] [key=value ...] [--json]": case_score_row,
    "runmgr approve RUN": case_approve_decline,
    "runmgr decline RUN": case_approve_decline,
    **KUBERNETES_CASES,
}
"""README line (as :func:`normalise` writes it) -> what runs it."""

LINES = readme_command_lines(README.read_text(encoding="utf-8"))


def test_every_command_line_of_the_readme_has_a_case():
    missing = [line for line in LINES if line not in CASES]
    assert not missing, f"README.md shows command lines tests/test_readme.py does not run: {missing}"
    assert len(LINES) >= 15  # the parser still finds the README's commands


@pytest.mark.slow
@pytest.mark.parametrize("line", [line for line in LINES if line in CASES])
def test_the_readme_command_works_as_written(line, ctx):
    CASES[line](ctx)
