"""A LeRobot v3.0 dataset directory as Lake reads it: info, tasks, episodes, file paths.

Only pyarrow reads it (``lerobot`` and torch are never needed). Feature
names such as ``observation.images.front`` are not Lake column names (no
dots): :func:`column_name` maps them (``observation__images__front``) and the
original name travels in the field's metadata under :data:`FEATURE_KEY`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from lake_core.names import MAX_NAME_LENGTH
from lake_sdk.errors import InvalidDataset

__all__ = ["FEATURE_KEY", "INFO_KEY", "SUPPORTED_VERSION", "Dataset", "column_name", "read_dataset"]

SUPPORTED_VERSION = "v3.0"
#: Field metadata key holding a column's LeRobot feature name.
FEATURE_KEY = b"lerobot.feature"
#: Metadata key of the frames table's first field: the source's ``meta/info.json``.
INFO_KEY = b"lerobot.info"
_SEPARATORS = re.compile(r"[./\- ]")
_COLUMN = re.compile(r"[a-z_][a-z0-9_]*")


def column_name(feature: str) -> str:
    """The Lake column of a LeRobot feature: lowercase, ``.``, ``/``, ``-`` and space as ``__``."""
    name = _SEPARATORS.sub("__", feature.lower())
    if not _COLUMN.fullmatch(name) or len(name) > MAX_NAME_LENGTH:
        raise InvalidDataset(f"feature {feature!r} has no Lake column name ({name!r} is not one)")
    return name


@dataclass(frozen=True)
class Dataset:
    """What an import needs, read and checked before anything is created or uploaded."""

    root: Path
    info: dict[str, Any]
    tasks: pa.Table  # task_index int64, task utf8
    episodes: pa.Table  # meta/episodes rows, all files
    data_files: tuple[Path, ...]
    video_keys: tuple[str, ...]

    @property
    def fps(self) -> int:
        return int(self.info["fps"])

    def video_file(self, key: str, chunk: int, file: int) -> Path:
        template = str(self.info["video_path"])
        return self.root / template.format(video_key=key, chunk_index=chunk, file_index=file)


def _info(root: Path) -> dict[str, Any]:
    path = root / "meta" / "info.json"
    if not path.is_file():
        raise InvalidDataset(f"{root} is not a LeRobot dataset: it has no meta/info.json")
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidDataset(f"{path} is not readable JSON: {exc}") from None
    if not isinstance(info, dict):
        raise InvalidDataset(f"{path} is not a JSON object")
    version = info.get("codebase_version")
    if version != SUPPORTED_VERSION:
        raise InvalidDataset(
            f"{root} is a LeRobot {version!r} dataset; Lake imports {SUPPORTED_VERSION} only "
            "(convert it with lerobot's own converter first)"
        )
    for key in ("fps", "features", "data_path"):
        if key not in info:
            raise InvalidDataset(f"{path} has no {key!r}")
    return info


def _tasks(root: Path) -> pa.Table:
    path = root / "meta" / "tasks.parquet"
    if not path.is_file():
        raise InvalidDataset(f"{root} has no meta/tasks.parquet")
    table = pq.read_table(path)
    metadata = json.loads((table.schema.metadata or {}).get(b"pandas", b"{}"))
    index = [c for c in metadata.get("index_columns", []) if isinstance(c, str)]
    text = index[0] if index else ("task" if "task" in table.column_names else None)
    if text is None or "task_index" not in table.column_names:
        raise InvalidDataset(f"{path} must hold task_index and the task text as its index")
    return pa.table(
        {
            "task_index": table.column("task_index").cast(pa.int64()),
            "task": table.column(text).cast(pa.utf8()),
        }
    )


def read_dataset(directory: str | Path) -> Dataset:
    """Read and check a v3.0 dataset's metadata (InvalidDataset naming what is wrong)."""
    root = Path(directory).expanduser().absolute()
    if not root.is_dir():
        raise InvalidDataset(f"{root} is not a directory")
    info = _info(root)
    features = info["features"]
    if not isinstance(features, dict):
        raise InvalidDataset("meta/info.json features must be an object")
    video_keys = tuple(
        k for k, f in features.items() if isinstance(f, dict) and f.get("dtype") == "video"
    )
    for name in features:
        column_name(name)
    episode_files = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    if not episode_files:
        raise InvalidDataset(f"{root} has no meta/episodes/chunk-*/file-*.parquet")
    episodes = pa.concat_tables(
        [pq.read_table(p) for p in episode_files], promote_options="default"
    ).sort_by("episode_index")
    needed = ["episode_index", "length", "dataset_from_index", "dataset_to_index"]
    needed += [
        f"videos/{k}/{c}"
        for k in video_keys
        for c in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
    ]
    missing = [c for c in needed if c not in episodes.column_names]
    if missing:
        raise InvalidDataset(f"meta/episodes lacks {missing}")
    data_files = sorted((root / "data").glob("chunk-*/file-*.parquet"))
    if not data_files:
        raise InvalidDataset(f"{root} has no data/chunk-*/file-*.parquet")
    dataset = Dataset(root, info, _tasks(root), episodes, tuple(data_files), video_keys)
    for row in episodes.select([c for c in needed if c.startswith("videos/")]).to_pylist():
        for key in video_keys:
            path = dataset.video_file(
                key, row[f"videos/{key}/chunk_index"], row[f"videos/{key}/file_index"]
            )
            if not path.is_file():
                raise InvalidDataset(f"{path} is missing")
    return dataset
