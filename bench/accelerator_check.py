"""One prepared check for a real accelerator (issue 31; docs/accelerator.md).

    .venv/bin/python bench/accelerator_check.py --out DIR [--dry-run] [--megatron-lm DIR]
                                                [--ray-address ADDR] [--budget-s 480]

On a CUDA host it runs six stages in at most ``--budget-s`` seconds, each writing its figures
into DIR/report.json and DIR/report.md as soon as it ends (a machine taken back half-way
leaves the stages done):

1. ``health``: ``runmgr health-check --json`` on the host (the real ``nvidia-smi -q`` parsed,
   the compute probe on the device, the verdict).
2. ``demo``: the demo on one rank, bf16, with the faults of OPT's Run 12 that make sense on
   one rank (a killed worker, a hang, a garbage-data spike); its chronicle and decisions, and
   its losses against an unbroken run of the same config (``runmgr logbook compare``).
3. ``throughput``: a LLaMA-style model of about 1B parameters (TinyLlama's shape), bf16,
   sequence 2,048, the largest micro-batch that fits: tokens/s, MFU and the peak memory
   against ``runmgr launch --dry-run``'s estimate, beside published MFU figures.
4. ``warm_state``: the time to copy that model's parameters and optimizer state to host memory
   (pageable, as runmgr's warm snapshots do today, and page-locked), as GB/s against the
   link's own copy speed, and its cost per step at ``checkpoint.memory_interval`` 1, 10, 100.
5. ``megatron``: Megatron-LM's own ``pretrain_gpt.py`` (``--megatron-lm DIR``, its checkout kept
   outside this project) under ``trainer.kind=megatron`` with a kill; without it, what stopped it.
6. ``warm_nccl``: on three or more GPUs (two ranks and a ready spare), a warm recovery over NCCL
   (a killed rank replaced by the spare from memory), timed; with fewer, the report says it was
   not possible.

``--dry-run`` runs every stage's code path on CPU with tiny sizes (gloo, fp32, the stand-in
Megatron script of tests/e2e/standin), so that CI keeps the script working between the rare
times a GPU is lent (tests/bench/test_accelerator_check.py); its ``runmgr`` commands are forked
from a fork server this script forks at its start (:class:`ForkedCommands`), where a GPU's check
starts each as a new ``python -m runmgr``. Every launch joins one Ray: ``--ray-address``'s, else
one this script starts and ends.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
STANDIN = ROOT / "tests" / "e2e" / "standin" / "pretrain_gpt.py"

PUBLISHED_MFU = [
    {"system": "torchtitan", "figure": "33-39% MFU", "what": "Llama 3.1 8B, FSDP on 8 or 128 H100, bf16 "
     "(with and without torch.compile)", "source": "pytorch/torchtitan docs/performance.md"},
    {"system": "torchtitan", "figure": "56.3-58.2% MFU", "what": "Llama 3 8B, FSDP on 64 A100 80GB, local batch 1",
     "source": "pytorch/torchtitan docs/performance.md"},
    {"system": "Megatron-LM", "figure": "up to 47% MFU", "what": "GPT models on H100 clusters (GPT-3 175B: "
     "390 TFLOP/s per GPU)", "source": "NVIDIA/Megatron-LM README.md"},
    {"system": "Megatron-LM", "figure": "48% of peak", "what": "a 1.2B GPT-2 on one V100 (62.4 TFLOP/s)",
     "source": "nv-adlr.github.io, MegatronLM's Supercharged V1.0 (2020)"},
]
"""No published figure is for a 1B model on one H200: these are the nearest, cited as they are."""


@dataclass(frozen=True)
class Sizes:
    """What each stage trains: the GPU's sizes, or the dry run's tiny ones."""

    device: str
    bf16: bool
    demo: list[str]
    """Overrides of the demo's model and steps (conf=demo)."""
    demo_iters: int
    faults: tuple[tuple[int, str], ...]
    """The demo's faults on one rank (step, fault): each is put behind a pause at its step."""
    big_model: list[str]
    """The throughput model's trainer overrides (model.*)."""
    micro_batches: tuple[int, ...]
    """Tried in order; the largest that fits is measured."""
    measured_steps: int
    warmup_steps: int
    intervals: tuple[int, ...] = (1, 10, 100)
    link_bytes: int = 1 << 30
    health: tuple[str, ...] = ()
    """Overrides of the health check's probes (the GPU's check runs them as a user's would)."""


