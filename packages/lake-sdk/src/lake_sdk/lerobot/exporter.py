"""``export_lerobot``: the episodes a SELECT picks, written as a LeRobot v3.0 dataset.

The SELECT reads ``ns.NAME_episodes`` (any columns and WHERE; ``episode_index``
is what counts); frames come from ``ns.NAME_frames`` and task texts from
``ns.NAME_tasks``. Episodes are renumbered 0..n-1 in their original order,
frame ``index`` 0..N-1, tasks 0..t-1 in their original order; every frame
keeps its values (and ``timestamp``, exactly frame/fps as in the source).

Videos (:mod:`lake_sdk.lerobot.videos`): a source MP4 whose episodes are
all selected is copied whole, streamed from the stage and verified (size and
SHA-256); from any other, the selected episodes' packets are cut out by a
stream copy (no re-encoding, so the decoded frames are the source's, bit for
bit) and packed into new MP4s under info.json's ``video_files_size_in_mb``,
their from/to timestamps moved with them. A file whose episodes do not start
at keyframes is copied whole instead.

Written: ``meta/info.json`` (the source's, counts and splits updated),
``meta/tasks.parquet`` (task text as the pandas index), ``meta/episodes``,
``meta/stats.json`` (:mod:`lake_sdk.lerobot.stats`: every numeric frame
feature over the exported frames; each camera aggregated from the per-episode
statistics import stored), ``data/chunk-C/file-F.parquet`` (a new file when
the next episode would reach info.json's ``data_files_size_in_mb``; file
indices wrap at ``chunks_size``: :mod:`lake_sdk.lerobot.files`) and
``videos/<key>/chunk-C/file-F.mp4`` (indices counted the same way).

Speed: two query round trips whatever the selection (each query names the
SELECT as a subquery, so none needs another's answer). The episodes query
runs first and alone, since the MP4 copies wait for it; the tasks and frames
queries start together once it answered (at most two run at once, a tenant's
share of a replica's query memory pools). The MP4s are copied (a few at a
time) and cut (each camera in its own thread) while the frames stream into
the data files.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from lake_core.errors import InvalidArgument
from lake_core.filetype import row_to_location
from lake_core.models import DataLocation
from lake_core.names import TableRef
from lake_sdk.errors import InvalidDataset
from lake_sdk.lerobot.files import (
    DATA_FILE,
    DEFAULT_CHUNKS_SIZE,
    DEFAULT_DATA_FILE_MB,
    DEFAULT_VIDEO_FILE_MB,
    VIDEO_FILE,
    DataFiles,
    size_limit,
)
from lake_sdk.lerobot.layout import FEATURE_KEY, INFO_KEY, SUPPORTED_VERSION, column_name
from lake_sdk.lerobot.stats import STAT_NAMES, FrameStats, VideoStats, aggregate_video_stats
from lake_sdk.lerobot.videos import CameraVideos, EpisodeVideo, export_camera

if TYPE_CHECKING:
    from lake_sdk._client import AsyncClient
    from lake_sdk._results import AsyncQueryResult

__all__ = ["ExportedDataset", "episodes_table", "export_lerobot"]

_FROM = re.compile(r"\bFROM\s+((?:lake\.)?[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*)_episodes\b", re.I)
EPISODES_FILE = "meta/episodes/chunk-000/file-000.parquet"
#: MP4s copied from the stage at once.
VIDEO_COPIES = 4
#: The episodes query's flag: whether the SELECT picked the row.
_SELECTED = "lake_lerobot_selected"


@dataclass(frozen=True)
class ExportedDataset:
    root: Path
    episode_count: int
    frame_count: int
    task_count: int
    videos_copied: int  # source MP4s copied whole
    videos_cut: int = 0  # MP4s written from episodes cut out of their source

    def as_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "episode_count": self.episode_count,
            "frame_count": self.frame_count,
            "task_count": self.task_count,
            "videos_copied": self.videos_copied,
            "videos_cut": self.videos_cut,
        }


def episodes_table(sql: str) -> str:
    """``ns.NAME`` of the ``ns.NAME_episodes`` a SELECT reads (InvalidArgument otherwise)."""
    match = _FROM.search(sql)
    if match is None:
        raise InvalidArgument("export_lerobot needs a SELECT ... FROM ns.NAME_episodes ...")
    name = match.group(1)
    return name[len("lake.") :] if name.lower().startswith("lake.") else name


def write_tasks(tasks: list[str], path: Path) -> None:
    """tasks.parquet as pandas writes it: task_index, and the task text as the index."""
    pandas = {
        "index_columns": ["task"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": "task",
                "field_name": "task",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.0",
    }
    schema = pa.schema([("task_index", pa.int64()), ("task", pa.utf8())]).with_metadata(
        {b"pandas": json.dumps(pandas).encode()}
    )
    table = pa.table({"task_index": list(range(len(tasks))), "task": tasks}, schema=schema)
    pq.write_table(table, path)


def _empty_directory(out_dir: str | Path) -> Path:
    root = Path(out_dir).expanduser().absolute()
    if root.exists() and not root.is_dir():
        raise InvalidArgument(f"{root} is not a directory: export into a new directory")
    if root.exists() and any(root.iterdir()):
        raise InvalidArgument(f"{root} is not empty: export into a new directory")
    return root


def _staging(root: Path) -> Path:
    """A new hidden directory beside ``root``: the export is written there, then renamed.

    So ``root`` holds a whole dataset or nothing: a failed export removes its
    staging directory, a killed one leaves only that behind (``.NAME.ID.partial``).
    """
    staging = root.parent / f".{root.name}.{uuid.uuid4().hex[:12]}.partial"
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
    except (NotADirectoryError, FileExistsError) as exc:
        raise InvalidArgument(f"cannot export into {root}: {exc}") from None
    return staging


def _publish(staging: Path, root: Path) -> None:
    """Rename the finished export to ``root`` (which must still be missing or empty)."""
    try:
        staging.replace(root)
    except OSError as exc:
        raise InvalidArgument(f"{root} is no longer empty: export into a new directory") from exc


def _video_stats(episodes: pa.Table, video_keys: list[str]) -> dict[str, dict[str, Any]]:
    """Each camera's stats over the selected episodes, if import stored them for all of them."""
    out: dict[str, dict[str, Any]] = {}
    for key in video_keys:
        prefix = f"{column_name(key)}__stats_"
        names = [f"{prefix}{n}" for n in (*STAT_NAMES, "count")]
        if episodes.num_rows == 0 or not all(n in episodes.column_names for n in names):
            continue
        columns = {n: episodes.column(f"{prefix}{n}").to_pylist() for n in (*STAT_NAMES, "count")}
        if any(v is None for values in columns.values() for v in values):
            continue
        parts = [
            VideoStats(
                min=tuple(columns["min"][i]),
                max=tuple(columns["max"][i]),
                mean=tuple(columns["mean"][i]),
                std=tuple(columns["std"][i]),
                count=int(columns["count"][i]),
            )
            for i in range(episodes.num_rows)
        ]
        out[key] = aggregate_video_stats(parts).as_json()
    return out


