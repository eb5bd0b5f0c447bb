"""The logical FILE type: an Arrow struct marked as Lake's file reference.

A FILE cell holds a :class:`~lake_core.models.DataLocation`: the object's
durable URI, media type, byte size and SHA-256. Tables store this metadata
only; the bytes live in object storage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from lake_core.models import DataLocation

__all__ = [
    "FILE_METADATA",
    "FILE_STRUCT",
    "MEDIA_TYPE_PATTERN",
    "file_field",
    "is_file_field",
    "location_to_row",
    "row_to_location",
]

LOGICAL_TYPE_KEY = b"lake.logical_type"

#: A FILE value's media type: ``type/subtype``, each part a token of at most 127
#: characters (no parameters). The SDK checks it on upload, Metasrv on every append.
MEDIA_TYPE_PATTERN = (
    r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
)
FILE_METADATA: Mapping[bytes, bytes] = {LOGICAL_TYPE_KEY: b"file"}

FILE_STRUCT = pa.struct(
    [
        pa.field("uri", pa.utf8(), nullable=False),
        pa.field("media_type", pa.utf8(), nullable=False),
        pa.field("size_bytes", pa.uint64(), nullable=False),
        pa.field("sha256", pa.utf8(), nullable=False),
    ]
)


def file_field(name: str, nullable: bool = True) -> pa.Field:
    """A FILE column."""
    return pa.field(name, FILE_STRUCT, nullable=nullable, metadata=dict(FILE_METADATA))


def is_file_field(field: pa.Field) -> bool:
    return bool(field.metadata) and field.metadata.get(LOGICAL_TYPE_KEY) == b"file"


def location_to_row(location: DataLocation) -> dict[str, Any]:
    return location.model_dump()


def row_to_location(row: Mapping[str, Any]) -> DataLocation:
    return DataLocation.model_validate(dict(row))