GPU = Sizes(
    device="cuda", bf16=True, demo=[], demo_iters=120,
    faults=((25, "{kind: kill_worker, at_step: 25, rank: 0}"), (45, "{kind: hang_rank, at_step: 45, rank: 0, duration_s: 600}"),
            (70, "{kind: garbage_data, at_step: 70, steps: 15}")),
    # TinyLlama 1.1B's shape (22 layers, 2048 wide, 32 heads, 4 KV groups); the byte corpus's 256 tokens.
    big_model=["model.num_layers=22", "model.hidden_size=2048", "model.ffn_hidden_size=5632",
               "model.num_attention_heads=32", "model.num_query_groups=4", "model.seq_length=2048",
               "model.max_position_embeddings=2048"],
    micro_batches=(2, 4, 8, 16, 32), measured_steps=8, warmup_steps=3)

DRY = Sizes(
    device="cpu", bf16=False,
    demo=["model.num_layers=1", "model.hidden_size=64", "model.ffn_hidden_size=172", "model.seq_length=64",
          "model.max_position_embeddings=64", "training.micro_batch_size=2", "training.global_batch_size=4",
          "data.corpus_max_bytes=400000"],
    demo_iters=60,
    faults=((12, "{kind: kill_worker, at_step: 12, rank: 0}"), (22, "{kind: hang_rank, at_step: 22, rank: 0, duration_s: 600}"),
            (40, "{kind: garbage_data, at_step: 40, steps: 12}")),
    big_model=["model.num_layers=1", "model.hidden_size=64", "model.ffn_hidden_size=172", "model.seq_length=64",
               "model.max_position_embeddings=64"],
    micro_batches=(2, 4), measured_steps=3, warmup_steps=1, link_bytes=16 << 20,
    # The dry run's verdict is that the check runs and admits the node, not its figures: small
    # probes, as the health check's own tests use where a figure's size is not the point.
    health=("health.compute.matmul_size=256", "health.compute.bandwidth_mb=8", "health.compute.repeats=1",
            "health.storage.probe_mb=1", "health.storage.latency_ops=2"))


