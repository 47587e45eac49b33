"""``python -m trainer --num-layers ...``: real runs in Megatron's dialect,
read back through the lines they print (as a Megatron log reader would)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from tests import cli
from tests.forkserver import ForkServer
from tests.trainer.conftest import free_port
from trainer import exitcodes
from trainer.megatron_args import LLAMA_FLAGS

pytestmark = pytest.mark.slow  # every test runs the trainer as real ranks under torchrun

REPO = Path(__file__).resolve().parents[2]
B = 4  # global batch
# Tiny and fixed: --lr-decay-iters keeps the schedule when --train-iters changes between runs.
BASE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--micro-batch-size", "2", "--global-batch-size", str(B), "--lr", "1e-3", "--min-lr", "1e-4",
        "--lr-warmup-iters", "3", "--lr-decay-iters", "10", "--lr-decay-style", "cosine", "--log-interval", "1",
        "--distributed-backend", "gloo", "--deterministic-mode", *LLAMA_FLAGS]
ITERATION = re.compile(
    r"^ \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\] iteration +(?P<step>\d+)/ +(?P<total>\d+) \|"
    r" consumed samples: +(?P<consumed>\d+) \|(?: skipped samples: +(?P<skipped>\d+) \|)?"
    r" elapsed time per iteration \(ms\): [\d.]+ \| learning rate: (?P<lr>\S+) \| global batch size: +\d+ \|"
    r" lm loss: (?P<loss>\S+) \| loss scale: 1\.0 \| grad norm: [\d.]+ \|"
    r" number of skipped iterations: +0 \| number of nan iterations: +0 \|$")
SAVED = re.compile(r"^  successfully saved checkpoint from iteration +(\d+) to (\S+) \[ t 1/1, p 1/1 \]$")
SAVING = re.compile(r"^saving checkpoint at iteration +(\d+) to (\S+) in torch_dist format$")
STRAGGLER = re.compile(r"^\[[\d: -]+\] \| MnRtt/Rnk: [\d.]+ms/(\d) \| MxRtt/Rnk: [\d.]+ms/(\d) \| "
                       r"MnEtpt/Rnk: [\d.]+TF/\d \| MxEtpt/Rnk: [\d.]+TF/\d$")


@dataclass(frozen=True)
class Iteration:
    step: int
    consumed: int
    skipped: int
    lr: float
    loss: float


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    def iterations(self) -> dict[int, Iteration]:
        found = [ITERATION.match(line) for line in self.stdout.splitlines()]
        return {int(m["step"]): Iteration(int(m["step"]), int(m["consumed"]), int(m["skipped"] or 0),
                                          float(m["lr"]), float(m["loss"])) for m in found if m}

    def matching(self, pattern: re.Pattern) -> list[tuple[str, ...]]:
        return [m.groups() for m in map(pattern.match, self.stdout.splitlines()) if m]


def dialect(args: list[str], cwd: Path, ranks: Optional[int] = None, forkserver: Optional[ForkServer] = None) -> Run:
    """``python -m trainer ARGS``, under torchrun with ``ranks`` ranks when given (torchrun's launcher
    forked from the CLI fork server, its ranks new processes); else, given the rank fork server,
    forked from it as ``python -m trainer`` (torch already imported there: about 2 CPU-seconds a run
    less; tests/forkserver.py)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    if ranks is None and forkserver is not None:
        return forked(forkserver, args, cwd, env)
    if ranks is not None:  # torchrun's own entry point forked from the CLI fork server (tests/cli.py: its
        # launcher imports no torch of its own, about 1.4 CPU-seconds a run); its ranks are new processes
        done = cli.runmgr("--nproc-per-node", str(ranks), "--master-addr", "127.0.0.1", "--master-port",
                          str(free_port()), "-m", "trainer", *args, module="torch.distributed.run", cwd=cwd,
                          env=env, timeout=240)
    else:
        done = subprocess.run([sys.executable, "-m", "trainer", *args], capture_output=True, text=True,
                              timeout=240, env=env, cwd=cwd)
    return Run(done.returncode, done.stdout, done.stderr)


def forked(forkserver: ForkServer, args: list[str], cwd: Path, env: dict) -> Run:
    """One ``python -m trainer ARGS`` forked by the rank fork server, its output read back from files."""
    out = Path(tempfile.mkdtemp(prefix="dialect-", dir=cwd))
    stdout, stderr = out / "stdout", out / "stderr"
    code = forkserver.start(args, module="trainer", cwd=str(cwd), env=env, stdout=stdout, stderr=stderr).wait(240)
    return Run(code, stdout.read_text(), stderr.read_text())


@pytest.fixture(scope="module")
def first(tmp_path_factory) -> tuple[Run, Path]:
    """Two ranks train 10 iterations, saving at 5 and 10."""
    save = tmp_path_factory.mktemp("dialect") / "ck"
    run = dialect([*BASE, "--train-iters", "10", "--save", str(save), "--save-interval", "5", "--log-straggler"],
                  save.parent, ranks=2)
    assert run.code == 0, run.stderr[-3000:]
    return run, save


