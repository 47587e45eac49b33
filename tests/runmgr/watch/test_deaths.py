"""Worker deaths classified from their real error texts (FORMATS.md)."""

from __future__ import annotations

import pytest

from runmgr.config.policy import PolicyConfig
from runmgr.policy.decision import EXCLUDE_NODE, RESTART
from runmgr.policy.history import History
from runmgr.policy.ladder import decide
from runmgr.watch.deaths import DeathDetector, classify
from runmgr.watch.incidents import WORKER_DEATH
from runmgr.watch.observations import WorkerExit

RAY_ACTOR_DIED = (
    "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
    "\tclass_name: TrainWorker\n\tpid: 16424\n"
    "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: "
    "Worker unexpectedly exits with a connection error code 2. End of file. There are some potential root causes. "
    "(1) The process is killed by SIGKILL by OOM killer due to high memory usage. (2) ray stop --force is called. "
    "(3) The worker is crashed unexpectedly due to SIGSEGV or other unexpected errors.")

CASES = [
    ("hccl_socket_timeout", "network",
     "EI0006: [PID: 1292363] 2025-04-08-18:07:20.444.436 Getting socket times out. Reason: Remote Rank did not "
     "send the data in time. Please check the reason for the rank being stuck"),
    ("hccl_socket_timeout", "network",
     "[PID: 749] 2025-12-29-03:16:15.787.356 Get_Socket_Timeout(EI0006): Getting socket times out. Reason: ..."),
    ("hccl_socket_timeout", "network",
     "[ERROR] HCCL(2717288,python3):2025-07-23-03:49:57.177.194 [hccl_socket_manager.cc:778] "
     "[2734049][Wait][LinkEstablish]wait socket establish timeout, role[1] rank[12] timeout[120]"),
    ("hccl_exec_timeout", "network",
     "EI0002: [PID: 2969] 2025-10-11-15:09:34.713.335 The wait execution of the Notify register times out. "
     "Reason: The Notify register has not received the Notify record from remote rank: [24]."),
    ("hccl_watchdog", "network",
     "[Rank 7] HCCL watchdog thread terminated with exception:\nERR02005 DIST internal error"),
    ("nccl_timeout", "network",
     "[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=469508, "
     "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802212 milliseconds before timing out."),
    ("nccl_timeout", "network",
     "[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation "
     "timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) "
     "ran for 600060 milliseconds before timing out."),
    ("nccl_error", "network",
     "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691, "
     "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3\nncclSystemError: System "
     "call (e.g. socket, malloc) or external library call failed or device error."),
    ("cuda_error", "device",
     "terminate called after throwing an instance of 'c10::CUDAError'\n  what():  CUDA error: unknown error"),
    ("cuda_ecc", "hardware", "RuntimeError: CUDA error: uncorrectable ECC error encountered"),
    ("xid_79", "hardware", "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."),
    ("xid_13", "device", "NVRM: Xid (PCI:0000:01:00): 13, pid=7062, name=python, Graphics Exception"),
    ("npu_uce", "hardware",
     "RuntimeError: npu_allreduce:torch_npu/csrc/core/npu/NPUQueue.cpp:202 NPU function error: UCE ERROR., "
     "error code is 507053\n[ERROR] 2025-01-02-10:00:00 (PID:1234, Device:3, RankID:3) ERR00100 PTA call acl "
     "api failed"),
    ("npu_hbm_ecc", "hardware",
     "RuntimeError: ...compiler_depend.ts:105 NPU function error: aclrtSynchronizeStream, error code is 507054\n"
     "[Error]: reason=[hbm Multi-bit ECC error]"),
    ("storage_stale", "storage", "OSError: [Errno 116] Stale file handle: '/mnt/hpfs/ckpt/iter_0004000/optimizer.pt'"),
    ("storage_disconnected", "storage",
     "ls: cannot open directory '/mnt/s3/ckpt': Transport endpoint is not connected"),
    ("oom", "memory",
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
     "79.15 GiB of which 1.02 GiB is free."),
    ("oom", "memory", "RuntimeError: CUDA error: out of memory"),
    ("oom", "memory",
     "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory. Memory on the node "
     "(IP: 10.0.62.231, ID: e5d953ef) where the task was running was 29.56GB / 30.96GB (0.954733)"),
    ("node_lost", "node",
     "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\nThe actor died "
     "because its node has died. Node Id: 3a4b6075\n\tthe actor's node was terminated unexpectedly: health check "
     "failed due to missing too many heartbeats"),
    ("killed", "killed", RAY_ACTOR_DIED),
    ("hccl_exec_timeout", "network",
     "EI9999: Inner Error! hccl fftsplus task timeout occurred during task execution, stream_id:2, timeout:30min"
     "(default)"),
    ("hccl_error", "network", "OPS function error: HcclAllreduce, error code is 6\nERR01100 OPS call acl api failed"),
    ("nccl_timeout", "network",
     "[rank25]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 25] Heartbeat monitor timed out! Process will be "
     "terminated after dumping debug info. workMetaList_.size()=2"),
    ("nccl_error", "network",
     "H100-2:19989:20082 [1] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer "
     "fe80::a288%ib0<53249> with error 4, opcode 32564, len 32564, vendor err 81 (Send)"),
    ("npu_error", "device",
     "RuntimeError: ...compiler_depend.ts:66 NPU function error: aclrtSynchronizeDevice, error code is 507010"),
    ("xid_94", "device",
     "NVRM: Xid (PCI:0000:01:00): 94, pid=7062, Contained: CE User Channel (0x9). RST: No, D-RST: No"),
    ("storage_disconnected", "storage", "Error: Failed to read directory /mnt/gcs (os error 107)"),
    ("storage_disconnected", "storage",
     "mount.lustre: mount /dev/sdb at /mnt/testfs-OST0001 failed: Cannot send after transport endpoint shutdown"),
    ("storage_stale", "storage", "-bash: cd: /home/x: Stale file handle"),
    ("gloo_peer_lost", "network",
     "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
     "[127.0.0.1]:41231"),
]


