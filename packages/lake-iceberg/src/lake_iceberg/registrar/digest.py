"""Checking a shipped segment against the size and SHA-256 its shipper recorded.

The footer check alone passes an object whose data pages changed in transit
or that was replaced by other valid Parquet of the same size; registering it
would serve wrong rows from then on. The whole object is read once, hashed
as it streams (memory bounded by one block, whatever the segment's size).
"""

from __future__ import annotations

import hashlib
from typing import Any

from lake_iceberg.errors import SegmentCorrupted
from lake_iceberg.registrar.segments import Uploaded

__all__ = ["HASH_BLOCK", "verify_digest"]

#: Bytes read from the object per step of the hash.
HASH_BLOCK = 1024 * 1024


def verify_digest(client: Any, entry: Uploaded) -> None:
    """Raise :class:`SegmentCorrupted` unless the object is the recorded bytes (boto3 client).

    The error carries the ETag of the object read, so that an object refused
    once is not read again until it changes (:class:`~.service.Registrar`).
    """
    response = client.get_object(Bucket=entry.bucket, Key=entry.object_key)
    body, etag = response["Body"], response.get("ETag")
    sha = hashlib.sha256()
    size = 0
    try:
        while block := body.read(HASH_BLOCK):
            sha.update(block)
            size += len(block)
            if size > entry.size:
                break  # longer than recorded: no need to read the rest
    finally:
        body.close()
    if size != entry.size:
        raise SegmentCorrupted(
            f"segment {entry.object_key}: object is not the {entry.size} bytes the shipper recorded",
            etag=etag,
        )
    if sha.hexdigest() != entry.sha256.lower():
        raise SegmentCorrupted(
            f"segment {entry.object_key}: object does not match the SHA-256 the shipper recorded",
            etag=etag,
        )