@dataclass
class Context:
    """What every stage shares."""

    out: Path
    sizes: Sizes
    dry_run: bool
    ray_address: str
    megatron_lm: Optional[Path]
    gpus: int
    deadline: float
    best: dict = field(default_factory=dict)
    """The throughput stage's micro-batch, for the warm-state stage."""
    forks: Optional["ForkedCommands"] = None
    """The dry run's: its ``runmgr`` commands forked instead of each a new Python. None: a new
    ``python -m runmgr`` each, as on a GPU."""

    @staticmethod
    def environment() -> dict[str, str]:
        """What every runmgr command this check starts runs with: this checkout, and no Ray token
        (the commands join the check's Ray by its address)."""
        return {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}

    def runmgr(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        timeout = max(30.0, min(timeout, self.deadline - time.monotonic()))
        if self.forks is None:
            return subprocess.run([sys.executable, "-m", "runmgr", *args], cwd=ROOT, env=self.environment(),
                                  text=True, capture_output=True, timeout=timeout)
        out, err = self.forks.output()
        child = self.forks.start(list(args), self.environment(), stdout=out, stderr=err)
        code = child.wait_or_kill(timeout)
        return subprocess.CompletedProcess(["runmgr", *args], code, out.read_text(), err.read_text())

    @staticmethod
    def in_process(*args: str) -> subprocess.CompletedProcess:
        """``runmgr ARGS`` run in this process (its output captured): the same command and output
        as a new ``python -m runmgr`` would give, without a Python's start-up and the CLI's
        imports. Only for commands that start nothing and join no Ray: the logbook's reads (ten
        a check) and ``launch --dry-run``'s plan."""
        from runmgr.cli import main as runmgr_main

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = runmgr_main(list(args))
        return subprocess.CompletedProcess(["runmgr", *args], code, out.getvalue(), err.getvalue())

    @classmethod
    def logbook(cls, *args: str) -> subprocess.CompletedProcess:
        """``runmgr logbook ARGS``, in this process."""
        return cls.in_process("logbook", *args)

    def run_dir(self, name: str) -> Path:
        """A fresh run directory: a run left there by an earlier check would be resumed."""
        run_dir = self.out / "runs" / name
        if run_dir.exists():
            shutil.rmtree(run_dir)
        return run_dir

    def launch(self, name: str, *overrides: str) -> tuple[subprocess.CompletedProcess, Path]:
        run_dir = self.run_dir(name)
        result = self.runmgr("launch", "conf=demo", f"run.dir={run_dir}", f"run.name={name}",
                             f"cluster.address={self.ray_address}", *device_overrides(self.sizes),
                             "health.skip=true", *overrides)
        (self.out / f"{name}.log").write_text(result.stdout + result.stderr)
        return result, run_dir

    def conducted_launch(self, name: str, conduct: Callable[[Path, dict], None], *overrides: str) -> tuple[int, Path]:
        """A launch in the background; ``conduct(run_dir, status)`` is called on each new status.json
        until the driver exits (it releases pauses, kills a rank); the exit code."""
        run_dir = self.run_dir(name)
        command = ["launch", "conf=demo", f"run.dir={run_dir}", f"run.name={name}",
                   f"cluster.address={self.ray_address}", *device_overrides(self.sizes), "health.skip=true", *overrides]
        with open(self.out / f"{name}.log", "w") as log:
            if self.forks is None:
                driver = subprocess.Popen([sys.executable, "-m", "runmgr", *command], cwd=ROOT, env=self.environment(),
                                          stdout=log, stderr=subprocess.STDOUT)
            else:  # its output and errors into the log, as above
                driver = self.forks.start(command, self.environment(), stdout=Path(log.name), stderr=Path(log.name))
            try:
                while driver.poll() is None:
                    if time.monotonic() > self.deadline + 120:
                        raise TimeoutError(f"{name}: the run outlived the time budget")
                    status_file = run_dir / "status.json"
                    if status_file.is_file():
                        try:
                            conduct(run_dir, json.loads(status_file.read_text()))
                        except json.JSONDecodeError:
                            pass  # read while being replaced: the next look reads it whole
                    time.sleep(0.1)
            finally:
                if driver.poll() is None:
                    driver.kill()
                driver.wait()
        return driver.returncode, run_dir

    def metric_rows(self, run_dir: Path) -> list[dict]:
        """The run's step rows (``runmgr logbook metrics --json``), in order."""
        shown = self.logbook("metrics", str(run_dir), "--json")
        return [json.loads(line) for line in shown.stdout.splitlines() if line.startswith("{")]

    def events(self, run_dir: Path) -> list[dict]:
        shown = self.logbook("events", str(run_dir), "--json")
        return [json.loads(line) for line in shown.stdout.splitlines() if line.startswith("{")]


class ForkedCommands:
    """The dry run's ``runmgr`` commands (its health check and four launches' drivers), each a
    process of its own forked from a fork server (tests/forkserver.py) that this process forked
    at its start, instead of a new Python: no interpreter start and no imports again (about 2
    CPU-seconds and as many seconds of wall a command; more in the suite, where this process is
    itself forked from the tests' CLI fork server, which imported runmgr's CLI). A command's
    output, exit code and signals are a new Python's (the fork server's doc). A GPU's check
    starts each as a new ``python -m runmgr``, its process having initialised CUDA by then."""

    def __init__(self) -> None:
        from tests.cli import CLI_PRELOAD
        from tests.forkserver import ForkServer

        self.scratch = Path(tempfile.mkdtemp(prefix="accelerator-check-"))
        self.server = ForkServer.forked(CLI_PRELOAD)  # what the server imports, the tests' CLI server does
        self.started = 0

    def output(self) -> tuple[Path, Path]:
        """Files for the next command's stdout and stderr."""
        return self.scratch / f"{self.started + 1}.stdout", self.scratch / f"{self.started + 1}.stderr"

    def start(self, args: list[str], env: dict, stdout: Path, stderr: Path):
        """``python -m runmgr ARGS`` (a process with ``poll``, ``wait``, ``kill`` and ``returncode``
        as a Popen's); ``stdout`` may be ``stderr``: one file, as ``stderr=STDOUT`` makes it."""
        self.started += 1
        return self.server.start(args, module="runmgr", cwd=str(ROOT), env=env, stdout=stdout, stderr=stderr,
                                 exit_file=self.scratch / f"{self.started}.exit")

    def close(self) -> None:
        self.server.close()  # it kills a command still running
        shutil.rmtree(self.scratch, ignore_errors=True)


def precision(sizes: Sizes) -> list[str]:
    return ["precision.bf16=true"] if sizes.bf16 else []


def device_overrides(sizes: Sizes) -> list[str]:
    """A launch's device: one accelerator reserved per rank on a GPU (Ray hides the GPUs from an
    actor that reserves none)."""
    return [f"device={sizes.device}"] + (["cluster.devices_per_worker=1"] if sizes.device == "cuda" else [])


# --- 1. the health check ------------------------------------------------------------------------

def stage_health(ctx: Context) -> dict:
    result = ctx.runmgr("health-check", f"device={ctx.sizes.device}", f"cluster.address={ctx.ray_address}",
                        f"run.dir={ctx.out / 'runs' / 'health'}", *ctx.sizes.health, "--json")
    (ctx.out / "health.json").write_text(result.stdout)
    if not result.stdout.lstrip().startswith("{"):
        return {"status": "failed", "notes": [f"health-check exit {result.returncode}: {result.stderr.strip()[-500:]}"]}
    report = json.loads(result.stdout)
    facts = [{key: value for key, value in node.get("facts", {}).items()
              if re.search(r"driver|ecc|retired|xid|gpu|cuda|device|torch", key, re.I)}
             for node in report.get("nodes", [])]
    figures = [{key: value for key, value in node.get("figures", {}).items() if key.startswith("compute.")}
               for node in report.get("nodes", [])]
    return {"status": "ok" if result.returncode in (0, 1) else "failed",
            "figures": {"exit_code": result.returncode, "admitted": report.get("admitted_node_ids"),
                        "excluded": report.get("excluded"), "device_facts": facts, "compute": figures},
            "notes": ["exit 1 means a node was excluded: its reasons are under excluded"]}


# --- 2. the demo through Run 12's one-rank faults ---------------------------------------------

def kept_losses(ctx: Context, run_dir: Path) -> dict[int, float]:
    losses = {}
    for row in ctx.metric_rows(run_dir):
        losses[int(row["step"])] = float(row["loss"])  # a later sub-run's row of a step replaces a rolled-back one
    return losses


def garbage_step(sizes: Sizes) -> int:
    return next(step for step, fault in sizes.faults if "garbage_data" in fault)


def paused_schedule(faults: tuple[tuple[int, str], ...]) -> tuple[str, dict[str, str]]:
    """The faults, each behind a pause at its step, so that each acts at its own step whatever the
    speed of the steps against the driver's view of them (on a fast device hundreds of steps
    may pass before the driver sees the one a fault is keyed to): the ranks wait at the step,
    the fault fires, and the pause is released. The override, and each pause's label with the
    label of the fault it waits for."""
    entries, waits = [], {}
    for step, fault in faults:
        pause, index = f"{len(entries)}:pause_at_step@{step}", len(entries) + 1
        entries += [f"{{kind: pause_at_step, at_step: {step}}}", fault]
        kind = re.search(r"kind: (\w+)", fault)[1]
        waits[pause] = f"{index}:{kind}@{step}"
    return "chaos.faults=[" + ", ".join(entries) + "]", waits


def release_after_faults(waits: dict[str, str]) -> Callable[[Path, dict], None]:
    """Release each pause once its fault has fired."""
    from runmgr.chaos.build import release_file
    from runmgr.chaos.state import ChaosState

    def conduct(run_dir: Path, status: dict) -> None:
        state = ChaosState(run_dir)
        for pause, fault in waits.items():
            if state.has_fired(pause) and state.has_fired(fault) and not release_file(run_dir, pause).exists():
                release_file(run_dir, pause).touch()

    return conduct


def stage_demo(ctx: Context) -> dict:
    sizes = ctx.sizes
    common = ["cluster.num_workers=1", "cluster.local_nodes=1", "watcher=demo", "policy=demo",
              f"training.train_iters={sizes.demo_iters}", "checkpoint.save_interval=10", *precision(sizes), *sizes.demo]
    schedule, waits = paused_schedule(sizes.faults)
    code, run_dir = ctx.conducted_launch("demo", release_after_faults(waits), *common, schedule)
    unbroken, reference_dir = ctx.launch("demo-unbroken", *common, "chaos=none")
    events = ctx.events(run_dir)
    incidents = [f"{e['subrun']} {e['kind']}" for e in events if e.get("type") == "incident"]
    decisions = [f"{e['subrun']} {e.get('action')}" for e in events if e.get("type") == "decision"]
    chronicle = ctx.logbook("show", str(run_dir)).stdout
    (ctx.out / "demo_chronicle.txt").write_text(chronicle)
    compared = ctx.logbook("compare", str(reference_dir), str(run_dir))
    (ctx.out / "demo_compare.txt").write_text(compared.stdout + compared.stderr)
    ours, theirs = kept_losses(ctx, run_dir), kept_losses(ctx, reference_dir)
    common_steps = sorted(set(ours) & set(theirs))
    differing = next((s for s in common_steps if ours[s] != theirs[s]), None)
    verdict = next((line for line in compared.stdout.splitlines() if line.startswith("verdict")), "no verdict")
    ok = code == 0 and unbroken.returncode == 0
    return {"status": "ok" if ok else "failed",
            "figures": {"exit_codes": [code, unbroken.returncode], "incidents": incidents,
                        "decisions": decisions, "steps_kept": len(ours),
                        "identical_losses_until_step": differing, "garbage_at_stream_step": garbage_step(sizes),
                        "compare_verdict": verdict},
            "notes": ["the resumes after the kill and the hang repeat the unbroken run's losses up to the "
                      "rollback's skipped window, which starts a few steps before the garbage's onset (from "
                      "there on the run trains on other data than the unbroken one)",
                      "CUDA is deterministic here only as far as the trainer's deterministic mode makes it "
                      "(torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG): compare's verdict says "
                      "whether the resumed losses stayed identical or inside its noise band"],
            "files": ["demo_chronicle.txt", "demo_compare.txt", "demo.log"]}


# --- 3. throughput, and 4. the warm state on the device -----------------------------------------

class Enough(Exception):
    """Raised by the collecting reporter once the measured steps are in: the bench stops there
    (no final checkpoint of a 1B model written for nothing)."""


def collecting_reporter(steps: int, seen: list):
    from trainer import NullReporter

    class Collect(NullReporter):
        def step(self, report) -> None:
            seen.append(report)
            if len(seen) >= steps:
                raise Enough()

    return Collect()


def trainer_config_for(ctx: Context, micro_batch: int, save_dir: Path, memory_interval: int = 0):
    from trainer.cli import compose, trainer_config

    overrides = [*ctx.sizes.big_model, f"device={ctx.sizes.device}", f"training.micro_batch_size={micro_batch}",
                 f"training.global_batch_size={micro_batch}", "training.train_iters=100000",
                 "training.deterministic=false", "training.local_norms_interval=0", "checkpoint.save_interval=100000",
                 f"checkpoint.save={save_dir}", f"checkpoint.memory_interval={memory_interval}",
                 *precision(ctx.sizes)]
    return trainer_config(compose("demo", [], ROOT / "conf"), overrides)


def train_steps(ctx: Context, micro_batch: int, steps: int, recovery=None) -> list:
    from runmgr.ports import rendezvous_port
    from trainer import DistEnv, ResumePlan, train

    seen: list = []
    config = trainer_config_for(ctx, micro_batch, ctx.out / "scratch")
    try:
        train(config, ResumePlan(), collecting_reporter(steps, seen), DistEnv(master_port=rendezvous_port()),
              recovery=recovery)
    except Enough:
        pass
    return seen


def is_out_of_memory(error: BaseException) -> bool:
    return "out of memory" in str(error).lower()


def free_device_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def dry_run_estimate(ctx: Context, micro_batch: int) -> Optional[str]:
    shown = ctx.in_process("launch", "--dry-run", "conf=demo", f"device={ctx.sizes.device}", "cluster.num_workers=1",
                       *ctx.sizes.big_model, f"training.micro_batch_size={micro_batch}",
                       f"training.global_batch_size={micro_batch}", *precision(ctx.sizes))
    return next((line.strip() for line in shown.stdout.splitlines() if line.strip().startswith("memory/device")), None)


def stage_throughput(ctx: Context) -> dict:
    sizes, tried = ctx.sizes, {}
    best: Optional[tuple[int, list]] = None
    for micro_batch in sizes.micro_batches:
        try:
            reports = train_steps(ctx, micro_batch, sizes.warmup_steps + sizes.measured_steps)
        except RuntimeError as error:  # torch.OutOfMemoryError is one: the previous size was the largest
            if not is_out_of_memory(error):
                raise
            tried[micro_batch] = "out of memory"
            break
        finally:
            free_device_memory()
        tried[micro_batch] = "fits"
        best = (micro_batch, reports)
    if best is None:
        return {"status": "failed", "figures": {"tried": tried}, "notes": ["not even the smallest micro-batch fits"]}
    micro_batch, reports = best
    measured = reports[sizes.warmup_steps:]
    mfu = [r.mfu for r in measured if r.mfu is not None]
    ctx.best = {"micro_batch": micro_batch, "step_s": statistics.median(r.step_time for r in measured)}
    peak = max(max(r.peak_memory_bytes) if isinstance(r.peak_memory_bytes, (list, tuple)) else r.peak_memory_bytes
               for r in measured)
    return {"status": "ok",
            "figures": {"micro_batch": micro_batch, "tried": tried, "tokens_per_s": statistics.median(r.tokens_per_s for r in measured),
                        "mfu": statistics.median(mfu) if mfu else None, "step_s": ctx.best["step_s"],
                        "peak_memory_gib": peak / 2**30, "dry_run_estimate": dry_run_estimate(ctx, micro_batch),
                        "published": PUBLISHED_MFU},
            "notes": ["one rank, no data-parallel traffic; vocabulary of 256 (the byte corpus), so the output "
                      "layer is a sliver of a 32k-vocabulary model's", "MFU: PaLM's 6N + 12Lhs FLOPs per token "
                      "(docs/throughput.md) over the device's dense bf16 peak"] +
                     (["dry run: CPU has no peak FLOP/s, so MFU is n/a"] if ctx.dry_run else [])}


def link_speed_gbps(nbytes: int, device: str) -> dict:
    """Copy speed device -> host, into pageable and page-locked memory, of one big buffer."""
    import torch

    def timed(copy: Callable[[], None]) -> float:
        copy()  # first touch of the pages
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(3):
            copy()
        if device == "cuda":
            torch.cuda.synchronize()
        return 3 * nbytes / (time.perf_counter() - started) / 1e9

    source = torch.empty(nbytes, dtype=torch.uint8, device=device)
    pageable = torch.empty(nbytes, dtype=torch.uint8)
    figures = {"pageable_gbps": timed(lambda: pageable.copy_(source))}
    if device == "cuda":
        pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        figures["pinned_gbps"] = timed(lambda: pinned.copy_(source, non_blocking=True))
    return figures


class TimedSnapshots:
    """A recovery (trainer/recovery/hooks.py) that only takes runmgr's warm snapshot every
    ``interval`` steps (trainer/host_state.py, as the warm path does) and times each."""

    keeps_reports = False

    def __init__(self, interval: int, pin: bool, seconds: list) -> None:
        self.interval, self.pin, self.seconds, self.kept = interval, pin, seconds, None

    def on_start(self, session) -> None:
        pass

    def on_commit(self, session, step, report) -> None:
        pass

    def after_step(self, session, step: int) -> None:
        from trainer import host_state
        from trainer.recovery.state import capture

        if step % self.interval:
            return
        session.ctx.device.synchronize()
        started = time.perf_counter()
        self.kept = host_state.take(capture(session), self.kept, pin=self.pin)
        session.ctx.device.synchronize()
        self.seconds.append(time.perf_counter() - started)

    def on_failure(self, session, error) -> None:
        return None


def stage_warm_state(ctx: Context) -> dict:
    if not ctx.best:
        return {"status": "failed", "notes": ["needs the throughput stage's micro-batch"]}
    sizes, micro_batch = ctx.sizes, ctx.best["micro_batch"]
    link = link_speed_gbps(sizes.link_bytes, sizes.device)
    figures: dict = {"link": link, "micro_batch": micro_batch}
    pins = (False, True) if sizes.device == "cuda" else (False,)
    for pin in pins:
        seconds: list = []
        kept: list = []

        def recovery(config, device, dist_env, _pin=pin):
            kept.append(TimedSnapshots(1, _pin, seconds))
            return kept[-1]

        reports = train_steps(ctx, micro_batch, sizes.warmup_steps + sizes.measured_steps, recovery=recovery)
        state_bytes = int(kept[-1].kept.buffer.numel())
        copy_s = statistics.median(seconds[1:] or seconds)  # the first allocates the buffer
        step_s = statistics.median(r.step_time for r in reports[sizes.warmup_steps:])
        name = "pinned" if pin else "pageable"
        figures[name] = {"state_gb": state_bytes / 1e9, "snapshot_s": copy_s, "gbps": state_bytes / copy_s / 1e9,
                         "step_s_with_a_snapshot_each_step": step_s,
                         "cost_per_step": {str(n): copy_s / n / ctx.best["step_s"] for n in sizes.intervals}}
        free_device_memory()
    return {"status": "ok", "figures": figures,
            "notes": ["cost per step = snapshot seconds / memory_interval / the throughput stage's step seconds "
                      "(the snapshot is synchronous: the step waits for it)",
                      "pageable: what runmgr's warm snapshots allocate today (trainer/host_state.py); pinned: the "
                      "same copy into page-locked memory (host_state.take(pin=True))"]}


# --- 5. Megatron-LM, and 6. a warm recovery over NCCL -------------------------------------------

def stage_megatron(ctx: Context) -> dict:
    if ctx.dry_run:
        script, what = STANDIN, "the stand-in pretrain_gpt.py (tests/e2e/standin: Megatron's real log lines, no math)"
    elif ctx.megatron_lm is None or not (ctx.megatron_lm / "pretrain_gpt.py").is_file():
        return {"status": "not possible", "notes": ["no Megatron-LM checkout given (--megatron-lm DIR with "
                                                     "pretrain_gpt.py, its packages installed beforehand)"]}
    else:
        script, what = ctx.megatron_lm / "pretrain_gpt.py", f"Megatron-LM's own {ctx.megatron_lm / 'pretrain_gpt.py'}"
    save = ctx.out / "megatron-ckpt"
    if save.exists():
        shutil.rmtree(save)  # a checkpoint left by an earlier check would be resumed from
    args = ["--save", str(save), "--load", str(save), "--train-iters", "40", "--global-batch-size", "8",
            "--micro-batch-size", "4", "--lr", "1e-3", "--min-lr", "1e-4", "--save-interval", "10",
            "--log-interval", "1", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
            "--seq-length", "64", "--max-position-embeddings", "64"]
    if not ctx.dry_run:  # Megatron-LM's own data and tokenizer for a job with no dataset (the stand-in has none)
        args += ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "256", "--bf16"]
    result, run_dir = ctx.launch("megatron", "trainer.kind=megatron", f"megatron.script={script}",
                                 "megatron.args=[" + ",".join(args) + "]", "cluster.num_workers=1",
                                 "megatron.nproc_per_node=1", "watcher=demo", "policy=demo",
                                 "chaos.faults=[{kind: kill_worker, at_step: 15, rank: 0}]")
    events = ctx.events(run_dir)
    commands = [{"subrun": e["subrun"], "argv": e["data"]["argv"]} for e in events
                if e.get("type") == "event" and e.get("kind") == "command"]
    (ctx.out / "megatron_commands.json").write_text(json.dumps(commands, indent=1))
    (ctx.out / "megatron_chronicle.txt").write_text(ctx.logbook("show", str(run_dir)).stdout)
    return {"status": "ok" if result.returncode == 0 else "failed",
            "figures": {"script": what, "exit_code": result.returncode,
                        "incidents": [f"{e['subrun']} {e['kind']}" for e in events if e.get("type") == "incident"],
                        "subruns": len(commands)},
            "notes": ["a garbage window needs the job's own indexed dataset (runmgr prepare-data) instead of "
                      "--mock-data: not run here"],
            "files": ["megatron_commands.json", "megatron_chronicle.txt", "megatron.log"]}


