"""The shipper: upload finalized segments to S3, then record them in the segment catalog.

The upload happens first and the ``Uploaded`` entry only after it succeeded,
so the catalog never names a missing object. A crash between the two
re-ships the same bytes to the same key on the next run (an overwrite with
identical content), and the entry is recorded once (``UNIQUE`` key).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import structlog

from lake_iceberg.registrar.segments import SegmentCatalog, Uploaded, finalized_segments

__all__ = ["ShipReport", "Shipper", "s3_client"]

log = structlog.get_logger("lake.segments.ship")

_MAGIC = b"PAR1"
_CHUNK = 8 * 1024 * 1024


def s3_client(
    endpoint: str | None = None,
    region: str | None = None,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
) -> Any:
    """A boto3 S3 client (path-style; checksums only where S3 requires them)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=region or os.environ.get("AWS_REGION") or "us-east-1",
        aws_access_key_id=access_key_id,
        aws_secret_access_key=secret_access_key,
        config=Config(
            s3={"addressing_style": "path"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            retries={"max_attempts": 5, "mode": "standard"},
        ),
    )


@dataclass
class ShipReport:
    shipped: list[Uploaded] = field(default_factory=list)
    skipped: int = 0


def _digest(path: Path) -> tuple[int, str]:
    """Size and SHA-256 of a finalized segment, refusing a file that is not whole Parquet."""
    sha = hashlib.sha256()
    size = 0
    with path.open("rb") as file:
        head = file.read(4)
        sha.update(head)
        size += len(head)
        while chunk := file.read(_CHUNK):
            sha.update(chunk)
            size += len(chunk)
        file.seek(max(0, size - 4))
        tail = file.read(4)
    if head != _MAGIC or tail != _MAGIC or size < 12:
        raise ValueError(f"{path} is not a complete Parquet file")
    return size, sha.hexdigest()


class Shipper:
    """Ships ``DIR/<dataset>/<segment>.parquet`` to ``{url}/lake/v1/{pipeline}/{dataset}/``."""

    def __init__(
        self, directory: str | os.PathLike[str], url: str, pipeline: str, client: Any
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError("--to: expected s3://bucket/prefix")
        self.directory = Path(directory)
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/")
        self.pipeline = pipeline
        self.client = client

    def object_key(self, dataset: str, segment: str) -> str:
        parts = [self.prefix, "lake", "v1", self.pipeline, dataset, segment]
        return "/".join(p for p in parts if p)

    def ship(self) -> ShipReport:
        report = ShipReport()
        with SegmentCatalog(self.directory) as catalog:
            for dataset, path in finalized_segments(self.directory):
                key = self.object_key(dataset, path.name)
                if catalog.get(self.bucket, key) is not None:
                    report.skipped += 1
                    continue
                size, sha256 = _digest(path)
                self._upload(path, key, sha256)
                entry = Uploaded(
                    bucket=self.bucket,
                    object_key=key,
                    pipeline=self.pipeline,
                    dataset=dataset,
                    segment=path.name,
                    size=size,
                    sha256=sha256,
                )
                catalog.record(entry)
                report.shipped.append(entry)
                log.info("segment.shipped", dataset=dataset, key=key, size=size)
        return report

    def _upload(self, path: Path, key: str, sha256: str) -> None:
        from boto3.s3.transfer import TransferConfig

        self.client.upload_file(
            str(path),
            self.bucket,
            key,
            ExtraArgs={"Metadata": {"sha256": sha256}},
            Config=TransferConfig(multipart_threshold=64 * 1024 * 1024, use_threads=False),
        )
