"""Worker deaths, with the cause read from the worker's error text.

The signatures are the real messages of the runtimes (FORMATS.md: HCCL
EI0006/EI0002/watchdog, NCCL watchdog and errors, CUDA errors and Xids, Ascend
UCE 507053 and HBM multi-bit ECC 507054, ESTALE/ENOTCONN on the checkpoint
path, a checkpoint the trainer found unusable (its path in the evidence), out
of memory, a killed process, a plain Python bug). They are tried in order,
most specific first: a CUDA "out of memory" is memory, not a CUDA
error; Ray's "actor died" text lists "OOM killer" among *possible* causes,
so it is a kill, not an OOM.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from runmgr.choices import DeathCategory

from runmgr.config.watcher import DeviceConfig
from runmgr.watch.incidents import WORKER_DEATH, Incident
from runmgr.watch.observations import WorkerExit

DEATH_CATEGORIES: tuple[str, ...] = DeathCategory.values()
NODE_UNREACHABLE = "is unreachable: its actor did not answer a liveness probe"
"""How a warm group words a rank it found lost with its node before Ray declared the node
dead (runmgr/workers/liveness.py): a ``node_lost`` death."""


@dataclass(frozen=True)
class DeathCause:
    """Why a worker died, as far as its text tells."""

    name: str
    category: DeathCategory
    """What kind of failure, for the policy."""
    label: str
    """What happened, in words."""
    hint: str
    """What a human should look at if it keeps happening."""
    line: str = ""
    """The line of the text that matched."""


@dataclass(frozen=True)
class _Signature:
    name: str
    category: DeathCategory
    label: str
    hint: str
    patterns: tuple[str, ...]
    also: str = ""
    """A pattern the text must hold as well (where the matched line comes from), if any."""


_SIGNATURES = (
    # First: a worker that stopped itself says so in its own words (runmgr/workers/lease.py).
    _Signature("driver_lost", "driver_lost", "the worker stopped itself: its driver fell silent past the lease",
               "the driver's host (load, disk, its link to the workers); raise controller.worker_lease_s if the "
               "driver is often busy that long", (
                   r"\bDriverLostError\b", r"runmgr worker \d+ \(rank \d+\) stopped itself")),
    # Megatron's rerun state machine ends a job on purpose (megatron/core/rerun_state_machine.py).
    _Signature("megatron_rerun", "rerun", "Megatron's rerun machine saved a checkpoint to rerun an iteration (exit 16)",
               "resume from the checkpoint it saved (on another device if possible); the rerun tells a transient "
               "fault from a wrong result", (
                   r"exited with code 16\b", r"exitcode\s*:\s*16\b",
                   r"resume the job from the (?:same )?checkpoint\s+to rerun")),
    _Signature("megatron_validation", "validation", "Megatron rejected a result in validation (exit 17)",
               "the rank, device and iteration of --result-rejected-tracker-filename's line; the device's health", (
                   r"exited with code 17\b", r"exitcode\s*:\s*17\b", r"failed (?:on )?result validation",
                   r"\bts=.+ node=\S+ device=\S+ jobID=\S+ rank=\d+ iteration=\d+ status=")),
    _Signature("npu_hbm_ecc", "hardware", "Ascend HBM multi-bit ECC error (507054)",
               "the NPU's HBM: npu-smi info -t ecc -i N; isolate the device", (
                   r"\b507054\b", r"hbm Multi-bit ECC", r"HBM MULTI BIT ECC")),
    _Signature("npu_uce", "hardware", "Ascend HBM uncorrectable error, UCE (507053)",
               "the NPU's memory: npu-smi info -t health -i N; replace the device if UCE repeats", (
                   r"\b507053\b", r"UCE ERROR", r"device mem error")),
    _Signature("cuda_ecc", "hardware", "CUDA uncorrectable ECC error",
               "nvidia-smi -q -d ECC on the node (volatile uncorrectable > 0 drains it)", (
                   r"uncorrectable ECC error encountered",)),
    _Signature("gpu_lost", "hardware", "GPU fell off the bus",
               "dmesg for Xid 79; the node needs a reboot or the GPU a replacement", (
                   r"GPU has fallen off the bus", r"Unable to determine the device handle for GPU")),
    _Signature("node_lost", "node", "the worker's node died",
               "the node's state in Ray (ray list nodes) and the machine itself", (
                   r"The actor died because its node has died", r"Owner's node has crashed",
                   re.escape(NODE_UNREACHABLE))),
    # runmgr/agents/device_slices.py's words, pushed by a node agent for a rank it could not start.
    _Signature("devices_not_given", "node", "the node's agent was given fewer device ids than its ranks need",
               "the node's Ray: does it see the node's accelerators (`ray status`; a GPU or NPU count given by hand "
               "with --resources comes with no device ids)? By default (policy.death_actions.node) the node is "
               "left out of the next sub-runs", (
                   r"device\(s\) \([^)]*\), \d+ per process, [^:]*: no device for rank \d+",)),
    _Signature("storage_stale", "storage", "stale handle on a shared file system (ESTALE)",
               "the checkpoint path's mount on that node (remount; GPFS/NFS server state)", (
                   r"\[Errno 116\]", r"Stale file handle", r"\bESTALE\b")),
    _Signature("storage_disconnected", "storage", "shared file system disconnected (ENOTCONN/ESHUTDOWN)",
               "the FUSE/Lustre client on that node (fusermount -u, remount)", (
                   r"Transport endpoint is not connected", r"\[Errno 107\]", r"os error 107", r"\bENOTCONN\b",
                   r"Cannot send after transport endpoint shutdown", r"\[Errno 108\]")),
    _Signature("io_refused", "io", "the file system refused a write (read-only, full, or I/O error)",
               "the checkpoint path's file system: mount flags (ro), free space (df), dmesg for I/O errors", (
                   r"\[Errno 30\]", r"Read-only file system", r"\bEROFS\b", r"\[Errno 28\]",
                   r"No space left on device", r"\bENOSPC\b", r"\[Errno 5\] Input/output error",
                   # torch.save's zip writer on a full disk: its write came up short.
                   r"unexpected pos \d+ vs \d+", r"PytorchStreamWriter failed writing file",
                   r"database or disk is full")),
    _Signature("bad_checkpoint", "checkpoint", "the checkpoint it resumed from is unusable",
               "the checkpoint named in the line (it verified, yet its data disagree with its manifest or ask "
               "to run code): it is rejected and the run goes on from the one before it", (
                   r"\bBadCheckpointError: checkpoint ",)),
    _Signature("startup_config", "config", "the trainer refused its configuration or plan",
               "the error line: fix the config (or the plan's checkpoint) and launch again", (
                   r"\bTrainerConfigError\b", r"\bDataError\b", r"size mismatch for \S+: copying a param",
                   r"Size mismatch between saved", r"\bCheckpointError\b")),
    # A job that stops at its start for what it was given: the same command fails the same way.
    _Signature("usage_error", "config", "the job refused its command line (a usage error)",
               "the job's own message: a flag its script does not accept, or a value it cannot read; fix "
               "megatron.args (or the script) and launch again", (
                   r"\berror: unrecognized arguments: ", r"\berror: the following arguments are required: ",
                   r"\berror: argument [-\w/ ,]+: (?:invalid|expected|ambiguous|not allowed|conflicting)",
                   r"\berror: ambiguous option: ")),
    _Signature("import_error", "config", "the job could not import a module it needs",
               "the Python environment of the nodes (torchrun runs with runmgr's interpreter): install what is "
               "missing there, or set PYTHONPATH in megatron.env", (
                   r"^\s*(?:ModuleNotFoundError|ImportError): .*$",)),
    _Signature("argument_check", "config", "the job's own checks of its arguments failed",
               "the assertion's message: an inconsistent setting in megatron.args (sizes that do not divide, "
               "flags that exclude each other)", (
                   r"^\s*AssertionError\b.*$",), also=r"arguments\.py\", line \d+, in |\bin \w*validate\w*args\w*\b"),
    _Signature("missing_file", "config", "a file the job needs does not exist",
               "the path in the message: spelled right in megatron.args, on storage every node mounts?", (
                   r"^\s*FileNotFoundError: .*$", r"^\s*\w*Error: .*\[Errno 2\] No such file or directory")),
    _Signature("oom", "memory", "out of memory",
               "memory per device: micro batch, recompute, or the host's RAM", (
                   r"CUDA out of memory", r"NPU out of memory", r"\bOutOfMemoryError\b", r"\bout of memory\b",
                   r"\bMemoryError\b", r"running low on memory", r"\[Errno 12\] Cannot allocate memory")),
    _Signature("hccl_socket_timeout", "network", "HCCL socket timeout (EI0006)",
               "the RoCE links: hccn_tool -i N -link -g / -net_health -g; HCCL_CONNECT_TIMEOUT", (
                   r"\bEI0006\b", r"Get_Socket_Timeout", r"wait socket establish timeout")),
    _Signature("hccl_exec_timeout", "network", "HCCL execution timeout (EI0002)",
               "the rank named in the message (stuck or dead); HCCL_EXEC_TIMEOUT", (
                   r"\bEI0002\b", r"Notify register times out", r"Heartbeat Lost Occurred",
                   r"hccl fftsplus task timeout")),
    _Signature("hccl_init", "network", "HCCL communicator could not be set up (ERR02200)",
               "every rank reached init? the first rank that failed; HCCL_CONNECT_TIMEOUT and the links", (
                   r"\bERR02200\b", r"hcclCommInitRootInfo\w*\(.*error code is")),
    _Signature("hccl_watchdog", "network", "HCCL watchdog terminated the process",
               "the first failing rank's log; network health of its node", (
                   r"HCCL watchdog thread terminated", r"\bERR02005\b")),
    _Signature("hccl_error", "network", "HCCL collective failed",
               "HCCL logs of the ranks and their links", (
                   r"Hccl\w+, error code is", r"hccl op retry failed", r"\bERR01100\b")),
    _Signature("nccl_timeout", "network", "NCCL watchdog: collective timed out",
               "which rank did not join (stuck, dead or slow); NCCL_DEBUG=INFO", (
                   r"Watchdog caught collective operation timeout", r"Heartbeat monitor timed out",
                   r"watchdog got stuck")),
    _Signature("gloo_peer_lost", "network", "a peer of the gloo group vanished or timed out",
               "the other ranks' exits: this one is usually a consequence", (
                   r"Connection closed by peer", r"Connection reset by peer",
                   r"Timed out waiting \d+ms for (?:recv|send) operation", r"\[Errno 32\] Broken pipe")),
    _Signature("nccl_remote", "network", "NCCL: a remote rank exited or the network failed (ncclRemoteError)",
               "the other ranks' exits (usually the cause) and the links between them", (
                   r"\bncclRemoteError\b", r"remote process exited or there was a network error")),
    _Signature("nccl_error", "network", "NCCL error",
               "NCCL_DEBUG=INFO output and the InfiniBand links (ibstat, port counters)", (
                   r"NCCL error", r"\bnccl(?:System|UnhandledCuda|Remote|Internal)Error\b", r"NCCL WARN",
                   r"DistBackendError")),
    _Signature("npu_error", "device", "Ascend runtime error",
               "the error code in the CANN docs; plog of the device", (
                   r"error code is 50\d{4}", r"\bEZ9999\b", r"\bEE9999\b")),
    _Signature("cuda_error", "device", "CUDA error",
               "dmesg for Xids around the time; CUDA_LAUNCH_BLOCKING=1 if it repeats", (
                   r"CUDA error", r"c10::CUDAError", r"CUDA driver error")),
    _Signature("killed", "killed", "process killed (SIGKILL / actor died unexpectedly)",
               "the node's kernel log for the OOM killer; whoever sent the signal", (
                   r"\bSIGKILL\b", r"[Ss]ignal 9\b", r"exitcode\s*:\s*-9\b", r"^Killed$",
                   r"actor died unexpectedly", r"The actor is dead because its worker process has died",
                   r"A worker died or was killed")),
)
PEER_ECHO_CAUSES = frozenset({
    "gloo_peer_lost", "nccl_timeout", "nccl_remote", "hccl_socket_timeout", "hccl_exec_timeout", "hccl_init",
})
"""Causes a rank reports when *another* rank went away or fell silent: the waiting
side of a collective. When ranks fail together, these lose the root-cause ranking
to a dead process or a real error (FORMATS.md 1.6 and 2.4; MEGATRON.md)."""

_BAD_CHECKPOINT = re.compile(r"BadCheckpointError: checkpoint (\S.*?)(?: \(step (\d{1,18})\))? is unusable: ")
"""trainer.errors.BadCheckpointError's message: the checkpoint's path and step come first."""
_COMPILED = tuple((sig, tuple(re.compile(p, re.MULTILINE) for p in sig.patterns)) for sig in _SIGNATURES)
_ALSO = {sig.name: re.compile(sig.also, re.MULTILINE) for sig in _SIGNATURES if sig.also}
_EXIT_CODE_CAUSES = {16: "megatron_rerun", 17: "megatron_validation"}
"""Exit codes that say the cause themselves (Megatron's EXIT_CODE_RESUME_TO_DISAMBIGUATE and
EXIT_CODE_FAILED_ON_RESULT_VALIDATION)."""
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?[0-9A-Fa-f:.]+\): (\d{1,9}),")
"""(Numbers here are bounded: a job may print thousands of digits, which ``int()`` refuses.)"""
_EXCEPTION_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b.*)$", re.MULTILINE)


def classify(text: str, exit_code: Optional[int] = None,
             fatal_codes: tuple[int, ...] = DeviceConfig().fatal_event_codes) -> DeathCause:
    """The cause of a worker's death from its error text (and exit code)."""
    chosen = _EXIT_CODE_CAUSES.get(exit_code) if exit_code is not None else None
    if chosen is not None:
        sig = next(sig for sig, _ in _COMPILED if sig.name == chosen)
        return DeathCause(sig.name, sig.category, sig.label, sig.hint, f"exit code {exit_code}")
    xid = _XID.search(text)
    if xid:
        code = int(xid.group(1))
        fatal = code in fatal_codes
        return DeathCause(f"xid_{code}", "hardware" if fatal else "device", f"GPU Xid {code}",
                          "the Xid catalog; nvidia-smi -q on the node", _line_at(text, xid.start()))
    for sig, patterns in _COMPILED:
        if sig.name in _ALSO and not _ALSO[sig.name].search(text):
            continue
        for pattern in patterns:
            match = pattern.search(text)
            if match:
                return DeathCause(sig.name, sig.category, sig.label, sig.hint, _line_at(text, match.start()))
    if exit_code in (-9, 137):
        return DeathCause("killed", "killed", f"process killed (exit code {exit_code})",
                          "the node's kernel log for the OOM killer; whoever sent the signal")
    if "Traceback (most recent call last)" in text:
        raised = _EXCEPTION_LINE.findall(text)
        line = raised[-1].strip() if raised else text.strip().splitlines()[-1]
        return DeathCause("bug", "bug", "a Python exception in the training code",
                          "the traceback: restarting will fail the same way until the code or config is fixed",
                          line)
    suffix = f" (exit code {exit_code})" if exit_code is not None else ""
    return DeathCause("unknown", "unknown", f"unrecognised failure{suffix}", "the worker's full log",
                      text.strip().splitlines()[-1] if text.strip() else "")


