"""``import_lerobot``: a LeRobot v3.0 dataset into three Lake tables.

- ``NAME_frames``: every frame column with the type pyarrow reads from the
  dataset's parquet files (feature names mapped by
  :func:`~lake_sdk.lerobot.layout.column_name`, the original in each field's
  metadata), appended file by file in batches of at most 10,000 rows.
- ``NAME_episodes``: ``episode_index``, ``tasks``, ``length``,
  ``dataset_from_index``, ``dataset_to_index`` and, per camera, a FILE column
  of its MP4 with ``<camera>__from_timestamp``/``__to_timestamp`` (seconds
  into that MP4). Each MP4 is uploaded once, however many episodes it holds.
  Per camera also ``<camera>__stats_min``/``_max``/``_mean``/``_std`` (one
  value per colour channel, in 0..1) and ``<camera>__stats_count``: the
  episode's video statistics as LeRobot computes them
  (:mod:`lake_sdk.lerobot.stats`; each MP4 decoded once, before anything is
  created), which export aggregates into ``stats.json``.
- ``NAME_tasks``: ``task_index``, ``task``.

Everything is read and checked first (a dataset of another codebase version
raises :class:`~lake_sdk.errors.InvalidDataset` naming it; an existing table
raises ``TableExists``), before any table is created or byte uploaded.
Tables are created through Metasrv (``meta_addr``), rows appended through Query.

Resumable with a client ``upload_checkpoint_dir``: :mod:`lake_sdk.lerobot.journal`
records the tables this import created and each MP4 uploaded, so running the
same import again uploads only what is missing, skips the frames already
appended (counted) and appends episodes and tasks only if absent.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from lake_core.errors import NotFound, TableExists
from lake_core.filetype import file_field, location_to_row
from lake_core.metaclient import MetaClient
from lake_core.models import DataLocation
from lake_core.names import TableRef, validate_identifier
from lake_core.protocol import MAX_APPEND_ROWS
from lake_objects.errors import ObjectNotFound
from lake_objects.source import FileUpload
from lake_objects.store import ManagedObjectStore
from lake_sdk.errors import InvalidDataset
from lake_sdk.lerobot.journal import ImportJournal
from lake_sdk.lerobot.layout import FEATURE_KEY, INFO_KEY, Dataset, column_name, read_dataset
from lake_sdk.lerobot.stats import STAT_NAMES, VideoStats, episode_video_stats

if TYPE_CHECKING:
    from lake_sdk._client import AsyncClient

__all__ = ["ImportedDataset", "import_lerobot", "table_names"]

VIDEO_MEDIA_TYPE = "video/mp4"


@dataclass(frozen=True)
class ImportedDataset:
    frames: TableRef
    episodes: TableRef
    tasks: TableRef
    frame_count: int
    episode_count: int
    videos_uploaded: int

    def as_json(self) -> dict[str, Any]:
        return {
            "frames": str(self.frames),
            "episodes": str(self.episodes),
            "tasks": str(self.tasks),
            "frame_count": self.frame_count,
            "episode_count": self.episode_count,
            "videos_uploaded": self.videos_uploaded,
        }


def table_names(namespace: str, name: str) -> tuple[TableRef, TableRef, TableRef]:
    validate_identifier(namespace, "namespace")
    validate_identifier(name, "dataset name")
    return (
        TableRef(namespace, f"{name}_frames"),
        TableRef(namespace, f"{name}_episodes"),
        TableRef(namespace, f"{name}_tasks"),
    )


def frames_schema(dataset: Dataset) -> pa.Schema:
    """The dataset's frame columns; the first also carries ``meta/info.json`` (for export)."""
    source = pq.read_schema(dataset.data_files[0])
    fields = [
        pa.field(column_name(f.name), f.type, f.nullable, {FEATURE_KEY: f.name.encode()})
        for f in source
    ]
    info = json.dumps(dataset.info, sort_keys=True).encode()
    fields[0] = fields[0].with_metadata({**(fields[0].metadata or {}), INFO_KEY: info})
    return pa.schema(fields)


