"""Digest records of S3 tables, beside their sidecars in the bucket (cloud mode).

``s3://$LAKE_S3_BUCKET/$LAKE_TABLE_PREFIX/_lake-integrity/<incarnation>/<version:020d>.json``
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lake_core.integrity import DataFileReader
from lake_metasrv.boto_errors import s3_error
from lake_metasrv.digests.base import DigestStore
from lake_metasrv.engine.base import LanceEngine

__all__ = ["S3DigestStore"]


class S3DigestStore(DigestStore):
    """Digest records of S3 tables, one object each (a put is durable once acknowledged)."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        client: Callable[[], Any],
        engine: LanceEngine,
        files: DataFileReader,
    ) -> None:
        super().__init__(engine, files)
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._client = client

    def _key(self, incarnation: str, name: str = "") -> str:
        return f"{self.prefix}/{incarnation}/{name}"

    def _put(self, incarnation: str, records: Sequence[tuple[str, bytes]]) -> None:
        client = self._client()
        for name, body in records:
            key = self._key(incarnation, name)
            try:
                client.put_object(
                    Bucket=self.bucket, Key=key, Body=body, ContentType="application/json"
                )
            except Exception as exc:
                raise s3_error(exc, f"s3://{self.bucket}/{key}") from None

    def _listing(self, incarnation: str) -> dict[str, str]:
        prefix = self._key(incarnation)
        try:
            listing: dict[str, str] = {}
            pages = (
                self._client()
                .get_paginator("list_objects_v2")
                .paginate(Bucket=self.bucket, Prefix=prefix)
            )
            for page in pages:
                for item in page.get("Contents", ()):
                    if item["Key"].endswith(".json"):
                        name = item["Key"].removeprefix(prefix)
                        listing[name] = f"{item.get('ETag', '')}:{item.get('Size', 0)}"
            return listing
        except Exception as exc:
            raise s3_error(exc, f"s3://{self.bucket}/{prefix}") from None

    def _read(self, incarnation: str, names: Sequence[str]) -> list[bytes]:
        try:
            return self._read_keys([self._key(incarnation, name) for name in names])
        except Exception as exc:
            raise s3_error(exc, f"s3://{self.bucket}/{self._key(incarnation)}") from None

    def _read_keys(self, keys: list[str]) -> list[bytes]:
        client = self._client()

        def read(key: str) -> bytes:
            return bytes(client.get_object(Bucket=self.bucket, Key=key)["Body"].read())

        if len(keys) <= 1:
            return [read(k) for k in keys]
        with ThreadPoolExecutor(min(8, len(keys))) as pool:
            return list(pool.map(read, keys))
