"""The segment catalog: a durable record of every segment a shipper uploaded.

It lives beside the segments, in ``DIR/_lake_segments.sqlite3`` (SQLite, WAL,
``synchronous=FULL``: an entry that was recorded survives a crash). Schema
version 1 (``PRAGMA user_version``)::

    CREATE TABLE uploaded (
        seq         INTEGER PRIMARY KEY AUTOINCREMENT,  -- recording order
        bucket      TEXT NOT NULL,
        object_key  TEXT NOT NULL,                      -- key inside bucket
        pipeline    TEXT NOT NULL,
        dataset     TEXT NOT NULL,
        segment     TEXT NOT NULL,                      -- file name, e.g. 000001.parquet
        size        INTEGER NOT NULL,                   -- bytes
        sha256      TEXT NOT NULL,                      -- lowercase hex
        uploaded_at TEXT NOT NULL,                      -- RFC 3339 UTC
        UNIQUE (bucket, object_key)
    );

An entry means "this object exists, whole, with these bytes". Entries are
never deleted: the registrar reads them and the Iceberg table (not this
file) records which are registered. Segments themselves are laid out
``DIR/<dataset>/<segment>.parquet``; :func:`write_segment` finalizes one
(complete, fsynced, renamed into place), and only finalized names are shipped.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from lake_core.durable import fsync_dir, fsync_file
from lake_iceberg.errors import SegmentCatalogError

__all__ = [
    "CATALOG_FILE",
    "FIELD_ID_KEY",
    "SCHEMA_VERSION",
    "SegmentCatalog",
    "Uploaded",
    "finalized_segments",
    "write_segment",
]

CATALOG_FILE = "_lake_segments.sqlite3"
SCHEMA_VERSION = 1
FIELD_ID_KEY = b"PARQUET:field_id"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS uploaded (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    bucket      TEXT NOT NULL,
    object_key  TEXT NOT NULL,
    pipeline    TEXT NOT NULL,
    dataset     TEXT NOT NULL,
    segment     TEXT NOT NULL,
    size        INTEGER NOT NULL,
    sha256      TEXT NOT NULL,
    uploaded_at TEXT NOT NULL,
    UNIQUE (bucket, object_key)
)
"""


@dataclass(frozen=True)
class Uploaded:
    """One durable ``Uploaded`` entry."""

    bucket: str
    object_key: str
    pipeline: str
    dataset: str
    segment: str
    size: int
    sha256: str
    seq: int = 0

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.object_key}"


class SegmentCatalog:
    """The ``uploaded`` table of one segment directory (safe across processes)."""

    def __init__(self, directory: str | os.PathLike[str], *, create: bool = True) -> None:
        self.path = Path(directory) / CATALOG_FILE
        if not create and not self.path.exists():
            raise SegmentCatalogError(f"no segment catalog at {self.path}")
        self._db = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, SCHEMA_VERSION):
            raise SegmentCatalogError(f"{self.path}: unknown schema version {version}")
        if version == 0:
            self._db.execute(_SCHEMA)
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> SegmentCatalog:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def record(self, entry: Uploaded) -> bool:
        """Record ``entry`` once; False when it was already there with the same bytes."""
        now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        cursor = self._db.execute(
            "INSERT OR IGNORE INTO uploaded (bucket, object_key, pipeline, dataset, segment,"
            " size, sha256, uploaded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                entry.bucket,
                entry.object_key,
                entry.pipeline,
                entry.dataset,
                entry.segment,
                entry.size,
                entry.sha256,
                now,
            ),
        )
        if cursor.rowcount == 1:
            return True
        existing = self.get(entry.bucket, entry.object_key)
        if existing is None or (existing.size, existing.sha256) != (entry.size, entry.sha256):
            raise SegmentCatalogError(
                f"segment {entry.object_key} is already recorded with other bytes: "
                "segments are immutable once shipped"
            )
        return False

    def get(self, bucket: str, object_key: str) -> Uploaded | None:
        rows = list(self._select("WHERE bucket = ? AND object_key = ?", (bucket, object_key)))
        return rows[0] if rows else None

    def entries(self, pipeline: str | None = None) -> list[Uploaded]:
        """Every entry in recording order (of one pipeline when given)."""
        if pipeline is None:
            return list(self._select("", ()))
        return list(self._select("WHERE pipeline = ?", (pipeline,)))

    def _select(self, where: str, args: tuple[object, ...]) -> Iterator[Uploaded]:
        query = (
            "SELECT bucket, object_key, pipeline, dataset, segment, size, sha256, seq"
            f" FROM uploaded {where} ORDER BY seq"
        )
        with closing(self._db.execute(query, args)) as cursor:
            for row in cursor:
                yield Uploaded(*row)


def _check_field_ids(schema: pa.Schema) -> None:
    def visit(field: pa.Field, path: str) -> None:
        if not field.metadata or FIELD_ID_KEY not in field.metadata:
            raise ValueError(f"column {path} has no Parquet field id (PARQUET:field_id)")
        kind = field.type
        children: list[pa.Field] = []
        if pa.types.is_struct(kind):
            children = [kind.field(i) for i in range(kind.num_fields)]
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
            children = [kind.value_field]
        elif pa.types.is_map(kind):
            children = [kind.key_field, kind.item_field]
        for child in children:
            visit(child, f"{path}.{child.name}")

    for field in schema:
        visit(field, field.name)


def write_segment(
    directory: str | os.PathLike[str], dataset: str, name: str, table: pa.Table
) -> Path:
    """Write and finalize ``DIR/<dataset>/<name>.parquet``.

    Every column must carry a stable field id (``PARQUET:field_id`` field
    metadata). The file is written under a hidden name, fsynced, renamed into
    place and its directory fsynced: a ``*.parquet`` name is always a complete file.
    """
    if not _NAME.match(dataset) or not _NAME.match(name):
        raise ValueError("dataset and segment names: letters, digits, '_', '.', '-' only")
    _check_field_ids(table.schema)
    folder = Path(directory) / dataset
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"{name}.parquet"
    partial = folder / f".{name}.parquet.partial"
    pq.write_table(table, partial)
    fsync_file(partial)
    os.replace(partial, final)
    fsync_dir(folder)
    return final


def finalized_segments(directory: str | os.PathLike[str]) -> Iterator[tuple[str, Path]]:
    """``(dataset, path)`` of every finalized segment, datasets and names sorted."""
    root = Path(directory)
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if folder.name.startswith(("_", ".")) or not _NAME.match(folder.name):
            continue
        for path in sorted(folder.glob("*.parquet")):
            if not path.name.startswith((".", "_")) and path.is_file():
                yield folder.name, path