def stage_warm_nccl(ctx: Context) -> dict:
    if not ctx.dry_run and ctx.gpus < 3:
        return {"status": "not possible", "notes": [f"{ctx.gpus} GPU(s) on this host: a warm recovery over NCCL "
                                                     "needs three, two ranks and a ready spare"]}
    extra = ["cluster.cpus_per_worker=0.5"] if ctx.dry_run else []
    killed: list = []
    code, run_dir = ctx.conducted_launch("warm", kill_when_the_spare_is_ready(WARM_KILL_AT, killed),
                                         "cluster.num_workers=2", "cluster.local_nodes=1", "controller.warm_spares=1",
                                         "checkpoint.memory_interval=1", "training.train_iters=40",
                                         "checkpoint.save_interval=10", *ctx.sizes.demo, *extra, *precision(ctx.sizes),
                                         f"chaos.faults=[{{kind: pause_at_step, at_step: {WARM_KILL_AT}}}]")
    events = ctx.events(run_dir)
    start = next((e for e in events if e.get("type") == "subrun_start" and "incident" in e["evidence"]), None)
    first_step = next((row["time"] for row in ctx.metric_rows(run_dir) if start and row["subrun"] == start["subrun"]),
                      None)
    figures: dict = {"exit_code": code, "backend": "gloo (dry run, CPU)" if ctx.dry_run else "nccl",
                     "decisions": [e.get("action") for e in events if e.get("type") == "decision"]}
    if killed and start is not None:
        evidence = start["evidence"]
        figures |= {"resumed_from": evidence.get("resumed_from"), "steps_lost": evidence.get("steps_lost"),
                    "replaced_ranks": evidence.get("replaced_ranks"),
                    "kill_to_incident_s": evidence["incident"]["time"] - killed[1],
                    "kill_to_new_subrun_s": start["time"] - killed[1],
                    "kill_to_first_step_s": first_step - killed[1] if first_step else None}
    (ctx.out / "warm_chronicle.txt").write_text(ctx.logbook("show", str(run_dir)).stdout)
    return {"status": "ok" if code == 0 and killed else "failed", "figures": figures,
            "notes": ["rank 1 is SIGKILLed while the ranks wait after its step and the spare is ready "
                      "(status.json), then the ranks are released"],
            "files": ["warm.log", "warm_chronicle.txt"]}


