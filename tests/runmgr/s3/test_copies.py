"""One checkpoint's copy on a real S3 server (SeaweedFS): multipart, checked
against the manifest's checksums, its manifest last, downloaded back intact."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from botocore.exceptions import EndpointConnectionError

from runmgr.s3.client import S3_ERRORS
from runmgr.s3.copies import (
    CopyMismatch, LocalCopyGone, complete_steps, download_checkpoint, retire_copy, transfer_config, upload_checkpoint,
)
from tests.faults.checkpoint_damage import small_checkpoint
from tests.runmgr.s3.conftest import BIG_FILE, checkpoint_with_big_file
from trainer.manifest import MANIFEST_NAME, read_manifest, verify_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def keys(s3, step: int) -> dict[str, dict]:
    listing = s3.client.list_objects_v2(Bucket=s3.place.bucket, Prefix=f"run/step_{step:08d}/")
    return {item["Key"].rsplit("/", 1)[1]: item for item in listing.get("Contents", ())}


def test_a_checkpoint_goes_up_in_parts_and_every_object_matches_its_manifest(s3, tmp_path):
    path = checkpoint_with_big_file(tmp_path, 20)
    uploaded = upload_checkpoint(s3, path, transfer_config(s3))
    manifest = read_manifest(path)
    assert (uploaded.step, uploaded.files, uploaded.already) == (20, len(manifest["files"]), False)
    assert uploaded.bytes == sum(entry["size"] for entry in manifest["files"])
    assert set(keys(s3, 20)) == {entry["name"] for entry in manifest["files"]} | {MANIFEST_NAME}
    big = s3.client.head_object(Bucket=s3.place.bucket, Key=f"run/step_00000020/{BIG_FILE}", ChecksumMode="ENABLED")
    assert big["ETag"].strip('"').endswith("-3")  # three parts of a managed multipart upload
    for entry in manifest["files"]:
        body = s3.client.get_object(Bucket=s3.place.bucket, Key=f"run/step_00000020/{entry['name']}")["Body"].read()
        assert hashlib.sha256(body).hexdigest() == entry["sha256"]
    assert complete_steps(s3) == [20]


def test_a_single_part_object_carries_the_manifests_own_sha256(s3, tmp_path):
    path = small_checkpoint(tmp_path, 10)
    s3.config.multipart_threshold_mib = 64.0  # nothing goes up in parts
    uploaded = upload_checkpoint(s3, path, transfer_config(s3))
    entry = next(e for e in read_manifest(path)["files"] if e["name"] == ".metadata")
    head = s3.client.head_object(Bucket=s3.place.bucket, Key="run/step_00000010/.metadata", ChecksumMode="ENABLED")
    assert uploaded.checked_by == "sha256"
    assert head["ChecksumSHA256"] == base64.b64encode(bytes.fromhex(entry["sha256"])).decode()


def test_a_server_that_keeps_no_checksum_is_held_to_its_md5_etag(s3, tmp_path):
    def forget_checksums(parsed, **_):  # as a server without checksum support replies
        for key in [k for k in parsed if k.startswith("Checksum")]:
            del parsed[key]

    s3.client.meta.events.register("after-call.s3.HeadObject", forget_checksums)
    path = checkpoint_with_big_file(tmp_path, 10)
    assert upload_checkpoint(s3, path, transfer_config(s3)).checked_by == "etag"
    s3.client.put_object(Bucket=s3.place.bucket, Key=f"run/step_00000010/{BIG_FILE}",
                         Body=(path / BIG_FILE).read_bytes()[::-1])  # same size, other bytes
    assert upload_checkpoint(s3, path, transfer_config(s3)).already is False  # the ETag tells them apart


def test_an_upload_cut_short_leaves_no_manifest_so_the_copy_is_never_used(s3, tmp_path):
    path = checkpoint_with_big_file(tmp_path, 30)

    def cut(**_):
        raise EndpointConnectionError(endpoint_url=s3.endpoint)

    s3.client.meta.events.register("before-call.s3.CreateMultipartUpload", cut)
    with pytest.raises(S3_ERRORS):
        upload_checkpoint(s3, path, transfer_config(s3))
    assert MANIFEST_NAME not in keys(s3, 30) and complete_steps(s3) == []
    s3.client.meta.events.unregister("before-call.s3.CreateMultipartUpload", cut)
    assert upload_checkpoint(s3, path, transfer_config(s3)).already is False
    assert complete_steps(s3) == [30]


def test_an_identical_copy_is_not_sent_again_and_an_altered_one_is(s3, tmp_path):
    path = small_checkpoint(tmp_path, 10)
    upload_checkpoint(s3, path, transfer_config(s3))
    assert upload_checkpoint(s3, path, transfer_config(s3)).already is True
    shard = next(p for p in path.iterdir() if p.suffix == ".distcp")
    size = shard.stat().st_size
    s3.client.put_object(Bucket=s3.place.bucket, Key=f"run/step_00000010/{shard.name}", Body=b"\0" * size)
    again = upload_checkpoint(s3, path, transfer_config(s3))
    assert again.already is False
    body = s3.client.get_object(Bucket=s3.place.bucket, Key=f"run/step_00000010/{shard.name}")["Body"].read()
    assert body == shard.read_bytes()


def test_a_checkpoint_damaged_on_the_local_disk_is_not_mirrored(s3, tmp_path):
    path = small_checkpoint(tmp_path, 10)
    shard = next(p for p in path.iterdir() if p.suffix == ".distcp")
    shard.write_bytes(b"\1" * shard.stat().st_size)  # same size, other bytes: only the sha256 tells
    with pytest.raises(LocalCopyGone, match="no longer matches its manifest's sha256"):
        upload_checkpoint(s3, path, transfer_config(s3))
    assert keys(s3, 10) == {}


def test_a_download_is_the_checkpoint_bit_for_bit_and_a_tampered_copy_is_refused(s3, tmp_path):
    path = checkpoint_with_big_file(tmp_path / "here", 20)
    upload_checkpoint(s3, path, transfer_config(s3))
    fresh = tmp_path / "fresh-machine"
    copy = download_checkpoint(s3, 20, fresh, transfer_config(s3))
    assert verify_checkpoint(copy) == (True, "ok")
    assert {p.name: p.read_bytes() for p in copy.iterdir()} == {p.name: p.read_bytes() for p in path.iterdir()}
    s3.client.put_object(Bucket=s3.place.bucket, Key=f"run/step_00000020/{BIG_FILE}", Body=b"x" * 100)
    with pytest.raises(CopyMismatch, match=f"file {BIG_FILE} of the S3 copy is 100 bytes"):
        download_checkpoint(s3, 20, tmp_path / "elsewhere", transfer_config(s3))


def test_a_download_replaces_a_local_copy_that_failed_and_keeps_it_aside(s3, tmp_path):
    path = small_checkpoint(tmp_path, 10)
    upload_checkpoint(s3, path, transfer_config(s3))
    (path / ".metadata").write_bytes(b"damaged")
    copy = download_checkpoint(s3, 10, tmp_path, transfer_config(s3))
    assert copy == path and verify_checkpoint(copy) == (True, "ok")
    (aside,) = (tmp_path / "retired").iterdir()
    assert aside.name.startswith("step_00000010.failed-") and (aside / ".metadata").read_bytes() == b"damaged"


def test_a_retired_copy_is_incomplete_and_its_manifest_kept_beside_it(s3, tmp_path):
    for step in (10, 20):
        upload_checkpoint(s3, small_checkpoint(tmp_path, step), transfer_config(s3))
    retire_copy(s3, 20, "1.02")
    assert complete_steps(s3) == [10]
    assert "manifest.retired-by-1.02.json" in keys(s3, 20) and MANIFEST_NAME not in keys(s3, 20)


def test_a_copy_whose_manifest_names_a_path_outside_its_folder_writes_nothing_there(s3, tmp_path):
    path = small_checkpoint(tmp_path / "here", 10)
    upload_checkpoint(s3, path, transfer_config(s3))
    manifest = read_manifest(path)
    manifest["files"][0]["name"] = "../../escaped"
    s3.client.put_object(Bucket=s3.place.bucket, Key="run/step_00000010/manifest.json", Body=json.dumps(manifest))
    with pytest.raises(CopyMismatch, match="names '../../escaped', not a file of its folder"):
        download_checkpoint(s3, 10, tmp_path / "there", transfer_config(s3))
    assert not (tmp_path / "escaped").exists()
