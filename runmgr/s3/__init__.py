"""The durable tier: the driver's mirror of every verified checkpoint on an
S3-compatible bucket (``checkpoint.s3``), through boto3.

- :mod:`runmgr.s3.client`: a boto3 client from the config (credentials from
  the standard AWS sources only), errors as one line without secrets, and the
  launch's probe of the bucket;
- :mod:`runmgr.s3.copies`: one checkpoint's copy: uploaded (multipart,
  checksummed, its manifest last) and verified against the manifest's
  checksums, listed, retired, downloaded;
- :mod:`runmgr.s3.mirror`: the background uploader (a queue, retries with
  backoff, never giving up while the run lasts) and the remote source a
  resume falls back to.

Only the driver uses it; the trainer never imports boto3.
"""
