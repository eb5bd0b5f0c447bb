"""pyarrow file systems for the stores a registry location names.

A registry location is a local directory or ``s3://bucket/key.lance``.
Lance reads and writes datasets itself; Lake reads their files directly
only to ask typed questions after a failure (:mod:`lake_core.storage_probe`)
and to hash data files (:class:`lake_core.integrity.DataFileReader`). Both
go through :class:`StoreFileSystems`, configured like Lance from
:class:`~lake_core.cloud.DatasetStorage`: same endpoint, region, static
credentials (only when set in the environment) and bounded timeouts, one
attempt per request.
"""

from __future__ import annotations

import threading

import pyarrow.fs as pafs

from lake_core.cloud import DatasetStorage, split_s3_uri

__all__ = ["StoreFileSystems"]


class StoreFileSystems:
    """The file system and root path of a dataset location (thread-safe, lazily built)."""

    def __init__(self, storage: DatasetStorage) -> None:
        self._storage = storage
        self._s3: pafs.FileSystem | None = None
        self._lock = threading.Lock()

    def where(self, location: str) -> tuple[pafs.FileSystem, str]:
        """``(file system, dataset root)`` for a registry location."""
        if not self._storage.is_s3(location):
            return pafs.LocalFileSystem(), location.removeprefix("file://").rstrip("/")
        with self._lock:
            if self._s3 is None:
                self._s3 = self._s3_filesystem()
            s3 = self._s3
        bucket, key = split_s3_uri(location)
        return s3, f"{bucket}/{key.rstrip('/')}"

    def _s3_filesystem(self) -> pafs.FileSystem:
        storage = self._storage
        options = storage.storage_options("s3://probe/x") or {}
        endpoint = storage.s3_endpoint or ""
        seconds = max(0.1, storage.timeout_ms / 1000)
        return pafs.S3FileSystem(
            access_key=options.get("aws_access_key_id"),
            secret_key=options.get("aws_secret_access_key"),
            session_token=options.get("aws_session_token"),
            region=storage.region or "us-east-1",
            endpoint_override=endpoint.split("://", 1)[-1] or None,
            scheme="http" if endpoint.startswith("http://") else "https",
            connect_timeout=min(seconds, 3.0),
            request_timeout=seconds,
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
        )
