"""The metrics the driver serves: names, types, labels and meaning, in one
place. The exporter registers exactly these, the Grafana dashboard builder
queries them by these names, and docs/metrics.md lists them (a test checks
all three agree), so a renamed metric cannot leave a panel without data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MetricType = Literal["gauge", "counter", "stateset"]
RUN_LABEL = "run"
"""A label on every sample a run's driver serves: its ``run.name``, so that two runs scraped into one
Prometheus never collide (beside Prometheus' own ``job`` and ``instance`` target labels)."""


@dataclass(frozen=True)
class MetricSpec:
    """One metric as Prometheus sees it."""

    name: str
    """The name in Prometheus (a counter's ``_total`` included)."""
    type: MetricType
    labels: tuple[str, ...]
    help: str
    """What it means: the text of ``# HELP`` and of docs/metrics.md."""
    source: Literal["reports", "logbook", "transitions"]
    """Where its value comes from: the trainer's step reports as they arrive,
    the logbook (read at each scrape), or the controller's transitions."""


def _spec(name: str, type: MetricType, help: str, source, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, type, labels, help, source)


STEP = _spec("runmgr_step", "gauge", "Last optimizer step reported (after a restart: the last one before it, "
             "until the new sub-run reports).", "reports")
LOSS = _spec("runmgr_loss", "gauge", "Language-model loss of the last reported step.", "reports")
GRAD_NORM = _spec("runmgr_grad_norm", "gauge", "Global gradient norm before clipping, last reported step.",
                  "reports")
LEARNING_RATE = _spec("runmgr_learning_rate", "gauge", "Learning rate of the last reported step.", "reports")
LOSS_SCALE = _spec("runmgr_loss_scale", "gauge", "fp16 loss scale in force at the last reported step (1 without fp16).",
                   "reports")
TOKENS_PER_SECOND = _spec("runmgr_tokens_per_second", "gauge",
                          "Tokens per second of the last reported step (global tokens / rank 0's step time).",
                          "reports")
STEP_TIME = _spec("runmgr_step_time_seconds", "gauge", "Wall seconds of the last reported step on rank 0.",
                  "reports")
LAST_STEP_AT = _spec("runmgr_last_step_timestamp_seconds", "gauge",
                     "Unix time at which the driver received the last step report (the stall alert's clock).",
                     "reports")
STEP_TIME_MEDIAN = _spec("runmgr_step_time_median_seconds", "gauge",
                         "Median wall seconds of rank 0's last 50 reported steps: the learned step time that the "
                         "stall alert scales.", "reports")
TRAIN_ITERS = _spec("runmgr_train_iters", "gauge", "Steps the run trains in all (training.train_iters).",
                    "transitions")
CHECKPOINT_INTERVAL = _spec("runmgr_checkpoint_interval_steps", "gauge",
                            "Steps between two checkpoints (checkpoint.save_interval, or the Megatron job's "
                            "--save-interval); absent when the run saves none on a schedule.", "transitions")
SUBRUN = _spec("runmgr_subrun", "gauge",
               "The current sub-run: its id as the label (1.03), its index in the lineage as the value (3).",
               "transitions", ("subrun",))
STATE = _spec("runmgr_state", "stateset",
              "The controller's state: 1 for the one it is in (launching, running, restarting, finished, failed).",
              "transitions", ("runmgr_state",))
EXCLUDED_NODES = _spec("runmgr_excluded_nodes", "gauge",
                       "Nodes the current sub-run's plan avoids (excluded by the health gate's history or a decision).",
                       "transitions")
HEALTH_NODES = _spec("runmgr_health_nodes", "gauge",
                     "Nodes by the launch health gate's verdict: admit, warn, exclude, or unchecked (health.skip=true).",
                     "transitions", ("verdict",))
ETTR = _spec("runmgr_ettr_ratio", "gauge",
             "Effective training time ratio: seconds of kept steps / wall seconds of the lineage (logbook/accounting.py).",
             "logbook")
LOST_STEPS = _spec("runmgr_lost_steps_total", "counter",
                   "Steps trained and then discarded by restarts and rollbacks, over the lineage.", "logbook")
LOST_SECONDS = _spec("runmgr_lost_seconds", "gauge",
                     "Wall seconds of the lineage not spent on kept steps (wall time - kept time: ETTR's complement).",
                     "logbook")
INCIDENTS = _spec("runmgr_incidents_total", "counter", "Incidents recorded in the logbook, by kind.", "logbook",
                  ("kind",))
DECISIONS = _spec("runmgr_decisions_total", "counter", "Decisions recorded in the logbook, by action.", "logbook",
                  ("action",))
CHECKPOINT_STEP = _spec("runmgr_checkpoint_step", "gauge", "Step of the checkpoint the logbook recorded last.",
                        "logbook")
CHECKPOINT_AGE = _spec("runmgr_checkpoint_age_seconds", "gauge",
                       "Seconds since the logbook recorded the last verified checkpoint (absent before the first).",
                       "logbook")
UPLOAD_LAG = _spec("runmgr_checkpoint_upload_lag_seconds", "gauge",
                   "Seconds the oldest recorded checkpoint not yet mirrored to S3 has waited (0: all mirrored); "
                   "NaN when the run has no S3 mirror.", "logbook")

ALL: tuple[MetricSpec, ...] = (
    STEP, LOSS, GRAD_NORM, LEARNING_RATE, LOSS_SCALE, TOKENS_PER_SECOND, STEP_TIME, LAST_STEP_AT, STEP_TIME_MEDIAN,
    TRAIN_ITERS, CHECKPOINT_INTERVAL, SUBRUN, STATE,
    EXCLUDED_NODES, HEALTH_NODES, ETTR, LOST_STEPS, LOST_SECONDS, INCIDENTS, DECISIONS, CHECKPOINT_STEP,
    CHECKPOINT_AGE, UPLOAD_LAG,
)
"""Every metric the exporter serves, in the order docs/metrics.md lists them."""

UPLOADED_EVENT = "checkpoint_uploaded"
"""The logbook event the S3 mirror records when a checkpoint's upload is verified
(data: step, seconds, bytes)..."""
FOUND_ON_S3_EVENT = "checkpoint_on_s3"
"""...or, at a launch, when it finds a checkpoint's copy already complete there."""
MIRRORED_EVENTS = (UPLOADED_EVENT, FOUND_ON_S3_EVENT)
"""The events that say a checkpoint has its copy: the upload lag is read from these."""
