"""The run directory of a launch that passed its checks: locked, its logbook
open, the next sub-runs of its lineage driven until the run finishes or needs
a person (Ray, the workers, the S3 mirror: imported only for a run that
starts, so that ``runmgr launch --dry-run`` and a refusal answer in a fraction
of the time)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TextIO

from logbook import Logbook
from runmgr import cluster as ray_cluster
from runmgr.approvals import take_answer
from runmgr.config.compose import with_settings
from runmgr.rehearsal import Mapping
from runmgr.config.schema import RunConfig
from runmgr.controller.machine import Controller, SubrunIds, no_uploads
from runmgr.controller.states import Finished, Launching
from runmgr.healthcheck.gate import preflight_health
from runmgr.lint.gate import lint_after_health
from runmgr.lint.run import LintResult, merged
from runmgr.metrics.server import MetricsServer
from runmgr.observers.logbook_writer import record_stop
from runmgr.observers.mirror import upload_leftovers
from runmgr.observers.retention import trainer_keeps_everything
from runmgr.placement import resolve_device_kind
from runmgr.resume import RemoteCheckpoints, RemoteUnavailable, find_resume_point
from runmgr.chaos.build import Chaos, build_chaos
from runmgr.diskspace import DISK_WRITE_ERRORS, DiskReserve, end_on_full_disk, is_disk_full
from runmgr.diskspace import refusal as disk_refusal
from runmgr.errors import DiskFullError, RunStateError
from runmgr.rundir import RunDirLock
from runmgr.status import mark_stopped, read_status, write_starting
from runmgr.stopping import StopRequest, stop_on_signals
from runmgr.workers.placing import refuse_unplaceable
from runmgr.wiring import (
    admitted_for_run, build_judge, build_observers, build_runner, kuberay_replacement, resumer, start_device_poll,
    s3_mirror, start_mirror,
)
from trainer.manifest import read_manifest
from trainer.plan import ResumePlan

if TYPE_CHECKING:
    from runmgr.s3.mirror import S3Mirror

Recompose = Callable[[list[str]], RunConfig]
"""The launch's config composed again with more overrides (the chaos schedule's faulty inputs)."""


def initial_state(config: RunConfig, book: Logbook, ids: SubrunIds,
                  remote: RemoteCheckpoints | None = None) -> Launching | None:
    """A fresh sub-run, or the next one of an existing lineage (None: already done).
    ``remote``: the S3 copies, a source for a checkpoint the local disk lacks."""
    lineage = book.lineage()
    if not lineage:
        return first_state(config, ids, remote)
    driver_lost = lineage[-1].end_state is None  # its driver died (a crash, kill -9, a lost head pod)
    if driver_lost:
        book.abandon(lineage[-1].id)
        lineage = book.lineage()
    last = lineage[-1]
    last_step = last.last_step if last.last_step is not None else last.start_step
    if last.end_state == "finished" and (last_step or 0) >= config.training.train_iters:
        return None
    recorded = max((row["step"] for row in book.kept_metrics()), default=0)
    point = find_resume_point(config.checkpoint_dir(), max_step=recorded, remote=remote)
    # A relaunch keeps the lineage's remedies (skips, LR scale, nodes to avoid) and
    # takes the data-parallel size the user configures now.
    plan = replace(ResumePlan.from_dict(last.plan), start_checkpoint=point.path, data_parallel_size=configured_data_parallel(config))
    if driver_lost:
        cause = (f"relaunch: driver restarted: the driver of sub-run {last.id} stopped without ending it (a crash, "
                 f"a kill, a lost pod) at step {last_step}")
    else:
        cause = f"relaunch: sub-run {last.id} ended as {last.end_state} at step {last_step}"
    evidence = {"previous_subrun": last.id, "resumed_from": point.path, "resumed_step": point.step,
                "driver_restarted": driver_lost,
                "steps_lost": max(0, (last_step or 0) - point.step),
                "rejected_checkpoints": [list(r) for r in point.rejected],
                **({"fetched_from": point.fetched_from} if point.fetched_from else {})}
    subrun = ids.take()
    return Launching(subrun, replace(plan, subrun=subrun), point.step, cause, evidence)


def configured_data_parallel(config: RunConfig) -> int:
    """The data-parallel size the config asks for: cluster.num_workers ranks over
    tensor x pipeline parallel."""
    return config.world_size // max(1, config.parallel.tensor_model_parallel_size
                                    * config.parallel.pipeline_model_parallel_size)


def first_state(config: RunConfig, ids: SubrunIds, remote: RemoteCheckpoints | None) -> Launching:
    """The first sub-run of a run directory without a lineage: from initialisation, or, on a
    fresh machine whose S3 copies hold the run, from the newest one that verifies, with the
    plan its manifest recorded (skips, LR scale: the lineage's remedies)."""
    subrun = ids.take()
    fresh = Launching(subrun, ResumePlan(subrun=subrun, data_parallel_size=configured_data_parallel(config)), 0, "launch", {})
    if remote is None:
        return fresh
    try:
        held = remote.complete_steps()
    except RemoteUnavailable as error:
        raise RunStateError(f"cannot list the S3 copies at {remote.location} ({error}) to know where run "
                            f"{config.run.name} stands: launch again once S3 answers") from None
    point = find_resume_point(config.checkpoint_dir(), remote=remote) if held else None
    if point is None or point.path is None:
        return fresh
    plan = replace(ResumePlan.from_dict(read_manifest(point.path)["plan"]), subrun=subrun,
                   start_checkpoint=point.path, data_parallel_size=configured_data_parallel(config))
    source = point.fetched_from or point.path
    cause = f"launch: no lineage here; resumed from the checkpoint of step {point.step} ({source})"
    evidence = {"resumed_from": point.path, "resumed_step": point.step, "fetched_from": point.fetched_from,
                "rejected_checkpoints": [list(r) for r in point.rejected]}
    return Launching(subrun, plan, point.step, cause, evidence)


def wait_for_lost_workers(run_dir: Path, lease_s: float, out: TextIO, clock=time.time, sleep=time.sleep) -> None:
    """After a driver crash its workers stop themselves within ``lease_s`` of
    its last word; wait that long so they never train beside the new sub-run."""
    try:
        status = read_status(run_dir)
    except RunStateError:
        return
    # Only a lost driver's workers can still be running (a driver that ended stopped them). Its
    # state reads "stopped (... when the driver was lost)", so the state's words cannot tell.
    if not status["driver_lost"] or not status.get("workers"):
        return
    remaining = status.get("updated_at", 0) + lease_s + 1.0 - clock()
    if remaining > 0:
        out.write(f"waiting {remaining:.0f} s for the workers of the lost driver (pid {status['driver_pid']}) to stop\n")
        out.flush()
        sleep(remaining)


def run_in_dir(config: RunConfig, recompose: Recompose, out: TextIO,
               metrics: MetricsServer | None, linted: LintResult | None = None,
               rehearsal: Mapping | None = None) -> int:
    """The run directory locked, its disk reserve held and its logbook open: the lineage."""
    run_dir = config.run_dir()
    try:
        with RunDirLock(run_dir), DiskReserve(run_dir) as reserve, Logbook.open(run_dir) as book:
            try:
                return run_lineage(config, recompose, book, out, metrics, linted, rehearsal)
            except DISK_WRITE_ERRORS as error:
                if not is_disk_full(error):
                    raise
                out.write("\n" + end_on_full_disk(book, run_dir, reserve, error) + "\n")
                return 1
    except DISK_WRITE_ERRORS as error:  # the lock or the logbook could not even be opened
        if not is_disk_full(error):
            raise
        raise DiskFullError(disk_refusal(run_dir, error)) from None


def run_lineage(config: RunConfig, recompose: Recompose, book: Logbook,
                out: TextIO, metrics: MetricsServer | None = None, linted: LintResult | None = None,
                rehearsal: Mapping | None = None) -> int:
    """With the run directory locked and its logbook open: the next sub-runs of its lineage.
    ``rehearsal``: how this run (a rehearsal) maps to the real plan; its first sub-run records it."""
    run_dir = config.run_dir()
    wait_for_lost_workers(run_dir, config.controller.worker_lease_s, out)
    chaos = build_chaos(config)
    chaos_overrides = chaos.prepare()  # faulty inputs (garbage data, a bad LR) for this lineage
    if chaos_overrides and rehearsal is not None:  # no conf file composes a rehearsal: set them on it
        config = with_settings(config, chaos_overrides)
    elif chaos_overrides:
        config = recompose(chaos_overrides)
    ids = SubrunIds(config.run.number, len(book.lineage()))
    mirror = s3_mirror(config) if config.checkpoint.s3.enabled else None
    initial = initial_state(config, book, ids, remote=mirror)
    if initial is None:
        if mirror is not None:  # copies an earlier launch could not finish (S3 was out at its end)
            upload_leftovers(mirror, book, config.checkpoint_dir(), config.checkpoint.s3.final_wait_s, out)
        out.write(f"run {config.run.name} already finished at step {config.training.train_iters}; "
                  f"`runmgr logbook show {run_dir}` shows it\n")
        return 0
    # A local Ray advertises room for the warm spares too (each holds a rank's resources).
    cluster = replace(config.cluster, num_workers=config.cluster.num_workers + config.controller.warm_spares)
    starting(config, initial.start_step, ray_start_words(cluster))
    connection = ray_cluster.connect(cluster, messages_to=run_dir / ray_cluster.RAY_MESSAGES_FILE,
                                     head_lost_after_s=config.controller.cluster_lost_timeout_s)
    try:
        with stop_on_signals() as stop:  # Ctrl-C or SIGTERM: a clean stop, recorded as such
            starting(config, initial.start_step, "skipping the health check (health.skip)" if config.health.skip
                     else "health-checking the nodes (devices, compute, collectives, mounts)")
            gate = preflight_health(config, out)  # no admitted node: one line, exit 2
            refuse_unplaceable(config, gate.admitted_node_ids)  # no node holds a bundle: one line, before placing
            linted = merged(linted or LintResult(()), lint_after_health(config, gate.report, out))
            # The sub-run's start records the health verdicts (excluded nodes, report path) and the
            # lint's warnings and ignored rules (the logbook writer turns them into events).
            initial = replace(initial, evidence={**initial.evidence, "health": gate.evidence(),
                                                 "lint": linted.evidence(),
                                                 **({"rehearsal": rehearsal.to_dict()} if rehearsal else {})})
            final = drive(config, book, ids, initial, out, admitted_node_ids=gate.admitted_node_ids, chaos=chaos,
                          metrics=metrics, mirror=mirror)
    except KeyboardInterrupt:
        if not stop.requested:
            raise
        return stopped(book, run_dir, stop, out)
    finally:
        if mirror is not None:
            mirror.close()
        ray_cluster.disconnect(connection)  # no process of a local Ray is left, even without its head
    out.write(f"logbook: runmgr logbook show {run_dir}\n")
    return 0 if isinstance(final, Finished) else 1


def starting(config: RunConfig, start_step: int, doing: str) -> None:
    """``runmgr status`` says what the driver is doing before its first sub-run runs."""
    write_starting(config.run_dir(), config.run.name, config.training.train_iters, start_step, doing)


def ray_start_words(cluster) -> str:
    if cluster.address:
        return f"joining the Ray cluster at {cluster.address}"
    return f"starting a local Ray of {cluster.local_nodes} node(s)"


def stopped(book: Logbook, run_dir: Path, stop: StopRequest, out: TextIO) -> int:
    """The workers are stopped (the controller's ``finally``): record the stop and say how to go on."""
    ended = record_stop(book, stop.reason)
    mark_stopped(run_dir, stop.reason)
    where = f"sub-run {ended[0]} at step {ended[1]}" if ended else "before the first sub-run started"
    out.write(f"\n{stop.reason}: {where}; run the same `runmgr launch` again to resume from the last checkpoint\n"
              f"logbook: runmgr logbook show {run_dir}\n")
    return stop.exit_code


def drive(config: RunConfig, book: Logbook, ids: SubrunIds, initial: Launching, out: TextIO,
          admitted_node_ids: list[str] | None = None, chaos: Chaos | None = None,
          metrics: MetricsServer | None = None, mirror: S3Mirror | None = None):
    """The lineage's parts built (runmgr/wiring.py) and its controller run to a terminal state."""
    import ray

    device_kind = resolve_device_kind(config.device, ray.cluster_resources())
    trainer_config = replace(trainer_keeps_everything(config.trainer_config()), device=device_kind)
    alive = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    admitted = admitted_for_run(config, admitted_node_ids, alive)
    seen = build_observers(config, book, initial, out, metrics, mirror, chaos)
    start_mirror(mirror, config, initial.start_step)
    devices = start_device_poll(config, chaos, admitted or alive, device_kind)
    runner = build_runner(config, trainer_config, device_kind, admitted, chaos, devices)
    judge = build_judge(config, runner, device_kind, admitted, mirror)
    controller = Controller(
        initial, trainer_config, make_group=runner.make_group, judge=judge, subrun_ids=ids,
        resume_at=resumer(config, mirror),
        poll_interval_s=config.controller.poll_interval_s, observers=seen.all, read_devices=devices.drain,
        read_uploads=seen.mirroring.read_uploads if seen.mirroring is not None else no_uploads,
        dump_stacks=runner.dump_stacks, nodes=kuberay_replacement(config, device_kind, admitted, out, devices.add_node)
        if config.kubernetes.replace_excluded_nodes else None,
        verdicts=lambda subrun: take_answer(config.run_dir(), subrun))
    try:
        final = controller.run()
        seen.settle(judge, final, controller.last_step, config, out)
        return final
    finally:
        runner.close()
        devices.stop()
        seen.close(metrics)
