"""Where exported frames and videos go: v3.0 chunk and file indices under info.json's limits.

LeRobot v3.0 appends episodes to ``data/chunk-C/file-F.parquet`` and starts
the next file when the episode would take the current one to
``data_files_size_in_mb`` or beyond (an episode never spans two files; a
file holds at least one). The file index counts up to ``chunks_size``, then
the chunk index counts up and the file index starts again at 0.
:class:`DataFiles` does this while streaming; :func:`next_slot` is the
counting rule (videos use it too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["DATA_FILE", "VIDEO_FILE", "DataFiles", "next_slot", "size_limit"]

DATA_FILE = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_FILE = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
#: LeRobot's defaults when info.json names no limits.
DEFAULT_CHUNKS_SIZE = 1000
DEFAULT_DATA_FILE_MB = 100.0
DEFAULT_VIDEO_FILE_MB = 500.0
#: Rows held before a row group is written (episodes of one file share row groups).
ROW_GROUP_ROWS = 65_536
_MB = 1024 * 1024


def next_slot(slot: tuple[int, int], chunks_size: int) -> tuple[int, int]:
    """The (chunk, file) after ``slot``: the file index wraps at ``chunks_size``."""
    chunk, file = slot
    file += 1
    if file >= chunks_size:
        return chunk + 1, 0
    return chunk, file


def size_limit(info: dict[str, Any], key: str, default: float) -> float:
    """info.json's ``key`` in MB (positive), else ``default``."""
    value = info.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return default


class DataFiles:
    """Episodes of frames written file by file; :meth:`add` returns where each went."""

    def __init__(self, root: Path, schema: pa.Schema, limit_mb: float, chunks_size: int) -> None:
        self.root = root
        self.schema = schema
        self.limit = limit_mb * _MB
        self.chunks_size = max(1, chunks_size)
        self.slot = (0, 0)
        self.paths: list[Path] = []
        self._sink: pa.NativeFile | None = None
        self._writer: pq.ParquetWriter | None = None
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._pending_bytes = 0
        self._episodes_in_file = 0

    def _open(self) -> None:
        chunk, file = self.slot
        path = self.root / DATA_FILE.format(chunk_index=chunk, file_index=file)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._sink = pa.OSFile(str(path), "wb")
        self._writer = pq.ParquetWriter(self._sink, self.schema)
        self.paths.append(path)

    def _flush(self) -> None:
        if self._pending and self._writer is not None:
            self._writer.write_table(pa.concat_tables(self._pending))
        self._pending, self._pending_rows, self._pending_bytes = [], 0, 0

    def _close_file(self) -> None:
        self._flush()
        if self._writer is not None:
            self._writer.close()
        if self._sink is not None:
            self._sink.close()
        self._writer = self._sink = None

    def _size(self) -> float:
        written = self._sink.tell() if self._sink is not None else 0
        return written + self._pending_bytes

    def add(self, episode: pa.Table) -> tuple[int, int]:
        """Write one whole episode's frames; its (chunk, file)."""
        if self._writer is None:
            self._open()
        elif self._episodes_in_file and self._size() + episode.nbytes >= self.limit:
            self._close_file()
            self.slot = next_slot(self.slot, self.chunks_size)
            self._episodes_in_file = 0
            self._open()
        self._pending.append(episode)
        self._pending_rows += episode.num_rows
        self._pending_bytes += episode.nbytes
        self._episodes_in_file += 1
        if self._pending_rows >= ROW_GROUP_ROWS:
            self._flush()
        return self.slot

    def close(self) -> None:
        if self._writer is None and not self.paths:
            self._open()  # no frames: still one (empty) data file, as before
        self._close_file()