WARM_KILL_AT = 20


def kill_when_the_spare_is_ready(step: int, killed: list[int]) -> Callable[[Path, dict], None]:
    """Once every rank waits after ``step`` and the spare is ready: SIGKILL rank 1 (``killed``: its pid
    and the time), then release."""
    import signal

    from runmgr.chaos.build import release_file

    label = f"0:pause_at_step@{step}"

    def conduct(run_dir: Path, status: dict) -> None:
        workers = status.get("workers") or []
        if killed or status.get("ready_spares") != 1 or not workers:
            return
        if status.get("paused_ranks") != sorted(w["rank"] for w in workers) or status.get("step") != step:
            return
        victim = next(w["pid"] for w in workers if w["rank"] == 1)
        os.kill(victim, signal.SIGKILL)
        killed.extend([victim, time.time()])
        release_file(run_dir, label).touch()

    return conduct


STAGES: list[tuple[str, Callable[[Context], dict]]] = [
    ("health", stage_health), ("demo", stage_demo), ("throughput", stage_throughput),
    ("warm_state", stage_warm_state), ("megatron", stage_megatron), ("warm_nccl", stage_warm_nccl)]


# --- the report --------------------------------------------------------------------------------

def markdown(report: dict) -> str:
    lines = [f"# Accelerator check ({'dry run on CPU' if report['dry_run'] else report['device']})", "",
             f"host {report['host']}, {report['gpus']} GPU(s), started {report['started']}", ""]
    for name, stage in report["stages"].items():
        lines += [f"## {name}: {stage['status']} ({stage['seconds']:.1f} s)", ""]
        for key, value in stage.get("figures", {}).items():
            lines.append(f"- {key}: {json.dumps(value, default=str)}")
        for note in stage.get("notes", []):
            lines.append(f"- note: {note}")
        if stage.get("error"):
            lines += ["", "```", stage["error"], "```"]
        lines.append("")
    return "\n".join(lines)


