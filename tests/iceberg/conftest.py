"""Fixtures for the registrar: SeaweedFS's Iceberg REST catalog and S3, segments, configs."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lake_iceberg.registrar.config import RegistrarConfig, parse_config
from lake_iceberg.registrar.segments import write_segment
from lake_iceberg.registrar.ship import Shipper, ShipReport, s3_client
from tools.lake_testing.iceberg import SeaweedIceberg

PIPELINE = "edge-capture"


@pytest.fixture(scope="session")
def iceberg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedIceberg]:
    """One ``weed mini`` (S3 + Iceberg REST catalog + warehouse) for the session."""
    server = SeaweedIceberg(tmp_path_factory.mktemp("seaweed-iceberg")).start()
    try:
        yield server
    finally:
        server.stop()


def field(name: str, kind: pa.DataType, field_id: int) -> pa.Field:
    return pa.field(name, kind, metadata={"PARQUET:field_id": str(field_id)})


@dataclass
class Lane:
    """One test's pipeline: its segment directory, bucket, namespace and S3 client."""

    server: SeaweedIceberg
    root: Path
    bucket: str
    namespace: str

    @property
    def segments(self) -> Path:
        return self.root / "segments"

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/fleet"

    def s3(self) -> Any:
        s = self.server
        return s3_client(s.endpoint, s.region, s.access_key, s.secret_key)

    def write(
        self, dataset: str, name: str, schema: pa.Schema, columns: dict[str, list[Any]]
    ) -> Path:
        return write_segment(self.segments, dataset, name, pa.table(columns, schema=schema))

    def ship(self) -> ShipReport:
        return Shipper(self.segments, self.url, PIPELINE, self.s3()).ship()

    def raw_config(self, **overrides: Any) -> dict[str, Any]:
        s = self.server
        config: dict[str, Any] = {
            "from": str(self.segments),
            "pipeline": PIPELINE,
            "warehouse": s.warehouse,
            "catalog_uri": s.iceberg_endpoint,
            "catalog_credential": {"client_id": s.access_key, "client_secret": s.secret_key},
            "url": self.url,
            "namespace": self.namespace,
            "create_table": True,
            "store": {
                "endpoint": s.endpoint,
                "region": s.region,
                "allow_http": True,
                "access_key_id": s.access_key,
                "secret_access_key": s.secret_key,
            },
            "retry": {"initial": "20ms", "max": "200ms", "jitter": False},
        }
        for key, value in overrides.items():
            if value is None:
                config.pop(key, None)
            else:
                config[key] = value
        return config

    def config(self, **overrides: Any) -> RegistrarConfig:
        return parse_config(self.raw_config(**overrides))

    def table(self, dataset: str) -> Any:
        return self.server.catalog().load_table((*self.namespace.split("."), dataset))

    def table_exists(self, dataset: str) -> bool:
        return bool(self.server.catalog().table_exists((*self.namespace.split("."), dataset)))


@pytest.fixture
def lane(iceberg_server: SeaweedIceberg, tmp_path: Path, request: pytest.FixtureRequest) -> Lane:
    slug = re.sub(r"[^a-z0-9]", "", request.node.name.lower())[:24] + os.urandom(3).hex()
    bucket = f"seg-{slug}"
    iceberg_server.create_bucket(bucket)
    (tmp_path / "segments").mkdir()
    return Lane(server=iceberg_server, root=tmp_path, bucket=bucket, namespace=f"robotics.{slug}")


def data_files(table: Any) -> list[str]:
    return sorted(task.file.file_path for task in table.scan().plan_files())


def segment_keys(table: Any) -> list[str]:
    keys = [s.summary.additional_properties.get("lake.segment-key") for s in table.snapshots()]
    return sorted(k for k in keys if k)


Writer = Callable[..., Path]
