"""Reading a segment's Parquet footer with two ranged reads, from the recorded object.

The first read takes the 8-byte tail (footer length and magic), the second
the footer itself. A footer over 64 MiB is refused before it is read, and
the object's size must be the one the segment catalog recorded.
"""

from __future__ import annotations

import struct
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from lake_iceberg.errors import SegmentCatalogError
from lake_iceberg.registrar.segments import Uploaded

__all__ = ["MAX_FOOTER_BYTES", "read_footer"]

MAX_FOOTER_BYTES = 64 * 1024 * 1024
_MAGIC = b"PAR1"


def _range(client: Any, entry: Uploaded, start: int, end: int) -> bytes:
    """Bytes ``start..=end`` of the segment, checked against its recorded size."""
    response = client.get_object(
        Bucket=entry.bucket, Key=entry.object_key, Range=f"bytes={start}-{end}"
    )
    body = response["Body"].read()
    total = str(response.get("ContentRange", "")).rpartition("/")[2]
    if len(body) != end - start + 1 or (total and total != str(entry.size)):
        raise SegmentCatalogError(
            f"segment {entry.object_key}: object is not the {entry.size} bytes the catalog recorded"
        )
    return bytes(body)


def read_footer(client: Any, entry: Uploaded) -> pq.FileMetaData:
    """The footer of the segment ``entry`` names (boto3 S3 client)."""
    if entry.size < 12:
        raise SegmentCatalogError(f"segment {entry.object_key}: too small to be Parquet")
    tail = _range(client, entry, entry.size - 8, entry.size - 1)
    if tail[4:] != _MAGIC:
        raise SegmentCatalogError(f"segment {entry.object_key}: not a Parquet file")
    (length,) = struct.unpack("<I", tail[:4])
    if length > MAX_FOOTER_BYTES:
        raise SegmentCatalogError(
            f"segment {entry.object_key}: footer of {length} bytes is over the "
            f"{MAX_FOOTER_BYTES} byte limit"
        )
    if length > entry.size - 12:
        raise SegmentCatalogError(f"segment {entry.object_key}: footer length out of range")
    footer = _range(client, entry, entry.size - 8 - length, entry.size - 9)
    return _parsed(_MAGIC + footer + tail, entry)


def _parsed(data: bytes, entry: Uploaded) -> pq.FileMetaData:
    """The footer, decoded down to its Arrow schema (what registering it needs).

    Damaged bytes (pyarrow raises OSError or ArrowInvalid, by type) are this
    entry's fault, never a transient one: the segment catalog error names it.
    """
    try:
        # pyarrow parses a footer from a buffer that ends like a Parquet file.
        metadata = pq.read_metadata(pa.BufferReader(data))
        metadata.schema.to_arrow_schema()
    except (OSError, ValueError, pa.ArrowException):
        raise SegmentCatalogError(
            f"segment {entry.object_key}: its Parquet footer is damaged and cannot be read"
        ) from None
    return metadata
