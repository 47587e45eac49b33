"""The parts of a sub-run lineage, built one by one for :func:`runmgr.lineage.drive`:
the observers (logbook first: a checkpoint is mirrored, and deleted, only once
recorded), the device poll, the runner of the trainer in use, the judge and what
it knows of the cluster, and KubeRay's replacements. Each builder is small and
takes only what it needs; ``drive`` wires them and runs the controller."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional, TextIO

from logbook import Logbook
from runmgr.chaos.build import Chaos
from runmgr.chaos.injector import Injection, ScheduleShift
from runmgr.config.compose import recorded_config
from runmgr.config.schema import RunConfig
from runmgr.controller.judge import ClusterSlots, Judge
from runmgr.controller.states import Launching, State
from runmgr.metrics.exporter import MetricsObserver
from runmgr.metrics.server import MetricsServer
from runmgr.notify.observer import NotifyObserver
from runmgr.observers.logbook_writer import LogbookObserver, record_injection
from runmgr.observers.mirror import MirrorObserver, settle_uploads, submit_local_checkpoints
from runmgr.observers.progress import ProgressObserver
from runmgr.observers.retention import RetentionObserver, rollback_reach_steps
from runmgr.observers.status_file import StatusFileObserver
from runmgr.observers.tensorboard import TensorBoardObserver
from runmgr.resume import ResumePoint, listed_checkpoints, resume_at
from runmgr.runners import Runner, builtin_runner, megatron_runner, ranks_under_agents
from runmgr.workers.devicepoll import DevicePollGroup, DevicePollSettings
from runmgr.workers.group import node_slots
from trainer.config import TrainerConfig

if TYPE_CHECKING:  # boto3 is imported only by a run that mirrors its checkpoints (lineage.py)
    from runmgr.s3.mirror import S3Mirror


@dataclass
class RunObservers:
    """Every observer of the lineage, and those ``drive`` settles or closes at its end."""

    logbook: LogbookObserver
    retention: RetentionObserver
    mirroring: Optional[MirrorObserver]
    exporter: Optional[MetricsObserver]
    injector: Optional[object]
    notify: Optional[NotifyObserver] = None
    tensorboard: Optional[TensorBoardObserver] = None
    all: list = field(default_factory=list)

    def settle(self, judge: Judge, final: State, last_step: int, config: RunConfig, out: TextIO) -> None:
        """At the end: the S3 copies still in flight, then what retention may delete once they verified."""
        if self.mirroring is None:
            return
        settle_uploads(self.mirroring, judge, final, last_step, config.checkpoint.s3.final_wait_s,
                       self.logbook.on_judgement, out)
        if self.retention.newest_recorded is not None and self.retention.keep_last > 0:
            self.retention.prune(self.retention.newest_recorded)

    def close(self, metrics: Optional[MetricsServer]) -> None:
        if self.injector is not None:
            self.injector.close()
        if self.notify is not None:  # before the logbook closes: it records each delivery
            self.notify.close()
        if self.tensorboard is not None:  # the events of a sub-run a person stopped reach the file
            self.tensorboard.close()
        if metrics is not None and self.exporter is not None:  # it reads the logbook, which closes after this
            metrics.registry.unregister(self.exporter)


def build_observers(config: RunConfig, book: Logbook, initial: Launching, out: TextIO,
                    metrics: Optional[MetricsServer], mirror: Optional[S3Mirror],
                    chaos: Optional[Chaos]) -> RunObservers:
    """The observers, in the order they see each transition."""
    logbook = LogbookObserver(book, recorded_config(config))
    mirroring = MirrorObserver(mirror, book) if mirror is not None else None
    retention = RetentionObserver(config.checkpoint_dir(), config.checkpoint.keep_last, rollback_reach_steps(config),
                                  durable=mirror)
    status = StatusFileObserver(config.run_dir(), config.run.name, config.training.train_iters, initial.start_step,
                                metrics_address=metrics.address if metrics is not None else None)
    exporter = None
    if metrics is not None:
        exporter = MetricsObserver(book, config.training.train_iters, mirrored=mirror is not None,
                                   save_interval=config.save_interval(), run=config.run.name)
        metrics.registry.register(exporter)
    injector = chaos.injector(lambda injection: announce_injection(book, injection, out)) \
        if chaos is not None and chaos.enabled else None
    notify = NotifyObserver(config, book) if config.notify.targets() else None
    board = config.metrics.tensorboard
    tensorboard = TensorBoardObserver(board.directory(config.run_dir())) if board.enabled else None
    everyone = [logbook, mirroring, retention, status, ProgressObserver(config.training.train_iters, out),
                exporter, tensorboard, injector, notify]
    return RunObservers(logbook, retention, mirroring, exporter, injector, notify, tensorboard,
                        [o for o in everyone if o is not None])


def announce_injection(book: Logbook, injection: Injection | ScheduleShift, out: TextIO) -> None:
    """Every injection goes into the logbook; a schedule moved by a fault from outside it is
    also told on the console, where the person who caused it is watching."""
    record_injection(book, injection)
    if isinstance(injection, ScheduleShift):
        out.write(injection.summary() + "\n")
        out.flush()


def s3_mirror(config: RunConfig) -> S3Mirror:
    """The mirror of the run's checkpoints to S3 (``checkpoint.s3``, enabled). boto3 is imported
    here, so that a driver whose run mirrors nothing does not pay its import (about 0.3
    CPU-seconds of every launch)."""
    from runmgr.s3.client import S3Client
    from runmgr.s3.mirror import S3Mirror

    return S3Mirror(S3Client(config.checkpoint.s3, config.run.name))


def start_mirror(mirror: Optional[S3Mirror], config: RunConfig, start_step: int) -> None:
    """The S3 mirror takes the local checkpoints it lacks, then starts."""
    if mirror is not None:
        submit_local_checkpoints(mirror, config.checkpoint_dir(), start_step)
        mirror.start()


def admitted_for_run(config: RunConfig, admitted_node_ids: Optional[list[str]], alive: list[str]) -> Optional[list[str]]:
    """The node ids the run places on (None: every alive node). With replacements, always a
    list (``alive`` when the health check excluded none): a replacement joins it once probed."""
    if config.kubernetes.replace_excluded_nodes and admitted_node_ids is None:
        return list(alive)
    return admitted_node_ids


def device_poll_settings(config: RunConfig, chaos: Optional[Chaos], device_kind: str) -> Optional[DevicePollSettings]:
    """How the run's nodes' devices are read mid-run; None when they are not. Ranks on CPU have no
    accelerator whose health is the run's business: no poll, unless chaos scripts the device tools."""
    path = chaos.device_path() if chaos is not None else None
    if device_kind == "cpu" and path is None:
        return None
    return DevicePollSettings(config.health.poll_interval_s, path)


