"""What an interrupted ``import_lerobot`` already did, so a re-run finishes it instead.

Kept only when the client has an ``upload_checkpoint_dir``: one JSON file per
(namespace, name, dataset directory) under ``<dir>/lerobot/``, replaced
atomically (fsync'd) after each step. It records that the three tables were
created by this import, and each MP4 uploaded so far: its path, size and
mtime (a changed file is uploaded again) and the DataLocation it became.
Frames, episodes and tasks need no record: each append is atomic, so a
re-run counts the rows already in the tables. The file is removed when the
import finishes. It holds no credentials (a DataLocation names an object,
it does not grant access to it).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from lake_core import faults
from lake_core.durable import replace_synced
from lake_core.models import DataLocation
from lake_sdk.errors import InvalidDataset

__all__ = ["AFTER_VIDEO_UPLOAD", "ImportJournal"]

JOURNAL_DIR = "lerobot"
#: Test-only crash point: an MP4 is uploaded and recorded, the next not started.
AFTER_VIDEO_UPLOAD = faults.LEROBOT_AFTER_VIDEO_UPLOAD


class ImportJournal:
    """The record of one import in progress (empty when none was interrupted)."""

    def __init__(self, directory: str | os.PathLike[str], key: str) -> None:
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        self.path = Path(directory).expanduser().absolute() / JOURNAL_DIR / f"{digest}.json"
        self.key = key
        self.tables_created = False
        self.videos: dict[str, dict[str, Any]] = {}

    def __repr__(self) -> str:
        return f"ImportJournal({str(self.path)!r})"

    def load(self) -> ImportJournal:
        try:
            body = json.loads(self.path.read_text())
        except FileNotFoundError:
            return self
        except (OSError, ValueError) as exc:
            raise InvalidDataset(f"import journal {self.path} is unreadable: {exc}") from None
        if not isinstance(body, dict) or body.get("key") != self.key:
            raise InvalidDataset(f"import journal {self.path} belongs to another import")
        self.tables_created = bool(body.get("tables_created"))
        videos = body.get("videos")
        self.videos = videos if isinstance(videos, dict) else {}
        return self

    def save(self) -> None:
        body = {"key": self.key, "tables_created": self.tables_created, "videos": self.videos}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        replace_synced(self.path, [json.dumps(body).encode()])

    def uploaded(self, path: Path) -> DataLocation | None:
        """The recorded upload of ``path``, if the file is still the one uploaded."""
        entry = self.videos.get(str(path))
        if entry is None:
            return None
        stat = path.stat()
        if entry.get("size") != stat.st_size or entry.get("mtime_ns") != stat.st_mtime_ns:
            return None
        return DataLocation.model_validate(entry["location"])

    def record(self, path: Path, location: DataLocation) -> None:
        stat = path.stat()
        self.videos[str(path)] = {
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "location": location.model_dump(mode="json"),
        }
        self.save()
        faults.crash(AFTER_VIDEO_UPLOAD)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
