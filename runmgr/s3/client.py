"""A boto3 S3 client for ``checkpoint.s3``, its errors as one line, and the
probe a launch runs before training starts.

Credentials come from boto3's standard chain only (environment,
``~/.aws/credentials``, ``AWS_PROFILE``, an instance or pod role); no setting
holds them, and every message that leaves this package goes through
:meth:`S3Client.redact`, which blanks the access key id and the secret key
wherever they appear.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import boto3
import botocore.config
from boto3.exceptions import Boto3Error
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

from runmgr.config.s3 import S3Config
from runmgr.errors import UserError

S3_ERRORS = (BotoCoreError, ClientError, Boto3Error)
"""What a failed S3 request raises: a connection or timeout (BotoCoreError), a refusal
by the server (ClientError), a managed transfer that gave up (Boto3Error)."""
CREDENTIALS_REFUSED = {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "Forbidden",
                       "InvalidToken", "ExpiredToken"}
NO_BUCKET = {"404", "NoSuchBucket", "NotFound"}
PROBE_NAME = ".runmgr-probe"
"""Object a launch writes and deletes under the prefix to prove it may write there."""


class S3LaunchError(UserError):
    """The bucket cannot take the run's copies: wrong credentials, no such bucket, no answer."""


@dataclass(frozen=True)
class S3Place:
    """Where one run's copies live: ``s3://bucket/prefix/step_00000120/<file>``."""

    bucket: str
    prefix: str

    def key(self, name: str) -> str:
        """The key of ``name`` (``step_00000120/manifest.json``) under the prefix."""
        return f"{self.prefix}/{name}" if self.prefix else name

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


class S3Client:
    """A boto3 client configured from ``checkpoint.s3``, shared by the mirror's threads
    (boto3 clients are thread-safe) and the resume's downloads."""

    def __init__(self, config: S3Config, run_name: str,
                 session_factory: Callable[..., boto3.session.Session] = boto3.session.Session) -> None:
        self.config = config
        self.place = S3Place(config.bucket or "", config.key_prefix(run_name))
        self.session = session_factory(region_name=config.region)
        retries = {"max_attempts": config.max_attempts, "mode": "standard"}
        client_config = botocore.config.Config(
            retries=retries, connect_timeout=config.connect_timeout_s, read_timeout=config.read_timeout_s,
            # Path-style addressing: S3-compatible servers (SeaweedFS, MinIO, Ceph) rarely have per-bucket DNS.
            s3={"addressing_style": "path"})
        self.client = self.session.client("s3", endpoint_url=config.endpoint, config=client_config)

    @property
    def endpoint(self) -> str:
        return self.client.meta.endpoint_url

    def redact(self, text: str) -> str:
        """``text`` with the credentials in force blanked out (they never reach a log or a message)."""
        credentials = self.session.get_credentials()
        if credentials is None:
            return text
        frozen = credentials.get_frozen_credentials()
        for secret in (frozen.secret_key, frozen.access_key, frozen.token):
            if secret:
                text = text.replace(secret, "***")
        return text

    def describe(self, error: BaseException) -> str:
        """One line saying what went wrong, without credentials."""
        if isinstance(error, ClientError):
            info = error.response.get("Error", {})
            code = str(info.get("Code") or error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?"))
            text = f"{code}: {info.get('Message') or 'refused'} ({error.operation_name})"
        else:
            text = str(error) or type(error).__name__
        return self.redact(" ".join(text.split()))


def error_code(error: ClientError) -> str:
    """The S3 error code, or the HTTP status when the reply had no body (HEAD requests)."""
    return str(error.response.get("Error", {}).get("Code")
               or error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))


def probe(s3: S3Client) -> None:
    """Before training starts: the bucket exists, the credentials are accepted and
    may write under the prefix (an object written and deleted). Raises
    :class:`S3LaunchError` with one line otherwise. An endpoint that does not answer
    is refused too: a launch decides where the run resumes, and S3 may hold a newer
    checkpoint than the local disk (a fresh machine, a deleted checkpoint folder)."""
    where = f"bucket {s3.place.bucket!r} at {s3.endpoint}"
    if s3.session.get_credentials() is None:
        raise S3LaunchError(
            f"checkpoint.s3: no AWS credentials found for {where}: set AWS_ACCESS_KEY_ID and "
            f"AWS_SECRET_ACCESS_KEY (or ~/.aws/credentials, AWS_PROFILE); credentials never go in the config")
    try:
        s3.client.head_bucket(Bucket=s3.place.bucket)
        key = s3.place.key(PROBE_NAME)
        s3.client.put_object(Bucket=s3.place.bucket, Key=key, Body=b"runmgr launch probe\n")
        s3.client.delete_object(Bucket=s3.place.bucket, Key=key)
    except NoCredentialsError:
        raise S3LaunchError(f"checkpoint.s3: no AWS credentials found for {where}: set AWS_ACCESS_KEY_ID and "
                            f"AWS_SECRET_ACCESS_KEY (or ~/.aws/credentials, AWS_PROFILE)") from None
    except ClientError as error:
        raise S3LaunchError(_refusal(s3, error, where)) from None
    except (EndpointConnectionError, BotoCoreError) as error:
        raise S3LaunchError(
            f"checkpoint.s3.endpoint {s3.endpoint} does not answer ({s3.describe(error)}): check the URL, or "
            f"launch again once S3 is up (a launch must see S3 to know where the run resumes)") from None


def _refusal(s3: S3Client, error: ClientError, where: str) -> str:
    code = error_code(error)
    if code in NO_BUCKET:
        return (f"checkpoint.s3.bucket {s3.place.bucket!r} does not exist at {s3.endpoint}: create it, or set "
                f"checkpoint.s3.bucket to an existing bucket")
    if code in CREDENTIALS_REFUSED:
        return (f"checkpoint.s3: {where} refused the credentials ({code}): set AWS_ACCESS_KEY_ID and "
                f"AWS_SECRET_ACCESS_KEY (or ~/.aws/credentials, AWS_PROFILE) to a key that may read and write "
                f"s3://{s3.place.bucket}/{s3.place.prefix}")
    return f"checkpoint.s3: {where} refused the launch's probe: {s3.describe(error)}"
