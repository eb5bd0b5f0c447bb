"""``export_lerobot``: the episodes a SELECT picks, written as a LeRobot v3.0 dataset.

The SELECT reads ``ns.NAME_episodes`` (any columns and WHERE; ``episode_index``
is what counts); frames come from ``ns.NAME_frames`` and task texts from
``ns.NAME_tasks``. Episodes are renumbered 0..n-1 in their original order,
frame ``index`` 0..N-1, tasks 0..t-1 in their original order; every frame
keeps its values (and ``timestamp``, exactly frame/fps as in the source).

Videos: each source MP4 a selected episode uses is copied whole, streamed
from the stage and verified (size and SHA-256) to its new path, and the
episode keeps its from/to timestamps inside it. The decoded frames are
therefore the source's, bit for bit; episodes nobody selected stay in the
file unused (LeRobot decodes only from_timestamp + timestamp). Re-encoding
a frame range was the alternative: lossy unless lossless, and a stream copy
cuts only at keyframes, so the whole-file copy is what keeps frames equal.

Written: ``meta/info.json`` (the source's, counts and splits updated),
``meta/tasks.parquet`` (task text as the pandas index), ``meta/episodes``,
``meta/stats.json`` (min, max, mean, std, count of every numeric frame
feature over the exported frames), ``data/chunk-000/file-000.parquet`` and
``videos/<key>/chunk-000/file-NNN.mp4``.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lake_core.errors import InvalidArgument
from lake_core.filetype import row_to_location
from lake_core.models import DataLocation
from lake_core.names import TableRef
from lake_sdk.errors import InvalidDataset
from lake_sdk.lerobot.layout import FEATURE_KEY, INFO_KEY, SUPPORTED_VERSION, column_name

if TYPE_CHECKING:
    from lake_sdk.client import AsyncClient

__all__ = ["ExportedDataset", "episodes_table", "export_lerobot"]

_FROM = re.compile(r"\bFROM\s+((?:lake\.)?[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*)_episodes\b", re.I)
DATA_FILE = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_FILE = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_FILE = "meta/episodes/chunk-000/file-000.parquet"
#: Frames fetched per query while exporting (bounded memory).
FRAME_BATCH_EPISODES = 1000
#: MP4s copied from the stage at once.
VIDEO_COPIES = 4


@dataclass(frozen=True)
class ExportedDataset:
    root: Path
    episode_count: int
    frame_count: int
    task_count: int
    videos_copied: int

    def as_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "episode_count": self.episode_count,
            "frame_count": self.frame_count,
            "task_count": self.task_count,
            "videos_copied": self.videos_copied,
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


class _Stats:
    """Running min, max, sum, sum of squares and count per numeric feature (per element)."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, Any]] = {}

    def add(self, name: str, column: pa.ChunkedArray | pa.Array) -> None:
        kind = column.type
        if pa.types.is_fixed_size_list(kind):
            width = kind.list_size
            flat = pc.list_flatten(column)
        elif pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
            width = 1
            flat = column
        else:
            return  # strings, variable-length lists: no per-element statistics
        flat = pc.cast(flat, pa.float64())
        rows = len(flat) // width if width else 0
        if rows == 0:
            return
        entry = self.values.setdefault(
            name,
            {
                "min": [math.inf] * width,
                "max": [-math.inf] * width,
                "sum": [0.0] * width,
                "sq": [0.0] * width,
                "count": 0,
            },
        )
        for i in range(width):
            values = flat if width == 1 else flat.take(pa.array(range(i, len(flat), width)))
            bounds = pc.min_max(values)
            entry["min"][i] = min(entry["min"][i], bounds["min"].as_py())
            entry["max"][i] = max(entry["max"][i], bounds["max"].as_py())
            entry["sum"][i] += pc.sum(values).as_py()
            entry["sq"][i] += pc.sum(pc.multiply(values, values)).as_py()
        entry["count"] += rows

    def result(self) -> dict[str, dict[str, list[float] | list[int]]]:
        out: dict[str, dict[str, list[float] | list[int]]] = {}
        for name, e in self.values.items():
            n = e["count"]
            mean = [s / n for s in e["sum"]]
            std = [math.sqrt(max(0.0, q / n - m * m)) for q, m in zip(e["sq"], mean, strict=True)]
            out[name] = {"min": e["min"], "max": e["max"], "mean": mean, "std": std, "count": [n]}
        return out


