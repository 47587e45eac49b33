"""The durable tier: where the driver mirrors each verified checkpoint
(``checkpoint.s3``), and the checkpoint section of a run that carries it.

The trainer never sees these settings (:meth:`RunConfig.trainer_config` hands
it the plain :class:`~trainer.config.CheckpointConfig`) and never needs boto3:
the driver uploads and downloads. Credentials are not settings: boto3 reads
them from the standard AWS sources (``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY``, ``~/.aws/credentials``, ``AWS_PROFILE``, an
instance or pod role), so a config file or a logbook never holds them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional
from urllib.parse import urlparse

from trainer.config import CheckpointConfig

MIN_PART_MIB = 5.0
"""S3's smallest multipart part (all but the last), which boto3's transfer enforces."""
BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
"""S3's bucket naming rules: 3-63 characters of lower-case letters, digits, '.' and '-'."""


@dataclass
class S3Config:
    """An S3-compatible bucket that holds a durable copy of every verified
    checkpoint (off while ``bucket`` is null)."""

    bucket: Optional[str] = None
    """Bucket that receives the copies; null: no S3 mirror. It must exist: a launch
    checks it (and the credentials) before training starts."""
    endpoint: Optional[str] = None
    """URL of the S3 API (``http://127.0.0.1:8333``, ``https://s3.example.com``); null:
    AWS's own endpoint for ``region``."""
    prefix: Optional[str] = None
    """Key prefix of this run's copies (``<prefix>/step_00000120/...``); null: the run's name."""
    region: Optional[str] = None
    """Region to sign requests for; null: the standard AWS sources' (``AWS_REGION``,
    ``~/.aws/config``), else us-east-1."""
    multipart_threshold_mib: float = 64.0
    """Files at least this large go up in parts (boto3's managed transfer)."""
    multipart_chunksize_mib: float = 64.0
    """Size of each part (at least 5: S3's minimum part size)."""
    max_concurrency: int = 4
    """Parts and files in flight at once."""
    max_attempts: int = 3
    """Attempts of each S3 request before it counts as failed (botocore's standard retries)."""
    connect_timeout_s: float = 5.0
    """Seconds to wait for a connection; an endpoint that does not answer fails an attempt after this."""
    read_timeout_s: float = 60.0
    """Seconds to wait for a reply on an open connection."""
    retry_backoff_s: float = 2.0
    """A failed upload is tried again after this long, doubling each time..."""
    max_backoff_s: float = 60.0
    """...up to this; it is never given up while the run lasts (an outage is an incident, not a failure)."""
    final_wait_s: float = 600.0
    """At the end of the run, how long the driver waits for uploads still pending before it
    exits (their local copies stay until a later launch uploads them)."""

    @property
    def enabled(self) -> bool:
        """True when checkpoints are mirrored."""
        return self.bucket is not None

    def key_prefix(self, run_name: str) -> str:
        """The prefix the copies live under, without a trailing '/'."""
        return (self.prefix if self.prefix is not None else run_name).strip("/")

    def problems(self) -> list[str]:
        """One line per invalid setting (empty when valid or off)."""
        if not self.enabled:
            return []
        out = []
        if not BUCKET_NAME.fullmatch(self.bucket or ""):
            out.append(f"checkpoint.s3.bucket must be an S3 bucket name (3-63 lower-case letters, digits, '.' "
                       f"and '-'), got {self.bucket!r}")
        if self.endpoint is not None:
            parsed = urlparse(self.endpoint)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                out.append(f"checkpoint.s3.endpoint must be an http:// or https:// URL (e.g. "
                           f"http://127.0.0.1:8333), got {self.endpoint!r}")
        if self.multipart_chunksize_mib < MIN_PART_MIB or self.multipart_threshold_mib <= 0:
            out.append(f"checkpoint.s3.multipart_chunksize_mib must be >= {MIN_PART_MIB:g} (S3's smallest part) "
                       f"and multipart_threshold_mib > 0, got {self.multipart_chunksize_mib} and "
                       f"{self.multipart_threshold_mib}")
        if self.max_concurrency < 1 or self.max_attempts < 1:
            out.append(f"checkpoint.s3.max_concurrency and max_attempts must be at least 1, got "
                       f"{self.max_concurrency} and {self.max_attempts}")
        timeouts = (self.connect_timeout_s, self.read_timeout_s, self.retry_backoff_s)
        if min(timeouts) <= 0 or self.max_backoff_s < self.retry_backoff_s or self.final_wait_s < 0:
            out.append("checkpoint.s3: connect_timeout_s, read_timeout_s and retry_backoff_s must be > 0, "
                       "max_backoff_s >= retry_backoff_s and final_wait_s >= 0")
        return out


@dataclass
class RunCheckpointConfig(CheckpointConfig):
    """The trainer's checkpoint settings plus the driver's durable tier."""

    s3: S3Config = field(default_factory=S3Config)
    """Mirror of every verified checkpoint on an S3-compatible bucket (driver only)."""

    def for_trainer(self, save: str) -> CheckpointConfig:
        """The trainer's view: its own fields, ``save`` resolved, nothing of S3."""
        own = {name: getattr(self, name) for name in CheckpointConfig.__dataclass_fields__}
        return CheckpointConfig(**{**own, "save": save})
