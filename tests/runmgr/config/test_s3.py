"""``checkpoint.s3``: typed, checked, the driver's only (the trainer never sees it)."""

from __future__ import annotations

import pytest

from runmgr.config.compose import load_run_config
from runmgr.errors import ConfigError
from trainer.config import CheckpointConfig

S3 = ["checkpoint.s3.bucket=runmgr-ckpt", "checkpoint.s3.endpoint=http://127.0.0.1:8333"]


def test_off_by_default_and_the_prefix_defaults_to_the_run_name():
    config = load_run_config("demo", ["run.name=r7"])
    assert not config.checkpoint.s3.enabled
    on = load_run_config("demo", ["run.name=r7", *S3])
    assert on.checkpoint.s3.enabled and on.checkpoint.s3.key_prefix("r7") == "r7"
    assert load_run_config("demo", [*S3, "checkpoint.s3.prefix=/team/x/"]).checkpoint.s3.key_prefix("r7") == "team/x"


def test_the_trainer_gets_its_own_checkpoint_section_without_s3():
    trainer = load_run_config("demo", S3).trainer_config()
    assert type(trainer.checkpoint) is CheckpointConfig and not hasattr(trainer.checkpoint, "s3")


@pytest.mark.parametrize("setting, message", [
    ("checkpoint.s3.bucket=My_Bucket", "checkpoint.s3.bucket must be an S3 bucket name"),
    ("checkpoint.s3.endpoint=127.0.0.1:8333", "checkpoint.s3.endpoint must be an http:// or https:// URL"),
    ("checkpoint.s3.multipart_chunksize_mib=1", "multipart_chunksize_mib must be >= 5"),
    ("checkpoint.s3.max_attempts=0", "max_concurrency and max_attempts must be at least 1"),
    ("checkpoint.s3.max_backoff_s=0.5", "max_backoff_s >= retry_backoff_s"),
    ("checkpoint.s3.access_key=AKIA", "unknown config key 'checkpoint.s3.access_key'"),
    ("watcher.storage.outage_after_s=0", "watcher.storage: outage_after_s must be > 0"),
])
def test_bad_settings_are_one_line(setting, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        load_run_config("demo", [*S3, setting])