def episodes_schema(dataset: Dataset) -> pa.Schema:
    fields = [
        pa.field("episode_index", pa.int64()),
        pa.field("tasks", pa.list_(pa.utf8())),
        pa.field("length", pa.int64()),
        pa.field("dataset_from_index", pa.int64()),
        pa.field("dataset_to_index", pa.int64()),
    ]
    for key in dataset.video_keys:
        column = column_name(key)
        metadata = {FEATURE_KEY: key.encode()}
        video = file_field(column)
        fields.append(video.with_metadata({**(video.metadata or {}), **metadata}))
        fields.append(pa.field(f"{column}__from_timestamp", pa.float64()))
        fields.append(pa.field(f"{column}__to_timestamp", pa.float64()))
        for stat in STAT_NAMES:
            fields.append(pa.field(f"{column}__stats_{stat}", pa.list_(pa.float64())))
        fields.append(pa.field(f"{column}__stats_count", pa.int64()))
    return pa.schema(fields)


TASKS_SCHEMA = pa.schema([pa.field("task_index", pa.int64()), pa.field("task", pa.utf8())])


def _frame_batches(dataset: Dataset, schema: pa.Schema) -> Any:
    """Batches of at most MAX_APPEND_ROWS frames, renamed and cast to ``schema``, file by file."""
    for path in dataset.data_files:
        parquet = pq.ParquetFile(path)
        for batch in parquet.iter_batches(batch_size=MAX_APPEND_ROWS):
            renamed = pa.RecordBatch.from_arrays(batch.columns, names=schema.names)
            yield renamed.cast(schema)


def video_stats(dataset: Dataset) -> dict[tuple[str, int], VideoStats | None]:
    """(camera, episode_index) -> that episode's video statistics; each MP4 decoded once."""
    by_file: dict[tuple[str, Path], list[dict[str, Any]]] = {}
    for row in dataset.episodes.to_pylist():
        for key in dataset.video_keys:
            path = dataset.video_file(
                key, row[f"videos/{key}/chunk_index"], row[f"videos/{key}/file_index"]
            )
            by_file.setdefault((key, path), []).append(row)
    out: dict[tuple[str, int], VideoStats | None] = {}
    for (key, path), rows in by_file.items():
        spans = [(float(r[f"videos/{key}/from_timestamp"]), int(r["length"])) for r in rows]
        try:
            found = episode_video_stats(path, spans, dataset.fps)
        except Exception as exc:  # PyAV raises its own FFmpeg error classes
            raise InvalidDataset(f"{path} is not a readable video: {exc}") from None
        for row, stats in zip(rows, found, strict=True):
            out[(key, row["episode_index"])] = stats
    return out


async def _row_count(client: AsyncClient, table: TableRef) -> int:
    counted = await client.query_table(f"SELECT count(*) AS n FROM {table}")
    return int(counted["n"][0].as_py())


async def _upload(
    store: ManagedObjectStore,
    path: Path,
    journal: ImportJournal | None,
    checkpoint_dir: str | os.PathLike[str] | None,
) -> DataLocation:
    """Upload one MP4, or reuse the upload an interrupted run recorded (if it still exists)."""
    if journal is not None:
        earlier = await asyncio.to_thread(journal.uploaded, path)
        if earlier is not None:
            try:
                reader = await store.open(earlier)
            except ObjectNotFound:
                pass  # reclaimed since (GC's safety age passed): upload it again
            else:
                await reader.aclose()
                return earlier
    location = await store.upload(
        FileUpload.from_path(path, VIDEO_MEDIA_TYPE), checkpoint_dir=checkpoint_dir
    )
    if journal is not None:
        await asyncio.to_thread(journal.record, path, location)
    return location


