"""``python -m trainer`` / ``torchrun -m trainer``: a real two-rank run,
the automatic resume, and one-line errors with exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runmgr.ports import rendezvous_port
from tests import cli
from trainer import exitcodes
from trainer.cli import main
from trainer.manifest import find_latest_verified

REPO = Path(__file__).resolve().parents[2]
QUICK = ["model.seq_length=32", "model.max_position_embeddings=32", "data.corpus_max_bytes=200000",
         "checkpoint.save_interval=3"]


@pytest.fixture
def restore_torch_globals():
    deterministic, threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    yield
    torch.use_deterministic_algorithms(deterministic)
    torch.set_num_threads(threads)


def free_port() -> int:
    """A free port that no other process's ``bind(0)`` can take before the server binds it
    (runmgr/ports.py: a port from the kernel's ephemeral range was seen taken in between)."""
    return rendezvous_port()


@pytest.mark.slow  # torchrun starts 2 real ranks (new Pythons): run first under xdist
def test_torchrun_trains_two_ranks_then_the_cli_resumes_from_the_newest_verified(tmp_path, capsys,
                                                                                   restore_torch_globals):
    save = tmp_path / "ckpt"
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--nnodes=1", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", "-m", "trainer", "conf=demo", "training.train_iters=6",
               f"checkpoint.save={save}", *QUICK]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step      6/6 | loss " in done.stdout
    assert done.stdout.count("step      6/6") == 1  # one printing rank
    assert find_latest_verified(save).step == 6

    # Break the newest: the next start says so and resumes from the one before.
    broken = next((save / "step_00000006").glob("*.distcp"))
    broken.write_bytes(broken.read_bytes()[:64])
    code = main(["conf=demo", "training.train_iters=7", f"checkpoint.save={save}", *QUICK])
    out = capsys.readouterr().out
    assert code == exitcodes.DONE
    assert f"rejected checkpoint {save / 'step_00000006'}: step_00000006: file {broken.name} is 64 bytes" in out
    assert f"resuming from {save / 'step_00000003'} (step 3)" in out
    assert "step      4/7" in out and "step      7/7" in out and "step      3/7" not in out


@pytest.mark.parametrize("args, message", [
    (["conf=demo", "training.bogus=1"], "error: training.bogus: Key 'bogus' not in 'TrainingConfig'"),
    (["conf=demo", "training.train_iters=many"], "error: training.train_iters: Value 'many'"),
    (["conf=no_such_conf"], "error: unknown conf 'no_such_conf'"),
    (["training.train_iters=5"], "error: no conf given: run `python -m trainer conf=demo"),
    (["conf=demo", "model.hidden_size=130"], "error: model.hidden_size (130) must be divisible"),
    (["conf=demo", "data.data_path=/nonexistent/corpus"], "error: data.data_path: /nonexistent/corpus.bin not found"),
    (["conf=demo", "checkpoint.memory_interval=1"], "error: checkpoint.memory_interval keeps state for warm restarts"),
])
def test_bad_input_is_one_line_and_exit_code_2(args, message, capsys, tmp_path):
    assert main([*args, f"checkpoint.save={tmp_path}"]) == exitcodes.BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


def test_a_crash_in_a_real_process_exits_2_without_a_traceback(tmp_path):
    # A process of its own (its exit code and stderr are what is checked), forked from the session's
    # CLI fork server, which imported torch once (tests/cli.py): not a new Python importing torch.
    done = cli.runmgr("conf=demo", "optim.lr=-1", module="trainer", cwd=tmp_path, timeout=60,
                      env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == exitcodes.BAD_INPUT
    assert done.stderr.startswith("error: optim.lr (-1.0) must be > 0") and "Traceback" not in done.stderr
