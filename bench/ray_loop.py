"""The Ray Train side of bench/restart_latency.py: the demo's model, optimizer
and data from trainer.* in a TorchTrainer with FailureConfig.

    .venv/bin/python bench/ray_loop.py OUT_DIR [key=value ...]   (run by restart_latency.py)

Each rank appends one JSON line per event to OUT_DIR/rank<R>.jsonl: a
``start`` row when the loop starts, a ``ready`` row once the model and
optimizer are built and resumed (with the step it resumed from), and a
``step`` row at the end of every step (before any ray.train.report), each with its wall time, pid and the
attempt (a fresh id per call of the loop), so the benchmark can find the pid
to kill and the first step after Ray Train restarted the group.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from runs import DEMO_QUIET, ROOT, BenchError, bench_env  # noqa: E402

STATE_FILE = "state.pt"


def train_loop(loop_config: dict) -> None:
    """One rank of one attempt: build, resume from Ray's checkpoint, train, report every step."""
    import tempfile
    import uuid

    import ray.train
    import torch

    from trainer.data import build_sample_stream
    from trainer.device import resolve_device
    from trainer.distributed import DistEnv, broadcast_parameters, gather_floats
    from trainer.model import build_model
    from trainer.optim import build_optimizer
    from trainer.plan import ResumePlan
    from trainer.precision import LossScaler
    from trainer.rng import reseed_for_step, seed_everything
    from trainer.parallel.engine import plain_engine
    from trainer.steps import StepContext, forward_backward, micro_batches, optimizer_step

    torch.set_num_threads(1)  # as the trainer does: two ranks share two cores
    config, out_dir, save_interval = loop_config["config"], Path(loop_config["out_dir"]), loop_config["save_interval"]
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    attempt = uuid.uuid4().hex[:8]
    log = open(out_dir / f"rank{rank}.jsonl", "a", buffering=1)

    def record(kind: str, step: int, step_s: float = 0.0) -> None:
        log.write(json.dumps({"kind": kind, "step": step, "time": time.time(), "pid": os.getpid(),
                              "attempt": attempt, "step_s": step_s}) + "\n")

    record("start", 0)  # the worker is up and its process group formed
    checkpoint = ray.train.get_checkpoint()
    state = None
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = torch.load(Path(directory) / STATE_FILE, weights_only=False)
    start_step, cursor = (state["step"], state["cursor"]) if state else (0, 0)
    device = resolve_device("cpu", 0, config.training.deterministic)
    stream = build_sample_stream(config.data, config.model.seq_length, seed=config.training.seed)
    seed_everything(config.training.seed)
    model = build_model(config.model)
    broadcast_parameters(list(model.parameters()), world)
    optimizer = build_optimizer(model, config.optim)
    scaler = LossScaler.from_config(config.precision)
    if state:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    ctx = StepContext(config, ResumePlan(), DistEnv(rank=rank, world_size=world), device, start_step, 0)
    record("ready", start_step)  # built and resumed: where runmgr's trainer sends its StartReport
    engine = plain_engine(model, optimizer, device, rank, world)
    for step in range(start_step + 1, config.training.train_iters + 1):
        started = time.perf_counter()
        reseed_for_step(config.training.seed, step, rank)
        batches, cursor = micro_batches(stream, cursor, ctx)
        local_loss, compute = forward_backward(engine, batches, scaler.scale, ctx)
        optimizer_step(engine, scaler, ctx.lr(step), ctx)
        gathered = gather_floats([local_loss, compute], world, device.torch_device)
        metrics = {"step": step, "loss": sum(row[0] for row in gathered) / world}
        record("step", step, time.perf_counter() - started)
        # Reports only with checkpoints: in Ray 2.60 (v2) report() blocks on a result queue of
        # size 1 that the controller drains once per poll (2 s), so a report per step
        # throttles training to one step per poll (measured: 2.0 s per 0.1 s step).
        if step % save_interval:
            continue
        if rank != 0:
            ray.train.report(metrics)
            continue
        with tempfile.TemporaryDirectory() as directory:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                        "cursor": cursor}, Path(directory) / STATE_FILE)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))


def fit(out_dir: Path, overrides: list[str]) -> None:
    """Child mode: a local Ray and one TorchTrainer.fit over the composed demo config."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from runmgr.cluster import keep_local_ray_offline
    from runmgr.config.compose import load_run_config

    run_config = load_run_config("demo", [*DEMO_QUIET, f"run.dir={out_dir / 'unused'}", *overrides])
    config = run_config.trainer_config()
    keep_local_ray_offline(os.environ)
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, run_config.world_size),
             include_dashboard=False, log_to_driver=False)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"config": config, "out_dir": str(out_dir),
                           "save_interval": run_config.checkpoint.save_interval},
        torch_config=TorchConfig(backend="gloo", timeout_s=int(run_config.parallel.dist_timeout_s)),
        scaling_config=ScalingConfig(num_workers=run_config.world_size, use_gpu=False),
        run_config=RunConfig(name="bench", storage_path=str(out_dir / "storage"),
                             failure_config=FailureConfig(max_failures=3)),
    )
    trainer.fit()
    ray.shutdown()


def run_ray_trainer(out_dir: Path, overrides: list[str]) -> subprocess.Popen:
    """Start :func:`fit` in a child process (its own Ray) writing under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "driver.log", "w") as log:
        return subprocess.Popen([sys.executable, __file__, str(out_dir), *overrides], cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT, env=bench_env(RAY_TRAIN_V2_ENABLED="1"),
                                start_new_session=True)


class RankLog:
    """The rows one rank wrote, across attempts."""

    def __init__(self, out_dir: Path, rank: int) -> None:
        self.out_dir = out_dir
        self.path = out_dir / f"rank{rank}.jsonl"

    def rows(self) -> list[dict]:
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.endswith("}")]

    def wait_for(self, predicate: Callable[[dict], bool], child: subprocess.Popen, timeout: float) -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            match = next((row for row in self.rows() if predicate(row)), None)
            if match is not None:
                return match
            if child.poll() is not None:
                raise BenchError(f"Ray Train child exited ({child.returncode}):\n"
                                 f"{(self.out_dir / 'driver.log').read_text()[-2500:]}")
            time.sleep(0.02)
        raise BenchError(f"timed out waiting in {self.path}")


if __name__ == "__main__":
    fit(Path(sys.argv[1]), sys.argv[2:])