async def _check_absent(meta: MetaClient, tables: tuple[TableRef, ...]) -> None:
    for table in tables:
        try:
            await meta.describe_table(table)
        except NotFound:
            continue
        raise TableExists(f"{table} already exists: import under another --name")


async def import_lerobot(
    client: AsyncClient,
    directory: str | Path,
    *,
    namespace: str,
    name: str | None = None,
    meta: MetaClient,
) -> ImportedDataset:
    """Import the dataset at ``directory``; see the module docs."""
    dataset = read_dataset(directory)
    title = name if name is not None else column_name(dataset.root.name)
    frames_ref, episodes_ref, tasks_ref = tables = table_names(namespace, title)
    schemas = (frames_schema(dataset), episodes_schema(dataset), TASKS_SCHEMA)
    directory_of_checkpoints = client._state.files.options.upload_checkpoint_dir
    journal = (
        None
        if directory_of_checkpoints is None
        else ImportJournal(directory_of_checkpoints, f"{namespace}.{title}\n{dataset.root}").load()
    )
    if journal is None or not journal.tables_created:
        await _check_absent(meta, tables)
    stats = await asyncio.to_thread(video_stats, dataset)
    if journal is None or not journal.tables_created:
        for table, schema in zip(tables, schemas, strict=True):
            await meta.create_table(table, schema)
        if journal is not None:
            journal.tables_created = True
            await asyncio.to_thread(journal.save)

    # A resumed import skips the rows an earlier run appended (appends are atomic, in order).
    skip = 0 if journal is None else await _row_count(client, frames_ref)
    frame_count = 0
    for batch in _frame_batches(dataset, schemas[0]):
        frame_count += batch.num_rows
        if skip >= batch.num_rows:
            skip -= batch.num_rows
            continue
        await client.append_batches(frames_ref, [batch.slice(skip)])
        skip = 0

    store = await client.object_store()
    uploaded: dict[Path, DataLocation] = {}
    rows = dataset.episodes.to_pylist()
    columns: dict[str, list[Any]] = {n: [] for n in schemas[1].names}
    for row in rows:
        columns["episode_index"].append(row["episode_index"])
        columns["tasks"].append(row.get("tasks"))
        columns["length"].append(row["length"])
        columns["dataset_from_index"].append(row["dataset_from_index"])
        columns["dataset_to_index"].append(row["dataset_to_index"])
        for key in dataset.video_keys:
            column = column_name(key)
            path = dataset.video_file(
                key, row[f"videos/{key}/chunk_index"], row[f"videos/{key}/file_index"]
            )
            if path not in uploaded:
                uploaded[path] = await _upload(store, path, journal, directory_of_checkpoints)
            columns[column].append(location_to_row(uploaded[path]))
            columns[f"{column}__from_timestamp"].append(row[f"videos/{key}/from_timestamp"])
            columns[f"{column}__to_timestamp"].append(row[f"videos/{key}/to_timestamp"])
            found = stats[(key, row["episode_index"])]
            for stat in STAT_NAMES:
                value = None if found is None else list(getattr(found, stat))
                columns[f"{column}__stats_{stat}"].append(value)
            columns[f"{column}__stats_count"].append(None if found is None else found.count)
    if journal is None or await _row_count(client, episodes_ref) == 0:
        episodes = pa.RecordBatch.from_pydict(columns, schema=schemas[1])
        await client.append_batches(episodes_ref, [episodes])
    if journal is None or await _row_count(client, tasks_ref) == 0:
        tasks = pa.Table.from_arrays(
            [dataset.tasks.column("task_index"), dataset.tasks.column("task")],
            schema=TASKS_SCHEMA,
        )
        await client.append_batches(tasks_ref, tasks)
    if journal is not None:
        await asyncio.to_thread(journal.remove)
    return ImportedDataset(
        frames_ref, episodes_ref, tasks_ref, frame_count, len(rows), len(uploaded)
    )
