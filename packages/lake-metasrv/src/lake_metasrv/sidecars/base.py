"""Reference-delta sidecars: which managed objects each table version adds.

``lake gc`` computes the live object set from sidecars, never from table
rows. A sidecar is written and fsync'd before the registry can point at its
version; once that version is registered the file never changes. A sidecar
for a version that was never registered (a crash mid-commit) is replaced by
the next attempt at that version number; until then it only makes GC keep
more objects, never fewer.

The models and both layouts are in :mod:`lake_core.references` (``lake gc``
reads them without depending on Metasrv); they are re-exported here.

:class:`SidecarStore` is the seam;
:class:`~lake_metasrv.sidecars.local.LocalSidecarStore` is the data directory
and :class:`~lake_metasrv.sidecars.s3.S3SidecarStore` the cloud one.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from lake_core.errors import InvalidAppend
from lake_core.filetype import MEDIA_TYPE_PATTERN, is_file_field
from lake_core.references import DropMarker, ReferenceDelta

__all__ = ["DropMarker", "ReferenceDelta", "SidecarStore", "file_uris"]

_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def file_uris(table: pa.Table, schema: pa.Schema) -> list[str]:
    """Distinct URIs of every non-null FILE cell, validating each cell's shape.

    Raises InvalidAppend for an empty URI, a media type not ``type/subtype`` or a
    malformed SHA-256, so a bad DataLocation is refused before anything is written.
    """
    uris: set[str] = set()
    for field in schema:
        if not is_file_field(field):
            continue
        column = table.column(field.name)
        present = column.filter(pc.is_valid(column))
        if len(present) == 0:
            continue
        uri = pc.struct_field(present, "uri")
        media_type = pc.struct_field(present, "media_type")
        sha256 = pc.struct_field(present, "sha256")
        if pc.any(pc.equal(pc.utf8_length(uri), 0)).as_py() or uri.null_count:
            raise InvalidAppend(f"FILE column {field.name!r} has an empty uri")
        typed = pc.match_substring_regex(media_type, f"^{MEDIA_TYPE_PATTERN}$")
        if media_type.null_count or not pc.all(typed).as_py():
            raise InvalidAppend(
                f"FILE column {field.name!r} has a media_type that is not 'type/subtype'"
            )
        well_formed = pc.match_substring_regex(sha256, _SHA256_HEX.pattern)
        if sha256.null_count or not pc.all(well_formed).as_py():
            raise InvalidAppend(
                f"FILE column {field.name!r} has a sha256 that is not 64 lowercase hex digits"
            )
        uris.update(pc.unique(uri).to_pylist())
    return sorted(uris)


class SidecarStore(abc.ABC):
    """Where reference-delta sidecars and drop markers are kept (blocking calls).

    A write returns only once the sidecar is durable, and returns where it went.
    """

    @abc.abstractmethod
    def write_delta(self, delta: ReferenceDelta) -> str: ...

    @abc.abstractmethod
    def write_deltas(self, deltas: Sequence[ReferenceDelta]) -> None:
        """Write a group's deltas; returns once every one is durable."""

    @abc.abstractmethod
    def write_drop(self, marker: DropMarker) -> str:
        """Mark a dropped incarnation (the drop is done: a failure only makes GC keep more)."""

    @abc.abstractmethod
    def read_delta(
        self, incarnation: str, version: int, operation_id: str | None = None
    ) -> ReferenceDelta: ...
