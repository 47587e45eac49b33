"""Root cause of ranks that failed together: the dead process or the real error
wins over the peers' echo of it, on gloo, NCCL and HCCL alike (texts from
FORMATS.md and MEGATRON.md)."""

from __future__ import annotations

import pytest

from runmgr.controller.group import WorkerFailure, WorkerInfo, root_cause

GLOO_ECHOES = [
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:45121",
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error [127.0.0.1]:20354: "
    "Connection reset by peer",
    "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
    "20000ms for recv operation to complete",
]
NCCL_ECHOES = [
    "[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) "
    "ran for 600060 milliseconds before timing out.",
    "[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=469508, "
    "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802212 milliseconds before timing out.",
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691, "
    "remote process exited or there was a network error, NCCL version 2.19.3\nncclRemoteError: A call failed "
    "possibly due to a network error or a remote process exiting prematurely.",
]
HCCL_ECHOES = [
    "EI0002: [PID: 2969] 2025-10-11-15:09:34.713.335 The wait execution of the Notify register times out. Reason: "
    "The Notify register has not received the Notify record from remote rank: [24].",
    "RuntimeError: EI0002: The wait execution of the Notify register times out. [Heartbeat Lost Occurred]",
    "RuntimeError: HCCL function error: hcclCommInitRootInfoConfig(numRanks, &rootInfo, rank, config, "
    "&(comm->hcclComm_)), error code is 7\n[ERROR] 2025-05-01-10:00:00 (PID:1234, Device:0, RankID:-1) ERR02200 "
    "DIST call hccl api failed.",
    "EI0006: [PID: 1292363] 2025-04-08-18:07:20.444.436 Getting socket times out. Reason: Remote Rank did not send "
    "the data in time. Please check the reason for the rank being stuck",
]
REAL_ERRORS = [
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "RuntimeError: ACL stream synchronize failed, error code is 507053 UCE ERROR",
    "trainer.errors.TrainerConfigError: training.global_batch_size (12) must be divisible by ...",
    "ZeroDivisionError: division by zero",
]


def failure(rank: int, kind: str, text: str, time: float) -> WorkerFailure:
    return WorkerFailure(rank, kind, text, WorkerInfo(rank, 100 + rank, f"node{rank}", "127.0.0.1"), time)


@pytest.mark.parametrize("echo", GLOO_ECHOES + NCCL_ECHOES + HCCL_ECHOES)
def test_a_peer_echo_is_recognised_as_one(echo):
    assert failure(0, "error", echo, 0.0).is_peer_echo


@pytest.mark.parametrize("text", REAL_ERRORS)
def test_a_real_error_is_not_an_echo(text):
    assert not failure(0, "error", text, 0.0).is_peer_echo


@pytest.mark.parametrize("echo", GLOO_ECHOES + NCCL_ECHOES + HCCL_ECHOES)
@pytest.mark.parametrize("real", REAL_ERRORS)
def test_the_real_error_wins_even_when_its_echo_came_first(echo, real):
    # The waiting rank's timeout is often reported before the failing rank's traceback lands.
    echo_first = failure(0, "error", echo, 1.0)
    cause = failure(1, "error", real, 2.0)
    assert root_cause([echo_first, cause]) is cause


@pytest.mark.parametrize("echo", GLOO_ECHOES + NCCL_ECHOES + HCCL_ECHOES)
def test_the_dead_process_wins_over_every_echo(echo):
    dead = failure(1, "died", "The actor died unexpectedly before finishing this task.", 3.0)
    assert root_cause([failure(0, "error", echo, 1.0), dead, failure(2, "error", echo, 2.0)]) is dead


def test_among_echoes_alone_the_earliest_is_the_cause():
    first, later = failure(1, "error", NCCL_ECHOES[0], 1.0), failure(0, "error", NCCL_ECHOES[1], 2.0)
    assert root_cause([later, first]) is first


@pytest.mark.parametrize("survivor", REAL_ERRORS[-1:] + ["ConnectionError: rank 0: connection closed by peer rank 1"])
def test_a_rank_killed_by_sigkill_under_torchrun_wins_over_a_survivor_s_earlier_error(survivor):
    # torchrun reports its node's killed rank as an error with the signal's exit code; a survivor's
    # own words for the broken collective (not a known echo) came first.
    survivor_first = failure(0, "error", survivor, 1.0)
    killed = WorkerFailure(1, "error", "rank 1 exited with code -9\nexitcode  : -9 (pid: 4242)", None, 2.0, exit_code=-9)
    assert root_cause([survivor_first, killed]) is killed