def write(out: Path, report: dict) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "report.md").write_text(markdown(report))


def run_stage(ctx: Context, stage: Callable[[Context], dict]) -> dict:
    if time.monotonic() > ctx.deadline:
        return {"status": "skipped", "notes": ["the time budget (--budget-s) was spent before this stage"]}
    # A stage's failure goes into the report and the next stage runs: the machine is lent for
    # minutes, and one broken stage must not cost the figures of the others.
    try:
        return stage(ctx)
    except Exception as error:  # noqa: BLE001 (recorded whole in the report, not swallowed)
        return {"status": "failed", "error": "".join(traceback.format_exception(error))[-4000:]}


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def start_ray(address: Optional[str]) -> tuple[str, Callable[[], None]]:
    if address:
        return address, lambda: None
    import ray

    from runmgr.cluster import keep_local_ray_offline

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    keep_local_ray_offline(os.environ)
    context = ray.init(address="local", include_dashboard=False, log_to_driver=False)
    return context.address_info["gcs_address"], ray.shutdown


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where report.json, report.md and the runs go")
    parser.add_argument("--dry-run", action="store_true", help="every stage on CPU with tiny sizes")
    parser.add_argument("--megatron-lm", type=Path, help="a Megatron-LM checkout (its pretrain_gpt.py)")
    parser.add_argument("--ray-address", help="join this Ray instead of starting one")
    parser.add_argument("--budget-s", type=float, default=480.0, help="no stage starts after this many seconds")
    parser.add_argument("--stages", default=",".join(name for name, _ in STAGES), help="a comma-separated subset")
    args = parser.parse_args(argv)
    # Forked before this process imports Ray, starts a thread or runs a torch op (the server's rule).
    forks = ForkedCommands() if args.dry_run else None
    try:
        return check(args, forks)
    finally:
        if forks is not None:
            forks.close()