def polled_by_node_actors(config: RunConfig, device_kind: str) -> bool:
    """Whether the run's ranks run under one actor per node that reads its node's devices (a
    Megatron job's node actors; the built-in trainer's node agents), so that no poller actor
    runs beside them: only the admitted nodes none of them holds get a poller."""
    return config.drives_megatron or ranks_under_agents(config, device_kind)


def start_device_poll(config: RunConfig, chaos: Optional[Chaos], nodes: list[str], device_kind: str) -> DevicePollGroup:
    """The mid-run device poll of the admitted ``nodes`` by one poller actor per node (and one
    collector beside the driver) when there is a poll (:func:`device_poll_settings`): on every
    node at once when no node actor reads its devices, otherwise only on the nodes no node actor
    of a sub-run holds, as :func:`build_runner`'s node actors tell it."""
    settings = device_poll_settings(config, chaos, device_kind)
    devices = DevicePollGroup(nodes, config.health.poll_interval_s, path=settings.path if settings else None)
    if settings is not None and not polled_by_node_actors(config, device_kind):
        devices.start()
    return devices


def node_actors_held(config: RunConfig, chaos: Optional[Chaos], device_kind: str,
                     devices: Optional[DevicePollGroup]) -> Optional[Callable[[frozenset[str]], None]]:
    """Whom the node actors (agents, Megatron's node actors) tell which nodes each placement
    holds: the device poll, so that it reads the admitted nodes no node actor holds (a node kept
    in reserve, or freed by an exclusion or a resize, is read mid-run as its node actor would
    read it); None when there is no poll."""
    if devices is None or device_poll_settings(config, chaos, device_kind) is None:
        return None
    return devices.cover if polled_by_node_actors(config, device_kind) else None


def build_runner(config: RunConfig, trainer_config: TrainerConfig, device_kind: str,
                 admitted: Optional[list[str]], chaos: Optional[Chaos],
                 devices: Optional[DevicePollGroup] = None) -> Runner:
    """What differs between the trainers: the worker group, its abilities and sizes (runmgr/runners.py).
    ``devices``: the lineage's device poll, told where the node actors are (:func:`node_actors_held`)."""
    device_poll = device_poll_settings(config, chaos, device_kind)
    on_held = node_actors_held(config, chaos, device_kind, devices)
    if config.drives_megatron:
        return megatron_runner(config, device_kind, admitted, device_poll=device_poll, on_held=on_held)
    return builtin_runner(config, trainer_config, device_kind, admitted,
                          wrap_reporter=chaos.step_gate if chaos is not None else lambda: None,
                          device_poll=device_poll, on_held=on_held)


def build_judge(config: RunConfig, runner: Runner, device_kind: str, admitted: Optional[list[str]],
                mirror: Optional[S3Mirror]) -> Judge:
    """The judge, with the checkpoints it may name (S3's known copies too: decisions never wait on
    S3's answer) and what the cluster holds when a decision is due."""
    known = mirror.known if mirror is not None else None
    replacement_wait = config.kubernetes.replacement_timeout_s if config.kubernetes.replace_excluded_nodes else None
    slots = ClusterSlots(lambda: node_slots(config.cluster, device_kind, admitted), runner.data_parallel_sizes,
                         runner.ranks_per_replica, replacement_wait)
    return Judge(config.watcher, config.policy,
                 lambda max_step: listed_checkpoints(config.checkpoint_dir(), max_step, remote=known), slots,
                 abilities=runner.abilities)


def resumer(config: RunConfig, mirror: Optional[S3Mirror]) -> Callable[[Optional[int], str], ResumePoint]:
    """How the controller finds the checkpoint a restart starts from (S3's complete copies too)."""
    known = mirror.known if mirror is not None else None
    return lambda step, why: resume_at(config.checkpoint_dir(), step, why, remote=known)


def kuberay_replacement(config: RunConfig, device_kind: str, admitted: list[str], out: TextIO,
                        watch_devices: Callable[[str], None]):
    """KubeRay replaces the pods of the nodes decisions exclude (kubernetes.replace_excluded_nodes);
    ``watch_devices(node_id)``: the device poll takes in a replacement once it is admitted."""
    from runmgr.kuberay import KubeRayReplacement, apis
    from runmgr.workers.joining import JoiningNodes

    def say(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    joining = JoiningNodes(config, device_kind, admitted, say, on_admitted=watch_devices)
    core, custom = apis(config.kubernetes.api_host)
    return KubeRayReplacement(core, custom, config.kubernetes.resolved_namespace(),
                              config.kubernetes.resolved_ray_cluster(), joining.pod_of, joining.room,
                              check_id=f"run {config.run.name}")