@pytest.mark.parametrize("name,category,text", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_every_real_message_class_is_recognised(name, category, text):
    cause = classify(text)
    assert (cause.name, cause.category) == (name, category)
    assert cause.line and cause.line in text


def test_rays_actor_died_text_is_a_kill_not_an_oom_despite_mentioning_the_oom_killer():
    assert classify(RAY_ACTOR_DIED).category == "killed"


def test_a_python_traceback_of_user_code_is_a_bug_quoting_the_exception():
    text = ('Traceback (most recent call last):\n  File "/work/trainer/loop.py", line 88, in run\n'
            '    loss = model(batch)["loss"]\nKeyError: \'loss\'\n')
    cause = classify(text)
    assert (cause.name, cause.category, cause.line) == ("bug", "bug", "KeyError: 'loss'")


def test_a_bare_sigkill_exit_code_is_a_kill_and_silence_is_unknown():
    assert classify("", exit_code=-9).category == "killed"
    assert classify("some text nobody knows", exit_code=1).category == "unknown"


def test_the_detector_reports_one_incident_per_cause_and_node_in_a_subrun():
    detector = DeathDetector()
    text = "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE)"
    first = detector.update(WorkerExit(1, "node-0", text, 10.0, subrun="1.00"), 10.0)
    again = detector.update(WorkerExit(0, "node-0", text, 10.5, subrun="1.00"), 10.5)
    later = detector.update(WorkerExit(1, "node-0", text, 99.0, subrun="1.01"), 99.0)
    assert [i.kind for i in first] == [WORKER_DEATH] and again == [] and len(later) == 1
    assert first[0].evidence["cause"] == "nccl_timeout" and first[0].nodes == ("node-0",)
    assert "rank 1 on node-0 died" in first[0].description


def test_a_refused_checkpoint_write_is_io_and_restarts_rather_than_blaming_a_node():
    from runmgr.config.policy import PolicyConfig
    from runmgr.watch.deaths import classify

    text = "OSError: [Errno 30] Read-only file system: '/runs/demo/checkpoints/step_00000100/__0_0.distcp'"
    cause = classify(text)
    assert cause.category == "io" and "Read-only" in cause.line
    assert PolicyConfig().death_actions["io"] == "restart"


@pytest.mark.parametrize("text", [
    # torch.save's zip writer on a full checkpoint directory (seen as "unknown" before)
    "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598",
    "RuntimeError: [enforce fail at inline_container.cc:603] . PytorchStreamWriter failed writing file "
    "data/0: file write failed",
    "OSError: [Errno 28] No space left on device: '/runs/demo/checkpoints/step_00000020/__1_0.distcp'",
    "sqlite3.OperationalError: database or disk is full",
])
def test_a_full_disk_is_an_io_failure_not_an_unknown_one(text):
    cause = classify(text)
    assert (cause.name, cause.category) == ("io_refused", "io"), cause


# What the driver gets when the trainer refuses its checkpoint: the last lines of Ray's
# text for the actor's exception (runmgr/workers/group.py), then where the worker ran.
BAD_CHECKPOINT = (
    '  File "/work/trainer/checkpoint.py", line 171, in _refuse_inconsistent\n'
    '    raise BadCheckpointError(path, manifest["step"], f"its data hold {name} {saved}, ...")\n'
    "trainer.errors.BadCheckpointError: checkpoint /runs/demo/checkpoints/step_00000020 (step 20) is unusable: "
    "its data hold step 10, its manifest says 20 (pid 4242 on 10.0.0.7)")


def test_a_checkpoint_the_trainer_refuses_is_a_bad_checkpoint_naming_its_path_and_step():
    cause = classify(BAD_CHECKPOINT)
    assert (cause.name, cause.category) == ("bad_checkpoint", "checkpoint")
    assert cause.line.startswith("trainer.errors.BadCheckpointError: checkpoint /runs/demo/")
    (incident,) = DeathDetector().update(WorkerExit(0, "node-0", BAD_CHECKPOINT, 5.0, subrun="1.01"), 5.0)
    assert incident.evidence["checkpoint"] == "/runs/demo/checkpoints/step_00000020"
    assert incident.evidence["checkpoint_step"] == 20 and incident.onset_step == 20
    assert "its data hold step 10, its manifest says 20" in incident.description


def test_a_checkpoint_of_another_model_shape_is_a_config_error_not_a_bad_checkpoint():
    text = ("trainer.errors.CheckpointError: cannot resume from /runs/demo/checkpoints/step_00000020: the checkpoint "
            "holds a model of another shape than the config builds: embedding.weight is [256, 64] there, "
            "[256, 128] here")
    cause = classify(text)
    assert (cause.name, cause.category) == ("startup_config", "config")
    (incident,) = DeathDetector().update(WorkerExit(0, "node-0", text, 5.0, subrun="1.01"), 5.0)
    assert "checkpoint" not in incident.evidence and incident.onset_step is None


def test_a_bad_checkpoint_outside_the_step_directories_names_its_path_but_no_step():
    text = "trainer.errors.BadCheckpointError: checkpoint /data/warm start is unusable: file .metadata is missing"
    (incident,) = DeathDetector().update(WorkerExit(0, "node-0", text, 5.0, subrun="1.01"), 5.0)
    assert incident.evidence["checkpoint"] == "/data/warm start" and "checkpoint_step" not in incident.evidence


MEGATRON_DEATHS = [
    # helper text of the worker group, torchrun's summary field, Megatron's own warning, its tracker line
    ("megatron_rerun", "rerun", "rank 3 exited with code 16"),
    ("megatron_rerun", "rerun", "  exitcode  : 16 (pid: 7081) "),
    ("megatron_rerun", "rerun", "Exiting now. Please resume the job from the same checkpoint to rerun the last "
                                "iteration and establish a diagnostic"),
    ("megatron_validation", "validation", "rank 2 exited with code 17"),
    ("megatron_validation", "validation", "  exitcode  : 17 (pid: 7081) "),
    ("megatron_validation", "validation",
     "ts=2026-08-22 10:11:12.123456 node=n3 device=2 jobID=N/A rank=5 iteration=120 "
     "status=RerunValidationStatus.FIRST_RERUN_REPRODUCIBLE result=nan message='Unexpected result nan'"),
]


@pytest.mark.parametrize("name,category,text", MEGATRON_DEATHS)
def test_megatrons_rerun_machine_exits_are_their_own_categories(name, category, text):
    cause = classify(text)
    assert (cause.name, cause.category) == (name, category) and cause.line in text


def test_the_exit_codes_16_and_17_alone_say_the_cause():
    assert classify("", exit_code=16).category == "rerun"
    assert classify("", exit_code=17).category == "validation"


def test_an_nccl_watchdog_sigabrt_and_an_hccl_heartbeat_loss_stay_network_failures():
    watchdog = ("[rank3]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective "
                "operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600060 "
                "milliseconds before timing out.\n"
                "  rank      : 3 (local_rank: 3)\n  exitcode  : -6 (pid: 912)\n  traceback : Signal 6 (SIGABRT) "
                "received by PID 912")
    assert classify(watchdog, exit_code=-6).category == "network"
    heartbeat = ("EI0002: [PID: 2969] 2025-10-11-15:09:34.713.335 The wait execution of the Notify register times "
                 "out. Reason: The Notify register has not received the Notify record from remote rank: [24]. "
                 "[Heartbeat Lost Occurred]")
    assert classify(heartbeat).category == "network"


def test_a_rerun_restarts_and_a_rejected_result_takes_its_node_out():
    actions = []
    for text in ("rank 3 exited with code 16", "rank 3 exited with code 17"):
        (incident,) = DeathDetector().update(WorkerExit(3, "node-1", text, 1.0, subrun="1.00"), 1.0)
        actions.append(decide(incident, History(), PolicyConfig(), []).action)
    assert actions == [RESTART, EXCLUDE_NODE]


# --- A job that stops at its start for what it was given: deterministic, a person's to fix ---------

USAGE_ERRORS = [
    ("usage_error", "usage: pretrain_gpt.py [-h] [--num-layers NUM_LAYERS]\n"
                    "pretrain_gpt.py: error: unrecognized arguments: --bogus-flag 3",
     "pretrain_gpt.py: error: unrecognized arguments: --bogus-flag 3"),
    ("usage_error", "usage: pretrain_gpt.py [-h]\npretrain_gpt.py: error: the following arguments are required: "
                    "--train-iters", "pretrain_gpt.py: error: the following arguments are required: --train-iters"),
    ("usage_error", "pretrain_gpt.py: error: argument --hidden-size: invalid int value: '4k'",
     "pretrain_gpt.py: error: argument --hidden-size: invalid int value: '4k'"),
    ("import_error", "Traceback (most recent call last):\n  File \"pretrain_gpt.py\", line 12, in <module>\n"
                     "    from megatron.core import mpu\nModuleNotFoundError: No module named 'megatron'",
     "ModuleNotFoundError: No module named 'megatron'"),
    ("import_error", "Traceback (most recent call last):\n  File \"pretrain_gpt.py\", line 3, in <module>\n"
                     "ImportError: cannot import name 'get_args' from 'megatron.training'",
     "ImportError: cannot import name 'get_args' from 'megatron.training'"),
    # Megatron-LM's validate_args (megatron/training/arguments.py) asserts on inconsistent sizes.
    ("argument_check", "Traceback (most recent call last):\n  File \"/m/pretrain_gpt.py\", line 300, in <module>\n"
                       "  File \"/m/megatron/training/arguments.py\", line 441, in validate_args\n"
                       "    assert args.num_layers % args.transformer_pipeline_model_parallel_size == 0, \\\n"
                       "AssertionError: Number of layers should be divisible by the pipeline-model-parallel size",
     "AssertionError: Number of layers should be divisible by the pipeline-model-parallel size"),
    ("missing_file", "Traceback (most recent call last):\n  File \"/m/megatron/core/datasets/indexed_dataset.py\", "
                     "line 40\nFileNotFoundError: [Errno 2] No such file or directory: '/data/corpus_text_document.idx'",
     "FileNotFoundError: [Errno 2] No such file or directory: '/data/corpus_text_document.idx'"),
]


@pytest.mark.parametrize("name,text,line", USAGE_ERRORS, ids=[f"{c[0]}-{i}" for i, c in enumerate(USAGE_ERRORS)])
def test_a_job_that_refuses_what_it_was_given_is_a_config_failure_in_its_own_words(name, text, line):
    cause = classify(text, exit_code=2 if name == "usage_error" else 1)
    assert (cause.name, cause.category, cause.line) == (name, "config", line)
    decision = decide(DeathDetector().update(WorkerExit(0, "n", text, 0.0, 2, "1.00"), 0.0)[0], History(),
                      PolicyConfig(), [])
    assert decision.action == "abort" and line in decision.reason


def test_an_assertion_outside_the_argument_checks_is_a_bug_not_a_config_failure():
    text = ("Traceback (most recent call last):\n  File \"/m/megatron/core/optimizer.py\", line 9, in step\n"
            "AssertionError: grads are not contiguous")
    assert classify(text).category == "bug"


def test_the_death_s_evidence_keeps_its_exit_code_and_last_output():
    exit = WorkerExit(1, "n", "rank 1 exited with code 2\nerror: unrecognized arguments: --x", 0.0, 2, "1.00",
                      output=("usage: pretrain_gpt.py", "pretrain_gpt.py: error: unrecognized arguments: --x"))
    (incident,) = DeathDetector().update(exit, 0.0)
    assert incident.evidence["exit_code"] == 2
    assert incident.evidence["last_output"] == ["usage: pretrain_gpt.py",
                                                "pretrain_gpt.py: error: unrecognized arguments: --x"]