async def _copy_video(client: AsyncClient, location: DataLocation, target: Path) -> None:
    """Stream one object to ``target``, verified (size and SHA-256) before it is renamed there.

    ``copy_to`` writes a temporary file beside ``target`` (each chunk written
    while the next is read and hashed; a local object in one worker-thread
    call) and renames it only once every byte matched; on a mismatch it is
    removed. No fsync: an export is a directory of files written for a
    reader, not a commit; a crash leaves an unfinished export to delete,
    whatever is synced.
    """
    await asyncio.to_thread(target.parent.mkdir, parents=True, exist_ok=True)
    reader = await client.open(location)
    try:
        await reader.copy_to(target, durable=False)
    finally:
        await reader.aclose()


def _info(schema: pa.Schema, frames: TableRef) -> dict[str, Any]:
    """The source's info.json, which import keeps in the frames table's first field."""
    text = (schema.field(0).metadata or {}).get(INFO_KEY)
    if text is None:
        raise InvalidDataset(f"{frames} was not made by import_lerobot (no info.json)")
    info: dict[str, Any] = json.loads(text)
    return info


def _camera_episodes(
    info: dict[str, Any], all_episodes: pa.Table
) -> dict[str, tuple[list[EpisodeVideo], set[str]]]:
    """Per camera: the selected episodes' windows in order, and the source MP4s wholly selected.

    A source MP4 is wholly selected when every episode (of the whole table) using it is.
    """
    video_keys = [k for k, f in info["features"].items() if f.get("dtype") == "video"]
    rows = all_episodes.to_pylist()
    out: dict[str, tuple[list[EpisodeVideo], set[str]]] = {}
    for key in video_keys:
        column = column_name(key)
        partly: set[str] = set()
        used: set[str] = set()
        selected: list[EpisodeVideo] = []
        for row in rows:
            if row[column] is None:
                if row[_SELECTED]:
                    raise InvalidDataset(
                        f"episode {row['episode_index']} has no {key} video (its {column} is null)"
                    )
                continue  # an episode without a video uses no MP4
            location = row_to_location(row[column])
            if not row[_SELECTED]:
                partly.add(location.sha256)
                continue
            used.add(location.sha256)
            selected.append(
                EpisodeVideo(
                    location,
                    float(row[f"{column}__from_timestamp"]),
                    float(row[f"{column}__to_timestamp"]),
                    int(row["length"]),
                )
            )
        out[key] = (selected, used - partly)
    return out


