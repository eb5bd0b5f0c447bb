"""Registrar throughput: shipped segments registered per second, against raw pyiceberg.

Lake's side is the registrar (``Registrar.run_once``) registering every
shipped segment of the segment catalog into an existing, empty table: one
footer read (two ranged GETs) and one fast-append commit per segment, with
the idempotency key in each snapshot summary. The reference is a raw
pyiceberg loop over the same objects and the same catalog, one
``table.add_files([path])`` commit per file (which also reads each footer,
and guards against duplicates its own way: it refuses a path the table
already references).
Both sides start from a fresh table with the same schema, created outside the
timing, and alternate run by run. Goal: Lake >= 0.8x the reference.

The servers are a SeaweedFS ``weed mini`` (S3 plus its Iceberg REST catalog)
started here on loopback.
"""

from __future__ import annotations

import itertools
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from lake_core.logs import configure_logging
from lake_iceberg.registrar.config import parse_config
from lake_iceberg.registrar.schema_merge import file_schema
from lake_iceberg.registrar.segments import SegmentCatalog, write_segment
from lake_iceberg.registrar.service import Registrar
from lake_iceberg.registrar.ship import Shipper, s3_client
from tools.bench.harness import Figure, at_least, measure, pairs_for, warmup_for
from tools.lake_testing.iceberg import SeaweedIceberg

BUCKET = "bench-segments"
URL = f"s3://{BUCKET}/fleet"
PIPELINE = "bench"
DATASET = "pose"
SCHEMA = pa.schema(
    [
        pa.field("robot", pa.string(), metadata={"PARQUET:field_id": "1"}),
        pa.field("t", pa.int64(), metadata={"PARQUET:field_id": "2"}),
        pa.field("x", pa.float64(), metadata={"PARQUET:field_id": "3"}),
    ]
)


def _segments(root: Path, count: int) -> None:
    for i in range(count):
        rows = {
            "robot": [f"r{i % 7}"] * 16,
            "t": list(range(i * 16, i * 16 + 16)),
            "x": [i * 0.5] * 16,
        }
        write_segment(root, DATASET, f"{i:06d}", pa.table(rows, schema=SCHEMA))


def _config(server: SeaweedIceberg, segments: Path, namespace: str) -> Any:
    return parse_config(
        {
            "from": str(segments),
            "pipeline": PIPELINE,
            "warehouse": server.warehouse,
            "catalog_uri": server.iceberg_endpoint,
            "catalog_credential": {
                "client_id": server.access_key,
                "client_secret": server.secret_key,
            },
            "url": URL,
            "namespace": namespace,
            "create_table": False,
            "store": {
                "endpoint": server.endpoint,
                "region": server.region,
                "allow_http": True,
                "access_key_id": server.access_key,
                "secret_access_key": server.secret_key,
            },
        }
    )


def run(quick: bool) -> list[Figure]:
    count = 40 if quick else 200
    # The registrar logs every segment; stdout carries only the figure.
    configure_logging(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="lake-bench-registrar-") as tmp:
        root = Path(tmp)
        server = SeaweedIceberg(root / "seaweed").start()
        try:
            server.create_bucket(BUCKET)
            segments = root / "segments"
            _segments(segments, count)
            client = s3_client(server.endpoint, server.region, server.access_key, server.secret_key)
            Shipper(segments, URL, PIPELINE, client).ship()
            with SegmentCatalog(segments) as catalog:
                entries = catalog.entries(PIPELINE)
            catalog = server.catalog("bench")
            schema = file_schema(SCHEMA, DATASET)
            serial = itertools.count()

            def fresh_table(side: str) -> tuple[str, Any]:
                namespace = f"bench.{side}{next(serial)}"
                catalog.create_namespace_if_not_exists(tuple(namespace.split(".")))
                table = catalog.create_table(
                    (*namespace.split("."), DATASET), schema, properties={"format-version": "2"}
                )
                return namespace, table

            def lake() -> float:
                namespace, _ = fresh_table("lake")
                registrar = Registrar(_config(server, segments, namespace))
                start = time.perf_counter()
                progress = registrar.run_once()
                elapsed = time.perf_counter() - start
                assert progress.registered == count, progress
                return count / elapsed

            def reference() -> float:
                _, table = fresh_table("ref")
                start = time.perf_counter()
                for entry in entries:
                    table.add_files(
                        [entry.uri], snapshot_properties={"lake.segment-key": entry.object_key}
                    )
                elapsed = time.perf_counter() - start
                assert len(table.snapshots()) == count
                return count / elapsed

            return [
                measure(
                    "registrar",
                    lake,
                    reference,
                    unit="segments/s",
                    goal=at_least(0.8, ">= 0.8x raw pyiceberg add_files (one commit per file)"),
                    pairs=pairs_for(quick),
                    warmup=warmup_for(quick),
                )
            ]
        finally:
            server.stop()
