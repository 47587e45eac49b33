"""The launch's probe of ``checkpoint.s3``, against a real server that accepts
one identity: wrong credentials, an unknown bucket, no answer, no credentials
are each one line, and no secret is ever in it."""

from __future__ import annotations

import pytest

from runmgr.s3.client import PROBE_NAME, S3Client, S3LaunchError, probe
from tests.runmgr.s3.conftest import s3_config
from tests.seaweed import SECRET_KEY, SeaweedS3


def test_a_bucket_that_takes_writes_passes_and_keeps_no_trace(s3):
    probe(s3)
    listing = s3.client.list_objects_v2(Bucket=s3.place.bucket)
    assert [item["Key"] for item in listing.get("Contents", ())] == []
    assert PROBE_NAME.startswith(".")


def test_wrong_credentials_are_refused_in_one_line_without_the_secret(s3, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-at-all-9876")
    wrong = S3Client(s3.config, "run")
    with pytest.raises(S3LaunchError) as refused:
        probe(wrong)
    message = str(refused.value)
    assert "refused the credentials" in message and "AWS_SECRET_ACCESS_KEY" in message
    assert "\n" not in message and "not-the-secret-at-all-9876" not in message and SECRET_KEY not in message


def test_an_unknown_bucket_is_named(s3_server, aws_env):
    with pytest.raises(S3LaunchError, match="checkpoint.s3.bucket 'no-such-bucket' does not exist at http"):
        probe(S3Client(s3_config(s3_server, "no-such-bucket"), "run"))


def test_an_endpoint_that_does_not_answer_is_refused_at_launch(aws_env, tmp_path):
    silent = SeaweedS3(tmp_path)  # ports chosen, never started
    with pytest.raises(S3LaunchError, match=f"checkpoint.s3.endpoint {silent.endpoint}/? does not answer"):
        probe(S3Client(s3_config(silent, "ckpt"), "run"))


def test_no_credentials_at_all_say_where_they_come_from(s3_server, aws_env, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(S3LaunchError, match="no AWS credentials found .* set AWS_ACCESS_KEY_ID"):
        probe(S3Client(s3_config(s3_server, "ckpt"), "run"))