def _line_at(text: str, index: int) -> str:
    start = text.rfind("\n", 0, index) + 1
    end = text.find("\n", index)
    return text[start:end if end >= 0 else len(text)].strip()[:300]


class DeathDetector:
    """One WORKER_DEATH incident per (sub-run, cause, node): the other ranks'
    exits after the first are consequences of the same failure."""

    def __init__(self, fatal_codes: tuple[int, ...] = DeviceConfig().fatal_event_codes) -> None:
        self.fatal_codes = fatal_codes
        self._seen: set[tuple[str, str, str]] = set()

    def update(self, exit: WorkerExit, now: float) -> list[Incident]:
        """Feed one worker exit; returns its incident unless already reported."""
        cause = classify(exit.text, exit.exit_code, self.fatal_codes)
        key = (exit.subrun, cause.name, exit.node)
        if key in self._seen:
            return []
        self._seen.add(key)
        where = f"rank {exit.rank}" + (f" on {exit.node}" if exit.node else "")
        quoted = f': "{cause.line}"' if cause.line else ""
        evidence = {"cause": cause.name, "category": cause.category, "hint": cause.hint, "line": cause.line,
                    "exit_code": exit.exit_code, **named_checkpoint(cause, exit.text),
                    **({"last_output": list(exit.output)} if exit.output else {})}
        return [Incident(
            kind=WORKER_DEATH, time=now, subrun=exit.subrun, description=f"{where} died: {cause.label}{quoted}",
            # A bad checkpoint's trouble starts at its step (the policy restarts before it).
            onset_step=evidence.get("checkpoint_step"),
            ranks=(exit.rank,) if exit.rank >= 0 else (), nodes=(exit.node,) if exit.node else (),
            evidence=evidence,
        )]


def named_checkpoint(cause: DeathCause, text: str) -> dict:
    """``{"checkpoint": path, "checkpoint_step": step}`` when the trainer died of a
    checkpoint it found unusable (what its BadCheckpointError names; the step only
    when the directory tells one), else nothing."""
    found = _BAD_CHECKPOINT.search(text) if cause.category == DeathCategory.checkpoint else None
    if found is None:
        return {}
    step = {"checkpoint_step": int(found.group(2))} if found.group(2) else {}
    return {"checkpoint": found.group(1), **step}
