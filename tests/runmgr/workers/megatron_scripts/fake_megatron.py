"""A stand-in for a user's pretrain_gpt.py under torchrun: prints Megatron's
lines and ends the way Megatron does. Imports nothing but the standard library.

``--mode``: ok (iteration lines on the last rank, a save on rank 0, exit 0
once ``GATE/release`` exists), rerun (exit 16 with Megatron's message),
validation (rank 1 writes a tracker line, then rank 0 exits 17), watchdog
(rank 1: NCCL's watchdog text, then SIGABRT), hccl (rank 1: HCCL's lost
heartbeat, exit 1), nan (three iteration lines, then the last rank raises Megatron's
NaN validation error), echo_first (rank 1, once ``GATE/echo-1`` exists, prints gloo's broken-collective error and exits 1;
rank 0 kills itself with SIGKILL once ``GATE/kill-0`` exists: a survivor's echo that ends
before its cause), forever (iteration lines forever; each rank starts a
grandchild and writes ``GATE/pids-RANK``). Other ranks wait to be stopped.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

RANK = int(os.environ["RANK"])
LAST = int(os.environ["WORLD_SIZE"]) - 1
MEGATRON_RERUN = ("Saving a checkpoint and exiting now. Please resume the job from the checkpoint to rerun "
                  "the last iteration and establish a diagnostic")
NCCL_WATCHDOG = (f"[rank{RANK}]:[E ProcessGroupNCCL.cpp:616] [Rank {RANK}] Watchdog caught collective operation "
                 "timeout: WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
                 "ran for 600109 milliseconds before timing out.\n"
                 f"[rank{RANK}]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank {RANK}] To avoid data inconsistency, "
                 "we are taking the entire process down.")
GLOO_PEER_LOST = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                  "[127.0.0.1]:29500")
HCCL_LOST = ("EI0002: [PID: 4242] 2026-08-22-10:11:12.123.456 The wait execution of the Notify register times "
             "out. Reason: The Notify register has not received the Notify record from remote rank [0].base "
             "information: [streamID:[2], taskID[3], taskType[Notify Wait], tag[AllReduce]] "
             "[Heartbeat Lost Occurred]")


def iteration_line(step: int) -> str:
    return (f" [2026-08-22 10:11:{step % 60:02d}.000000] iteration {step:8d}/     100 | consumed samples: "
            f"{step * 8:12d} | elapsed time per iteration (ms): 120.5 | learning rate: 1.000000E-04 | "
            f"global batch size:     8 | lm loss: {5.0 - step * 0.1:.6E} | loss scale: 1.0 | grad norm: 0.500 | "
            f"number of skipped iterations:   0 | number of nan iterations:   0 |")


def wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(0.05)


def wait_to_be_stopped() -> None:
    while True:
        time.sleep(1)


def ok(args: argparse.Namespace) -> None:
    if RANK == LAST:
        for step in (1, 2, 3):
            print(iteration_line(step))
    if RANK == 0:
        print(f"saving checkpoint at iteration       2 to {args.save} in torch_dist format")
        (Path(args.save) / "iter_0000002").mkdir(parents=True)
        print(f"  successfully saved checkpoint from iteration       2 to {args.save} [ t 1/1, p 1/1 ]")
    wait_for(args.gate / "release")


def validation(args: argparse.Namespace) -> None:
    if RANK == 1:
        with open(args.result_rejected_tracker_filename, "a") as tracker:
            tracker.write(f"ts=2026-08-22 10:11:12.000000 node={os.uname()[1]} device=0 jobID=N/A rank=1 "
                          f"iteration=7 status=RerunValidationStatus.INITIAL_RUN result=nan "
                          f"message='loss is nan'\n")
        (args.gate / "tracked").touch()
        wait_to_be_stopped()
    wait_for(args.gate / "tracked")
    print("Exiting now. The job can be resumed from a previous checkpoint")
    sys.exit(17)


def forever(args: argparse.Namespace) -> None:
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    # Written whole under another name, then renamed: a test that sees the file reads both pids,
    # never the moment between its creation and its contents.
    partial = args.gate / f".pids-{RANK}"
    partial.write_text(f"{os.getpid()} {grandchild.pid}")
    partial.rename(args.gate / f"pids-{RANK}")
    step = 0
    while True:
        step += 1
        if RANK == LAST:
            print(iteration_line(step))
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", required=True)
    parser.add_argument("--gate", type=Path, required=True)
    parser.add_argument("--save", default="")
    parser.add_argument("--result-rejected-tracker-filename", default=None)
    args = parser.parse_args()
    if args.mode == "ok":
        ok(args)
        return
    if args.mode == "rerun":
        # Megatron logs it on rank 0 before the checkpoint that every rank saves together, so no
        # rank exits before it is written: the others wait for it here (before, on a loaded
        # machine, rank 1 exited first and torchrun stopped rank 0 before it had printed).
        if RANK == 0:
            print(MEGATRON_RERUN, flush=True)  # a flushed record
            (args.gate / "rerun-logged").touch()
        wait_for(args.gate / "rerun-logged")
        sys.exit(16)
    elif args.mode == "validation":
        validation(args)
    elif args.mode == "watchdog" and RANK == 1:
        print(NCCL_WATCHDOG, flush=True)
        os.abort()
    elif args.mode == "hccl" and RANK == 1:
        print(HCCL_LOST, flush=True)
        sys.exit(1)
    elif args.mode == "echo_first" and RANK == 1:
        wait_for(args.gate / "echo-1")
        print(GLOO_PEER_LOST, flush=True)
        sys.exit(1)
    elif args.mode == "echo_first":
        wait_for(args.gate / "kill-0")
        os.kill(os.getpid(), signal.SIGKILL)
    elif args.mode == "forever":
        forever(args)
    elif args.mode == "nan" and RANK == LAST:
        for step in (1, 2, 3):
            print(iteration_line(step), flush=True)
        # Megatron's result validation with reruns disabled (rerun_state_machine.py, validate_result).
        raise RuntimeError(f"Rank {RANK}, node {os.uname()[1]}, device 0, iteration 4: Unexpected result nan "
                           f"(message='found NaN in local forward loss calculation')")
    wait_to_be_stopped()


if __name__ == "__main__":
    main()
