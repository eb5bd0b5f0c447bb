"""Table data-file integrity: what Metasrv records, and how a file is checked.

Lance data files carry no per-page checksums, so a flipped byte in stored
data can decode into different values without any error. At commit time
Metasrv records the size and SHA-256 of every data file the commit wrote
(:class:`DataFileDigest`); ``lake table verify`` and Query's
``LAKE_QUERY_VERIFY_ON_OPEN`` recompute them. Paths are relative to the
dataset's ``data/`` directory, as Lance names them in its fragments, so a
record never carries a storage URI.

Actions (JSON bodies, see :mod:`lake_core.protocol`):

- ``lake.verify_table``: :class:`VerifyTableRequest` -> :class:`VerifyTableResult` (admin).
- ``lake.data_file_digests``: :class:`DataFileDigestsRequest` (or a plain
  ``TableRequest``: every file) -> :class:`DataFileDigestsResult`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import Field

from lake_core.cloud import DatasetStorage
from lake_core.names import TableRef
from lake_core.protocol import WireModel
from lake_core.store_fs import StoreFileSystems

__all__ = [
    "DATA_FILE_DIGESTS",
    "MAX_DIGEST_PATHS",
    "VERIFY_TABLE",
    "DataFileDigest",
    "DataFileDigestsRequest",
    "DataFileDigestsResult",
    "DataFileProblem",
    "DataFileReader",
    "VerifyTableRequest",
    "VerifyTableResult",
    "digest_file",
    "fragment_file_paths",
    "render_report",
]

VERIFY_TABLE = "lake.verify_table"
DATA_FILE_DIGESTS = "lake.data_file_digests"
_CHUNK = 1024 * 1024
#: Remote reads are larger: each one is a request.
_REMOTE_CHUNK = 8 * 1024 * 1024


class DataFileDigest(WireModel):
    """One data file as its commit wrote it."""

    path: str = Field(description="relative to the dataset's data/ directory")
    size_bytes: int
    sha256: str


#: Paths one ``lake.data_file_digests`` request may name (a replica asks in chunks).
MAX_DIGEST_PATHS = 1000


class DataFileDigestsRequest(WireModel):
    """The recorded digests of ``paths`` (all the incarnation's files when None)."""

    table: TableRef
    paths: list[str] | None = Field(default=None, max_length=MAX_DIGEST_PATHS)


class DataFileDigestsResult(WireModel):
    """Recorded data files of the table's current incarnation (those asked for)."""

    table: TableRef
    incarnation: str
    files: list[DataFileDigest]


class VerifyTableRequest(WireModel):
    table: TableRef
    all_versions: bool = False


class DataFileProblem(WireModel):
    """A data file that is not what its commit wrote (or is gone)."""

    path: str
    versions: list[int] = Field(description="the table versions that read this file")
    problem: Literal["size", "sha256", "missing", "unreadable"]
    expected_size_bytes: int | None = None
    actual_size_bytes: int | None = None
    expected_sha256: str | None = None
    actual_sha256: str | None = None


class VerifyTableResult(WireModel):
    table: TableRef
    versions: list[int]
    files_checked: int
    #: Data files with no recorded digest (written before digests were recorded).
    unrecorded: list[str] = Field(default_factory=list)
    problems: list[DataFileProblem] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def digest_file(path: Path) -> tuple[int, str]:
    """Size and SHA-256 hex of a local file, read in 1 MiB chunks."""
    sha = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return size, sha.hexdigest()


class DataFileReader:
    """Size and SHA-256 of a dataset's data files, local or on S3 (blocking, thread-safe).

    :meth:`digest` raises ``FileNotFoundError`` when the file is not stored
    and ``OSError`` when it cannot be read (on S3: the store did not answer
    or refused access): callers decide which of those is the table's fault.
    """

    def __init__(self, storage: DatasetStorage | None = None) -> None:
        self._storage = storage or DatasetStorage()
        self._stores = StoreFileSystems(self._storage)

    def is_remote(self, location: str) -> bool:
        return self._storage.is_s3(location)

    def digest(self, location: str, path: str) -> tuple[int, str]:
        """Size and SHA-256 of ``data/<path>`` under the dataset at ``location``."""
        if not self._storage.is_s3(location):
            return digest_file(Path(location.removeprefix("file://")) / "data" / path)
        fs, root = self._stores.where(location)
        sha = hashlib.sha256()
        size = 0
        with fs.open_input_stream(f"{root}/data/{path}") as stream:
            while chunk := stream.read(_REMOTE_CHUNK):
                sha.update(chunk)
                size += len(chunk)
        return size, sha.hexdigest()


def fragment_file_paths(fragments: Iterable[object]) -> list[str]:
    """The data-file paths of Lance fragments (``FragmentMetadata`` or ``LanceFragment``)."""
    paths: list[str] = []
    for fragment in fragments:
        files = getattr(fragment, "files", None)
        if files is None:
            files = getattr(fragment, "metadata").files  # noqa: B009 - an untyped Lance object
        paths.extend(str(data_file.path) for data_file in files)
    return paths


def render_report(result: VerifyTableResult, *, as_json: bool) -> str:
    """``lake table verify``'s output: JSON, or one line per problem and a summary."""
    if as_json:
        return json.dumps(result.model_dump(mode="json"), indent=2)
    lines = []
    for problem in result.problems:
        detail = {
            "size": f"size {problem.actual_size_bytes}, recorded {problem.expected_size_bytes}",
            "sha256": f"sha256 {problem.actual_sha256}, recorded {problem.expected_sha256}",
            "missing": "the file is missing",
            "unreadable": "the file cannot be read",
        }[problem.problem]
        versions = ",".join(str(v) for v in problem.versions)
        lines.append(f"MISMATCH {result.table} data/{problem.path} (versions {versions}): {detail}")
    for path in result.unrecorded:
        lines.append(f"UNRECORDED {result.table} data/{path}: no digest was recorded")
    verdict = "OK" if result.ok else f"{len(result.problems)} data file(s) differ"
    lines.append(
        f"{result.table}: {result.files_checked} data file(s) of version(s) "
        f"{','.join(str(v) for v in result.versions)} checked: {verdict}"
    )
    return "\n".join(lines)