def test_two_ranks_print_megatrons_iteration_save_and_straggler_lines(first):
    run, save = first
    iterations = run.iterations()
    assert sorted(iterations) == list(range(1, 11))
    assert [it.consumed for it in iterations.values()] == [step * B for step in range(1, 11)]
    assert all(it.skipped == 0 for it in iterations.values()) and "skipped samples" not in run.stdout
    assert iterations[1].lr == pytest.approx(1e-3 / 3) and iterations[3].lr == pytest.approx(1e-3)
    assert run.matching(SAVING) == [("5", str(save)), ("10", str(save))]
    assert run.matching(SAVED) == [("5", str(save)), ("10", str(save))]
    assert len(run.matching(STRAGGLER)) == 10
    assert "successfully loaded" not in run.stdout
    assert (save / "step_00000005" / "manifest.json").is_file()


def test_iterations_to_skip_are_dummy_iterations_after_a_resume(first, tmp_path):
    uninterrupted, save = first
    run = dialect([*BASE, "--train-iters", "10", "--load", str(save), "--ckpt-step", "5",
                   "--save", str(tmp_path / "ck"), "--iterations-to-skip", "7", "8"], tmp_path, ranks=2)
    assert run.code == 0, run.stderr[-3000:]
    assert f"  successfully loaded checkpoint from {save} [ t 1/1, p 1/1 ] at iteration 5" in run.stdout
    iterations = run.iterations()
    assert sorted(iterations) == [6, 9, 10]  # 7 and 8 print nothing
    assert iterations[6].loss == uninterrupted.iterations()[6].loss  # the resume is the run it continues
    assert (iterations[6].consumed, iterations[6].skipped) == (6 * B, 0)
    assert (iterations[9].consumed, iterations[9].skipped) == (9 * B, 2 * B)
    assert (iterations[10].consumed, iterations[10].skipped) == (10 * B, 2 * B)
    # Iterations keep the schedule: 9 trains at the LR 9 has in the uninterrupted run.
    assert iterations[9].lr == uninterrupted.iterations()[9].lr


def test_a_changed_lr_asserts_as_megatron_unless_the_scheduler_is_overridden(first, tmp_path, rank_forkserver):
    uninterrupted, save = first
    resume = [*BASE, "--load", str(save), "--ckpt-step", "5", "--train-iters", "6"]
    halved = [item for item in resume if item not in ("--lr", "1e-3", "--min-lr", "1e-4")]
    halved += ["--lr", "5e-4", "--min-lr", "5e-5"]
    refused = dialect(halved, tmp_path, forkserver=rank_forkserver)
    assert refused.code == exitcodes.FAILED
    assert refused.stderr == ("AssertionError: OptimizerParamScheduler: class input value 0.0005 and "
                              "checkpointvalue 0.001 for learning rate do not match\n")
    assert refused.iterations() == {}

    overridden = dialect([*halved, "--override-opt_param-scheduler"], tmp_path, forkserver=rank_forkserver)
    assert overridden.code == 0, overridden.stderr[-3000:]
    assert overridden.iterations()[6].lr == pytest.approx(uninterrupted.iterations()[6].lr / 2, rel=1e-6)


def test_no_load_optim_restarts_the_schedule_and_a_later_resume_continues_it(first, tmp_path, rank_forkserver):
    uninterrupted, save = first
    before = uninterrupted.iterations()
    reset = dialect([*BASE, "--load", str(save), "--ckpt-step", "5", "--no-load-optim", "--train-iters", "7",
                     "--save", str(tmp_path / "ck"), "--save-interval", "7"], tmp_path, forkserver=rank_forkserver)
    assert reset.code == 0, reset.stderr[-3000:]
    after = reset.iterations()
    assert after[6].lr == before[1].lr and after[7].lr == before[2].lr  # a fresh warmup from step 5
    assert after[6].consumed == 6 * B  # the data continue

    later = dialect([*BASE, "--load", str(tmp_path / "ck"), "--train-iters", "8"], tmp_path,
                    forkserver=rank_forkserver)
    assert later.code == 0, later.stderr[-3000:]
    assert later.iterations()[8].lr == before[3].lr  # step 8 is the restarted schedule's third


def test_a_ckpt_step_that_does_not_verify_exits_3(first, tmp_path, rank_forkserver):
    _run, save = first
    missing = dialect([*BASE, "--train-iters", "10", "--load", str(save), "--ckpt-step", "7"], tmp_path,
                      forkserver=rank_forkserver)
    assert missing.code == exitcodes.CHECKPOINT_ERROR
    assert missing.stderr.startswith(f"error: checkpoint {save / 'step_00000007'} (step 7) is unusable: ")
    assert missing.stderr.count("\n") == 1
