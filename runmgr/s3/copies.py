"""One checkpoint's copy on S3: upload, verify, list, retire, download.

A copy is ``<prefix>/step_00000120/<file>`` for every file the checkpoint's
manifest lists, plus ``manifest.json``, uploaded LAST: a copy without its
manifest is incomplete and never used, exactly as on the local disk.

Checksums, end to end:

- before an upload each local file is read once, its sha256 compared with
  the manifest's (a file damaged on the local disk is never mirrored) while
  the digests of its parts are taken;
- each file goes up through boto3's managed transfer (multipart above
  ``multipart_threshold_mib``) with ``ChecksumAlgorithm=SHA256``: the server
  checks every part against the checksum sent with it;
- afterwards each object's size and the checksum the server stored are
  compared with what the manifest implies: the file's sha256 itself for a
  single-part object, the composite (sha256 of the parts' sha256s, ``-N``)
  for a multipart one; a server that keeps no checksum is held to its ETag
  (MD5, or the multipart MD5 of the parts);
- a download checks every file against the manifest's size and sha256
  before the copy takes a local checkpoint's place.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError
from s3transfer.utils import ChunksizeAdjuster

from runmgr.resume import checkpoint_dir_name
from runmgr.s3.client import S3Client, error_code
from trainer.manifest import MANIFEST_NAME, RETIRED_DIR, checkpoint_dir, step_of, verify_checkpoint

MIB = 1024 * 1024
CHECKSUM_ALGORITHM = "SHA256"
"""The manifest's own algorithm, so that a single-part object's checksum is the manifest's."""
PARTIAL_SUFFIX = ".s3-partial"
MISSING = {"NoSuchKey", "404", "NotFound"}
"""Error codes of an object that is not there (HEAD replies carry only the status)."""


class LocalCopyGone(Exception):
    """The local checkpoint is no longer there to upload (retired or deleted meanwhile), or damaged."""


class NoCopy(LookupError):
    """No complete copy of that step: its manifest is not there."""


class CopyMismatch(Exception):
    """An object on S3 differs from what the manifest says (size or checksum); the upload is tried again."""


@dataclass(frozen=True)
class Uploaded:
    """A checkpoint whose S3 copy verified."""

    step: int
    bytes: int
    files: int
    committed_at: Optional[float]
    """When the trainer wrote the manifest (the manifest's ``time``)."""
    consumed_samples: Optional[int]
    """Stream position after the step, as the manifest records it."""
    checked_by: str
    """``sha256`` (the server's stored checksum) or ``etag`` (its MD5 ETag)."""
    already: bool = False
    """True when an identical copy was there already (nothing was sent)."""


@dataclass(frozen=True)
class FileDigests:
    """What the server should report for one file, whichever way it went up."""

    size: int
    sha256: bytes
    parts_sha256: tuple[bytes, ...]
    md5: bytes
    parts_md5: tuple[bytes, ...]
    multipart: bool

    def expected_checksum(self) -> str:
        """The ``ChecksumSHA256`` S3 stores: the file's, or the composite of its parts'."""
        if not self.multipart:
            return base64.b64encode(self.sha256).decode()
        composite = hashlib.sha256(b"".join(self.parts_sha256)).digest()
        return f"{base64.b64encode(composite).decode()}-{len(self.parts_sha256)}"

    def expected_etag(self) -> str:
        if not self.multipart:
            return self.md5.hex()
        return f"{hashlib.md5(b''.join(self.parts_md5)).hexdigest()}-{len(self.parts_md5)}"


def transfer_config(s3: S3Client) -> TransferConfig:
    """boto3's managed transfer as ``checkpoint.s3`` sizes it."""
    cfg = s3.config
    return TransferConfig(multipart_threshold=int(cfg.multipart_threshold_mib * MIB),
                          multipart_chunksize=int(cfg.multipart_chunksize_mib * MIB),
                          max_concurrency=cfg.max_concurrency, use_threads=True)


def digests(path: Path, transfer: TransferConfig) -> FileDigests:
    """One read of ``path``: its sha256 and md5, whole and per part as the transfer splits it."""
    size = path.stat().st_size
    multipart = size >= transfer.multipart_threshold
    part = ChunksizeAdjuster().adjust_chunksize(transfer.multipart_chunksize, size) if multipart else max(size, 1)
    whole_sha, whole_md5 = hashlib.sha256(), hashlib.md5()
    parts_sha, parts_md5 = [], []
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(part), b""):
            whole_sha.update(chunk)
            whole_md5.update(chunk)
            parts_sha.append(hashlib.sha256(chunk).digest())
            parts_md5.append(hashlib.md5(chunk).digest())
    return FileDigests(size, whole_sha.digest(), tuple(parts_sha), whole_md5.digest(), tuple(parts_md5), multipart)