def check(args: argparse.Namespace, forks: Optional[ForkedCommands]) -> int:
    gpus = gpu_count()
    if not args.dry_run and gpus == 0:
        print("accelerator_check: no CUDA device here (torch.cuda.is_available() is False): run it on a GPU host, "
              "or with --dry-run on CPU", file=sys.stderr)
        return 2
    unknown = set(args.stages.split(",")) - {name for name, _ in STAGES}
    if unknown:
        print(f"accelerator_check: unknown stage(s) {', '.join(sorted(unknown))}: choose from "
              f"{', '.join(name for name, _ in STAGES)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    address, stop_ray = start_ray(args.ray_address)
    ctx = Context(args.out.resolve(), DRY if args.dry_run else GPU, args.dry_run, address, args.megatron_lm, gpus,
                  started + args.budget_s, forks=forks)
    report = {"dry_run": args.dry_run, "device": ctx.sizes.device, "gpus": gpus, "host": os.uname().nodename,
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), "stages": {}}
    try:
        for name, stage in STAGES:
            if name not in args.stages.split(","):
                continue
            began = time.monotonic()
            print(f"accelerator_check: {name} ...", file=sys.stderr, flush=True)
            result = run_stage(ctx, stage)
            report["stages"][name] = {**result, "seconds": time.monotonic() - began}
            write(ctx.out, report)
            print(f"accelerator_check: {name} {result['status']} in {time.monotonic() - began:.1f} s",
                  file=sys.stderr, flush=True)
    finally:
        stop_ray()
    print(f"accelerator_check: report in {ctx.out / 'report.md'} ({time.monotonic() - started:.0f} s)")
    return 0 if all(s["status"] in ("ok", "not possible") for s in report["stages"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