def _empty_directory(out_dir: str | Path) -> Path:
    root = Path(out_dir).expanduser().absolute()
    if root.exists() and any(root.iterdir()):
        raise InvalidArgument(f"{root} is not empty: export into a new directory")
    return root


def _in_list(values: Iterable[int]) -> str:
    return ", ".join(str(int(v)) for v in values)


async def export_lerobot(client: AsyncClient, sql: str, out_dir: str | Path) -> ExportedDataset:
    """Write the selected episodes as a v3.0 dataset in ``out_dir`` (new or empty)."""
    base = episodes_table(sql)
    frames_ref = TableRef.parse(f"{base}_frames")
    tasks_ref = TableRef.parse(f"{base}_tasks")
    root = await asyncio.to_thread(_empty_directory, out_dir)
    selected = await client.query_table(sql)
    if "episode_index" not in selected.column_names:
        raise InvalidArgument("the SELECT must return episode_index")
    wanted = sorted(set(selected.column("episode_index").to_pylist()))
    frames_schema = await client.table_schema(frames_ref)
    info_text = (frames_schema.field(0).metadata or {}).get(INFO_KEY)
    if info_text is None:
        raise InvalidDataset(f"{frames_ref} was not made by import_lerobot (no info.json)")
    info = json.loads(info_text)
    features = {
        f.name: (f.metadata or {}).get(FEATURE_KEY, f.name.encode()).decode() for f in frames_schema
    }
    video_keys = [k for k, f in info["features"].items() if f.get("dtype") == "video"]
    episodes = await client.query_table(
        f"SELECT * FROM {base}_episodes WHERE episode_index IN ({_in_list(wanted) or '-1'}) "
        "ORDER BY episode_index"
    )
    all_tasks = await client.query_table(f"SELECT task_index, task FROM {tasks_ref}")
    task_text = dict(
        zip(all_tasks["task_index"].to_pylist(), all_tasks["task"].to_pylist(), strict=True)
    )

    root.mkdir(parents=True, exist_ok=True)
    renumber = {old: new for new, old in enumerate(wanted)}
    data_path = root / DATA_FILE.format(chunk_index=0, file_index=0)
    data_path.parent.mkdir(parents=True)
    source_names = [features[n] for n in frames_schema.names]
    out_schema = pa.schema([pa.field(features[f.name], f.type, f.nullable) for f in frames_schema])
    stats = _Stats()
    ranges: dict[int, tuple[int, int]] = {}
    used_tasks: set[int] = set()
    # Pass 1: which tasks the frames use (their renumbering must be known before writing).
    for start in range(0, len(wanted), FRAME_BATCH_EPISODES):
        group = wanted[start : start + FRAME_BATCH_EPISODES]
        used = await client.query_table(
            f"SELECT DISTINCT task_index FROM {frames_ref} "
            f"WHERE episode_index IN ({_in_list(group)})"
        )
        used_tasks.update(used["task_index"].to_pylist())
    for row in episodes.column("tasks").to_pylist():
        for text in row or []:
            used_tasks.update(i for i, t in task_text.items() if t == text)
    task_order = sorted(used_tasks)
    task_map = {old: new for new, old in enumerate(task_order)}
    # Videos: each distinct source MP4 once per camera, streamed and verified, a few at a
    # time, while the frames are written.
    files: dict[tuple[str, str], int] = {}
    copies: list[tuple[DataLocation, Path]] = []
    for row in episodes.to_pylist():
        for key in video_keys:
            location = row_to_location(row[column_name(key)])
            slot = (key, location.sha256)
            if slot not in files:
                files[slot] = sum(1 for k, _ in files if k == key)
                target = VIDEO_FILE.format(video_key=key, chunk_index=0, file_index=files[slot])
                copies.append((location, root / target))
    limit = asyncio.Semaphore(VIDEO_COPIES)

    async def copy(location: DataLocation, target: Path) -> None:
        async with limit:
            await asyncio.to_thread(target.parent.mkdir, parents=True, exist_ok=True)
            reader = await client.open(location)
            try:
                await reader.copy_to(target)
            finally:
                await reader.aclose()

    async def _write_frames() -> int:
        """Stream the frames into the data file, renumbered; returns how many."""
        index = 0
        with pq.ParquetWriter(data_path, out_schema) as writer:
            for start in range(0, len(wanted), FRAME_BATCH_EPISODES):
                group = wanted[start : start + FRAME_BATCH_EPISODES]
                result = await client.query(
                    f"SELECT * FROM {frames_ref} WHERE episode_index IN ({_in_list(group)}) "
                    "ORDER BY episode_index, frame_index"
                )
                while (batch := await result.next_batch()) is not None:
                    if batch.num_rows == 0:
                        continue
                    table = pa.Table.from_batches([batch]).rename_columns(source_names)
                    old_episode = table.column("episode_index").to_pylist()
                    new_episode = [renumber[e] for e in old_episode]
                    new_index = list(range(index, index + table.num_rows))
                    for position, episode in enumerate(new_episode):
                        low, high = ranges.get(episode, (index + position, index + position))
                        ranges[episode] = (
                            min(low, index + position),
                            max(high, index + position + 1),
                        )
                    columns = {
                        "episode_index": pa.array(
                            new_episode, table.schema.field("episode_index").type
                        ),
                        "index": pa.array(new_index, table.schema.field("index").type),
                        "task_index": pa.array(
                            [task_map[t] for t in table.column("task_index").to_pylist()],
                            table.schema.field("task_index").type,
                        ),
                    }
                    for name, array in columns.items():
                        table = table.set_column(table.schema.get_field_index(name), name, array)
                    table = table.cast(out_schema)
                    for name in table.column_names:
                        stats.add(name, table.column(name))
                    writer.write_table(table)
                    index += table.num_rows
        return index

    copying = asyncio.ensure_future(asyncio.gather(*(copy(loc, t) for loc, t in copies)))
    try:
        index = await _write_frames()
    except BaseException:
        copying.cancel()
        raise

    await copying
    episode_rows: list[dict[str, Any]] = []
    for row in episodes.to_pylist():
        new = renumber[row["episode_index"]]
        low, high = ranges.get(new, (0, 0))
        record: dict[str, Any] = {
            "episode_index": new,
            "tasks": row["tasks"],
            "length": row["length"],
            "data/chunk_index": 0,
            "data/file_index": 0,
            "dataset_from_index": low,
            "dataset_to_index": high,
        }
        if high - low != row["length"]:
            raise InvalidDataset(
                f"episode {row['episode_index']} has {high - low} frames in {frames_ref}, "
                f"its episodes row says {row['length']}"
            )
        for key in video_keys:
            column = column_name(key)
            slot = (key, row_to_location(row[column]).sha256)
            record[f"videos/{key}/chunk_index"] = 0
            record[f"videos/{key}/file_index"] = files[slot]
            record[f"videos/{key}/from_timestamp"] = row[f"{column}__from_timestamp"]
            record[f"videos/{key}/to_timestamp"] = row[f"{column}__to_timestamp"]
        record["meta/episodes/chunk_index"] = 0
        record["meta/episodes/file_index"] = 0
        episode_rows.append(record)

    meta = root / "meta"
    (meta / "episodes" / "chunk-000").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(episode_rows), root / EPISODES_FILE)
    write_tasks([task_text[i] for i in task_order], meta / "tasks.parquet")
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
    (meta / "info.json").write_text(json.dumps(info, indent=4))
    (meta / "stats.json").write_text(json.dumps(stats.result(), indent=4))
    return ExportedDataset(root, len(wanted), index, len(task_order), len(copies))