def upload_checkpoint(s3: S3Client, path: Path, transfer: TransferConfig) -> Uploaded:
    """Mirror the checkpoint at ``path``; its manifest goes last. Raises
    :class:`LocalCopyGone`, :class:`CopyMismatch` or an S3 error."""
    ok, reason = verify_checkpoint(path, check_hashes=False)
    if not ok:
        raise LocalCopyGone(reason)
    manifest_bytes = (path / MANIFEST_NAME).read_bytes()
    manifest = json.loads(manifest_bytes)
    step, entries = int(manifest["step"]), manifest["files"]
    local = {entry["name"]: _local_digests(path, entry, transfer) for entry in entries}
    manifest_key = s3.place.key(f"{path.name}/{MANIFEST_NAME}")
    remote_manifest = _get_bytes(s3, manifest_key)
    if remote_manifest == manifest_bytes:
        checked_by = _all_match(s3, path.name, entries, local)
        if checked_by is not None:
            return _uploaded(manifest, entries, checked_by, already=True)
    if remote_manifest is not None:  # another copy of this step (an abandoned branch): incomplete from now on
        s3.client.delete_object(Bucket=s3.place.bucket, Key=manifest_key)
    checked = set()
    for entry in entries:
        key = s3.place.key(f"{path.name}/{entry['name']}")
        s3.client.upload_file(str(path / entry["name"]), s3.place.bucket, key, Config=transfer,
                              ExtraArgs={"ChecksumAlgorithm": CHECKSUM_ALGORITHM,
                                         "Metadata": {"sha256": entry["sha256"]}})
        checked.add(_check_object(s3, key, entry, local[entry["name"]]))
    s3.client.put_object(Bucket=s3.place.bucket, Key=manifest_key, Body=manifest_bytes,
                         ChecksumSHA256=base64.b64encode(hashlib.sha256(manifest_bytes).digest()).decode())
    return _uploaded(manifest, entries, "etag" if "etag" in checked else "sha256")


def _uploaded(manifest: dict, entries: list[dict], checked_by: str, already: bool = False) -> Uploaded:
    return Uploaded(int(manifest["step"]), sum(int(e["size"]) for e in entries), len(entries), manifest.get("time"),
                    manifest.get("consumed_samples"), checked_by, already)


def _local_digests(path: Path, entry: dict, transfer: TransferConfig) -> FileDigests:
    try:
        found = digests(path / entry["name"], transfer)
    except FileNotFoundError:
        raise LocalCopyGone(f"{path.name}: file {entry['name']} is gone") from None
    if found.sha256.hex() != entry["sha256"]:
        raise LocalCopyGone(f"{path.name}: file {entry['name']} no longer matches its manifest's sha256 "
                            f"(damaged on the local disk): not mirrored")
    return found


def _all_match(s3: S3Client, name: str, entries: list[dict], local: dict[str, FileDigests]) -> Optional[str]:
    """How the objects of an existing copy were checked, or None when one differs or is missing."""
    checked = set()
    for entry in entries:
        try:
            checked.add(_check_object(s3, s3.place.key(f"{name}/{entry['name']}"), entry, local[entry["name"]]))
        except CopyMismatch:
            return None
        except ClientError as error:
            if error_code(error) in MISSING:
                return None
            raise
    return "etag" if "etag" in checked else "sha256"


def _check_object(s3: S3Client, key: str, entry: dict, local: FileDigests) -> str:
    """Compare one object with the manifest's entry; how (``sha256`` or ``etag``)."""
    head = s3.client.head_object(Bucket=s3.place.bucket, Key=key, ChecksumMode="ENABLED")
    if int(head["ContentLength"]) != int(entry["size"]):
        raise CopyMismatch(f"{key} is {head['ContentLength']} bytes on S3, its manifest says {entry['size']}")
    stored = head.get("ChecksumSHA256")
    if stored:
        if stored != local.expected_checksum():
            raise CopyMismatch(f"{key} has sha256 checksum {stored} on S3, expected {local.expected_checksum()}")
        return "sha256"
    etag = str(head.get("ETag", "")).strip('"')
    if etag != local.expected_etag():
        raise CopyMismatch(f"{key} has ETag {etag} on S3, expected {local.expected_etag()} (MD5 of what the "
                           f"manifest describes)")
    return "etag"