async def _lacks_episode_index(client: AsyncClient, sql: str) -> bool:
    """Whether the selection plans, without an episode_index column (why the export failed)."""
    try:
        plan = await client.plan(sql)
    except Exception:
        return False
    return "episode_index" not in plan.schema.names


def _runs(episodes: Any) -> list[tuple[int, int]]:
    """(start, end) of each run of equal values in a numpy array."""
    import numpy as np

    if len(episodes) == 0:
        return []
    cuts = [0, *(np.flatnonzero(np.diff(episodes)) + 1).tolist(), len(episodes)]
    return list(itertools.pairwise(cuts))


async def export_lerobot(client: AsyncClient, sql: str, out_dir: str | Path) -> ExportedDataset:
    """Write the selected episodes as a v3.0 dataset in ``out_dir`` (new or empty).

    The dataset appears there whole, or not at all (:func:`_staging`).
    """
    base = episodes_table(sql)
    root = await asyncio.to_thread(_empty_directory, out_dir)
    target = root.resolve()  # a symlink to an empty directory: fill the directory
    staging = await asyncio.to_thread(_staging, target)
    try:
        done = await _export(client, sql, base, staging)
        await asyncio.to_thread(_publish, staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # also when cancelled: no await here
        raise
    return dataclasses.replace(done, root=root)


async def _export(client: AsyncClient, sql: str, base: str, root: Path) -> ExportedDataset:
    """Write the selected episodes of ``base`` into the existing, empty directory ``root``."""
    import numpy as np

    frames_ref = TableRef.parse(f"{base}_frames")
    tasks_ref = TableRef.parse(f"{base}_tasks")
    selection = f"SELECT episode_index FROM ({sql.strip().rstrip(';')}) AS lake_lerobot_selection"
    # Round trip 1: the frames' schema (info.json) and the selected episodes; then, beside
    # the frames query, every task with whether the selected frames use it. Each query names
    # the selection as a subquery, so none needs another's answer. At most two run at once: a
    # tenant holds two of a replica's query memory pools (LAKE_QUERY_MEMORY_POOLS_PER_TENANT).
    # The videos start copying as soon as the episodes and the schema are known.
    schema_reply = asyncio.ensure_future(client.table_schema(frames_ref))
    # Every episode, flagged: a source MP4 is copied whole only if all its episodes are picked.
    episodes_reply = asyncio.ensure_future(
        client.query_table(
            f"SELECT e.*, s.episode_index IS NOT NULL AS {_SELECTED} FROM {base}_episodes AS e "
            f"LEFT JOIN (SELECT DISTINCT episode_index FROM ({selection}) AS d) AS s "
            "ON e.episode_index = s.episode_index ORDER BY e.episode_index"
        )
    )
    tasks_sql = (
        f"SELECT t.task_index, t.task, u.task_index IS NOT NULL AS used FROM {tasks_ref} AS t "
        f"LEFT JOIN (SELECT DISTINCT task_index FROM {frames_ref} "
        f"WHERE episode_index IN ({selection})) AS u ON t.task_index = u.task_index"
    )

    async def tasks_after_episodes() -> pa.Table:
        # Alone, the episodes query answers sooner on a busy Query, and the copies wait for it.
        await asyncio.wait([episodes_reply])
        return await client.query_table(tasks_sql)

    tasks_reply = asyncio.ensure_future(tasks_after_episodes())
    limit = asyncio.Semaphore(VIDEO_COPIES)

    async def copy(location: DataLocation, target: Path) -> None:
        async with limit:
            await _copy_video(client, location, target)

    async def copy_videos() -> dict[str, CameraVideos]:
        """Each camera's MP4s: whole copies (a few at a time) and cut episodes, cameras at once."""
        schema, every = await asyncio.gather(schema_reply, episodes_reply)
        info = _info(schema, frames_ref)
        cameras = _camera_episodes(info, every)
        await asyncio.to_thread(root.mkdir, parents=True, exist_ok=True)
        fps = int(info["fps"])
        chunks = int(info.get("chunks_size") or DEFAULT_CHUNKS_SIZE)
        limit_mb = size_limit(info, "video_files_size_in_mb", DEFAULT_VIDEO_FILE_MB)
        done = await asyncio.gather(
            *(
                export_camera(
                    client,
                    key,
                    chosen,
                    whole,
                    root=root,
                    fps=fps,
                    chunks_size=chunks,
                    limit_mb=limit_mb,
                    copy=copy,
                )
                for key, (chosen, whole) in cameras.items()
            )
        )
        return dict(zip(cameras, done, strict=True))

    async def start_frames() -> AsyncQueryResult:
        """Round trip 2: the frames query, as soon as the episodes query is done (tasks too)."""
        await asyncio.wait((episodes_reply, tasks_reply), return_when=asyncio.FIRST_COMPLETED)
        return await client.query(
            f"SELECT * FROM {frames_ref} WHERE episode_index IN ({selection}) "
            "ORDER BY episode_index, frame_index"
        )

    def stop_frames() -> None:
        if not frames_reply.done():
            frames_reply.cancel()
        elif not frames_reply.cancelled() and frames_reply.exception() is None:
            frames_reply.result().cancel()

    copying = asyncio.ensure_future(copy_videos())
    frames_reply = asyncio.ensure_future(start_frames())
    replies = (schema_reply, tasks_reply, episodes_reply)
    try:
        frames_schema, all_tasks, every_episode = await asyncio.gather(*replies)
    except BaseException as failure:
        for pending in (*replies, copying):
            pending.cancel()
        stop_frames()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*replies, copying, frames_reply, return_exceptions=True)
        stop_frames()
        # The subqueries fail without an episode_index column: say so plainly.
        if isinstance(failure, Exception) and await _lacks_episode_index(client, sql):
            raise InvalidArgument("the SELECT must return episode_index") from None
        raise
    try:
        episodes = every_episode.filter(every_episode.column(_SELECTED)).drop_columns([_SELECTED])
        wanted = episodes.column("episode_index").to_pylist()
        if not wanted:
            # A dataset of no episodes is no dataset LeRobot loads: say so, write nothing.
            raise InvalidArgument("the SELECT selects no episodes: there is nothing to export")
        if len(set(wanted)) != len(wanted):
            raise InvalidDataset(f"{base}_episodes holds an episode_index twice")
        info = _info(frames_schema, frames_ref)
        features = {
            f.name: (f.metadata or {}).get(FEATURE_KEY, f.name.encode()).decode()
            for f in frames_schema
        }
        video_keys = [k for k, f in info["features"].items() if f.get("dtype") == "video"]
        chunks_size = int(info.get("chunks_size") or DEFAULT_CHUNKS_SIZE)
        data_limit = size_limit(info, "data_files_size_in_mb", DEFAULT_DATA_FILE_MB)
        task_text = dict(
            zip(all_tasks["task_index"].to_pylist(), all_tasks["task"].to_pylist(), strict=True)
        )
        used_tasks = {
            i
            for i, used in zip(
                all_tasks["task_index"].to_pylist(), all_tasks["used"].to_pylist(), strict=True
            )
            if used
        }
        episode_list = episodes.to_pylist()
        for row in episode_list:
            for text in row["tasks"] or []:
                used_tasks.update(i for i, t in task_text.items() if t == text)
        task_order = sorted(used_tasks)
        task_lookup = np.asarray(task_order, dtype=np.int64)
        wanted_lookup = np.asarray(wanted, dtype=np.int64)
        await asyncio.to_thread(root.mkdir, parents=True, exist_ok=True)
        # The frames stream into the data files while the videos are copied.
        frames_result = await frames_reply
    except BaseException:
        stop_frames()
        with contextlib.suppress(BaseException):
            await frames_reply
        stop_frames()
        copying.cancel()
        with contextlib.suppress(BaseException):
            await copying
        raise
    source_names = [features[n] for n in frames_schema.names]
    out_schema = pa.schema([pa.field(features[f.name], f.type, f.nullable) for f in frames_schema])
    stats = FrameStats()
    ranges: dict[int, tuple[int, int]] = {}
    data_slots: dict[int, tuple[int, int]] = {}
    data = DataFiles(root, out_schema, data_limit, chunks_size)

    def renumbered(batch: pa.RecordBatch, index: int) -> pa.Table:
        table = pa.Table.from_batches([batch]).rename_columns(source_names)
        old_episode = np.asarray(table.column("episode_index"))
        new_episode = np.searchsorted(wanted_lookup, old_episode)
        old_task = np.asarray(table.column("task_index"))
        new_task = np.searchsorted(task_lookup, old_task)
        if (
            (new_episode >= len(wanted)).any()
            or (wanted_lookup[np.minimum(new_episode, len(wanted) - 1)] != old_episode).any()
            or (new_task >= len(task_order)).any()
            or (task_lookup[np.minimum(new_task, len(task_order) - 1)] != old_task).any()
        ):
            raise InvalidDataset(f"{frames_ref} changed while it was exported: export again")
        columns = {
            "episode_index": new_episode,
            "index": np.arange(index, index + table.num_rows),
            "task_index": new_task,
        }
        for name, values in columns.items():
            position = table.schema.get_field_index(name)
            kind = table.schema.field(name).type
            table = table.set_column(position, name, pa.array(values).cast(kind))
        return table.cast(out_schema)

    async def write_frames() -> int:
        """Stream the frames into the data files, renumbered, episode by episode.

        Each batch is renumbered, counted into the stats and written in a worker
        thread, so the event loop stays free to drive the video copies meanwhile.
        """
        current: list[pa.Table] = []
        current_episode = -1

        def finish() -> None:
            if current:
                data_slots[current_episode] = data.add(pa.concat_tables(current))
                current.clear()

        def take(batch: pa.RecordBatch, index: int) -> None:
            nonlocal current_episode
            table = renumbered(batch, index)
            for name in table.column_names:
                stats.add(name, table.column(name))
            episode_numbers = np.asarray(table.column("episode_index"))
            for low, high in _runs(episode_numbers):
                episode = int(episode_numbers[low])
                if episode != current_episode:
                    finish()
                    current_episode = episode
                first, last = ranges.get(episode, (index + low, index + high))
                ranges[episode] = (min(first, index + low), max(last, index + high))
                current.append(table.slice(low, high - low))

        index = 0
        while (batch := await frames_result.next_batch()) is not None:
            if batch.num_rows == 0:
                continue
            await asyncio.to_thread(take, batch, index)
            index += batch.num_rows
        await asyncio.to_thread(finish)
        return index

    try:
        try:
            index = await write_frames()
        finally:
            await asyncio.to_thread(data.close)
        videos = await copying
    except BaseException:
        frames_result.cancel()
        copying.cancel()
        with contextlib.suppress(BaseException):
            await copying
        raise

    episode_rows: list[dict[str, Any]] = []
    position = {old: new for new, old in enumerate(wanted)}
    for row in episode_list:
        new = position[row["episode_index"]]
        low, high = ranges.get(new, (0, 0))
        if high - low != row["length"]:
            raise InvalidDataset(
                f"episode {row['episode_index']} has {high - low} frames in {frames_ref}, "
                f"its episodes row says {row['length']}"
            )
        chunk, file = data_slots.get(new, (0, 0))
        record: dict[str, Any] = {
            "episode_index": new,
            "tasks": row["tasks"],
            "length": row["length"],
            "data/chunk_index": chunk,
            "data/file_index": file,
            "dataset_from_index": low,
            "dataset_to_index": high,
        }
        for key in video_keys:
            placed = videos[key].placed[new]
            record[f"videos/{key}/chunk_index"] = placed.chunk
            record[f"videos/{key}/file_index"] = placed.file
            record[f"videos/{key}/from_timestamp"] = placed.from_timestamp
            record[f"videos/{key}/to_timestamp"] = placed.to_timestamp
        record["meta/episodes/chunk_index"] = 0
        record["meta/episodes/file_index"] = 0
        episode_rows.append(record)

    frame_stats = stats.result()
    video_stats = _video_stats(episodes, video_keys)
    info = {
        **info,
        "codebase_version": SUPPORTED_VERSION,
        "total_episodes": len(wanted),
        "total_frames": index,
        "total_tasks": len(task_order),
        "splits": {"train": f"0:{len(wanted)}"},
        "data_path": DATA_FILE,
        "video_path": VIDEO_FILE if video_keys else None,
    }

    def write_meta() -> None:
        meta = root / "meta"
        (meta / "episodes" / "chunk-000").mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(episode_rows), root / EPISODES_FILE)
        write_tasks([task_text[i] for i in task_order], meta / "tasks.parquet")
        (meta / "info.json").write_text(json.dumps(info, indent=4))
        (meta / "stats.json").write_text(json.dumps({**frame_stats, **video_stats}, indent=4))

    await asyncio.to_thread(write_meta)
    copied = sum(v.copied for v in videos.values())
    cut = sum(v.cut for v in videos.values())
    return ExportedDataset(root, len(wanted), index, len(task_order), copied, cut)