def _get_bytes(s3: S3Client, key: str) -> Optional[bytes]:
    """The object's bytes, or None when there is none."""
    try:
        return s3.client.get_object(Bucket=s3.place.bucket, Key=key)["Body"].read()
    except ClientError as error:
        if error_code(error) in MISSING:
            return None
        raise


def _keys(s3: S3Client, prefix: str) -> Iterator[str]:
    paginator = s3.client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=s3.place.bucket, Prefix=prefix):
        for item in page.get("Contents", ()):
            yield item["Key"]


def complete_steps(s3: S3Client) -> list[int]:
    """Steps whose copy has its manifest, oldest first."""
    root = s3.place.key("")
    steps = []
    for key in _keys(s3, root):
        parts = key[len(root):].split("/")
        if len(parts) == 2 and parts[1] == MANIFEST_NAME and step_of(parts[0]) is not None:
            steps.append(step_of(parts[0]))
    return sorted(steps)  # type: ignore[arg-type]


def read_remote_manifest(s3: S3Client, step: int) -> dict:
    """The manifest of the copy of ``step`` (raises :class:`NoCopy` when there is none)."""
    data = _get_bytes(s3, s3.place.key(f"{checkpoint_dir_name(step)}/{MANIFEST_NAME}"))
    if data is None:
        raise NoCopy(step)
    return json.loads(data)


def retire_copy(s3: S3Client, step: int, tag: str) -> None:
    """Make the copy of ``step`` incomplete (it belongs to an abandoned branch): its
    manifest moves to ``manifest.retired-by-<tag>.json`` beside the data, which a
    person can rename back, as the trainer moves a local one to ``retired/``."""
    name = checkpoint_dir_name(step)
    source = s3.place.key(f"{name}/{MANIFEST_NAME}")
    s3.client.copy_object(Bucket=s3.place.bucket, Key=s3.place.key(f"{name}/manifest.retired-by-{tag}.json"),
                          CopySource={"Bucket": s3.place.bucket, "Key": source})
    s3.client.delete_object(Bucket=s3.place.bucket, Key=source)


def download_checkpoint(s3: S3Client, step: int, save_dir: Path, transfer: TransferConfig) -> Path:
    """The copy of ``step`` as ``save_dir/step_...``, every file checked against the copy's
    manifest, the manifest written last; a local copy already there (one that failed
    verification) is moved to ``retired/``. Raises :class:`NoCopy`, :class:`CopyMismatch`
    or an S3 error."""
    manifest_bytes = _get_bytes(s3, s3.place.key(f"{checkpoint_dir_name(step)}/{MANIFEST_NAME}"))
    if manifest_bytes is None:
        raise NoCopy(step)
    entries = _file_list(manifest_bytes)
    target = checkpoint_dir(save_dir, step)
    partial = target.with_name(f".{target.name}{PARTIAL_SUFFIX}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for entry in entries:
        local = partial / entry["name"]
        s3.client.download_file(s3.place.bucket, s3.place.key(f"{target.name}/{entry['name']}"), str(local),
                                Config=transfer)
        found = digests(local, transfer)
        if found.size != int(entry["size"]) or found.sha256.hex() != entry["sha256"]:
            raise CopyMismatch(f"file {entry['name']} of the S3 copy is {found.size} bytes with sha256 "
                               f"{found.sha256.hex()[:12]}..., its manifest says {entry['size']} bytes, "
                               f"{entry['sha256'][:12]}...")
    _write_last(partial / MANIFEST_NAME, manifest_bytes)
    if target.exists():
        aside = save_dir / RETIRED_DIR / f"{target.name}.failed-{int(time.time())}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        target.rename(aside)
    partial.rename(target)
    return target


def _file_list(manifest_bytes: bytes) -> list[dict]:
    """The files a copy's manifest lists, each a plain name in its folder with a size and a sha256."""
    try:
        files = json.loads(manifest_bytes)["files"]
        entries = [{"name": e["name"], "size": int(e["size"]), "sha256": str(e["sha256"])} for e in files]
    except (KeyError, TypeError, ValueError):
        raise CopyMismatch("the S3 copy's manifest has no valid file list") from None
    strays = [e["name"] for e in entries if not _plain_name(e["name"])]
    if strays:  # a manifest is data: it never writes outside the checkpoint's folder
        raise CopyMismatch(f"the S3 copy's manifest names {strays[0]!r}, not a file of its folder")
    return entries


def _plain_name(name: object) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and Path(name).name == name and "\\" not in name


def _write_last(path: Path, data: bytes) -> None:
    with path.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
