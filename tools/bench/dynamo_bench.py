"""Commit throughput in cloud mode: Metasrv on dynalite + SeaweedFS vs raw DynamoDB.

Figures (each alternates Lake and its reference run by run, medians of several):

- ``dynamo_commit_one_table``: appends/s through a real ``lake meta`` in
  cloud mode (DoPut over the Metasrv wire client, 8 appends in flight on one
  table: each is an S3 data file, a Lance commit through the DynamoDB
  manifest table, and the registry's single-item conditional writes) against
  a raw loop of conditional UpdateItem version bumps on the same dynalite.
  Goal: ratio >= 0.5.
- ``dynamo_commit_8_tables``: the same with 8 tables in parallel (2 in
  flight each) against 8 raw loops in parallel.
- ``dynamo_commit_parallel_scaling``: 8-table appends/s over one-table
  appends/s (reported; > 1 means tables commit independently).
- ``dynamo_registry_commit``: the registry's own commit protocol alone
  (DynamoRegistry.commit_append in process, no Lance or S3) against the raw
  loop: what the no-transactions layout costs per commit. Goal: ratio >= 0.5.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa

from lake_core import protocol
from lake_core.ids import new_operation_id, operation_time_ms
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.schemas import schema_to_ipc
from tools.bench.harness import Figure, measure
from tools.lake_testing.dynalite import Dynalite
from tools.lake_testing.seaweed import SeaweedS3
from tools.lake_testing.servers import LakeProcess, free_port

SCHEMA = pa.schema([("id", pa.int64()), ("value", pa.float64())])
TABLES = [TableRef("bench", f"commits_{i}") for i in range(8)]
IN_FLIGHT = 8
BUCKET = "lake-bench"


def _batch(start: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"id": [start], "value": [start * 0.5]}, schema=SCHEMA)


def _dynamodb(dynalite: Dynalite) -> Any:
    import aioboto3

    return aioboto3.Session().client(
        "dynamodb",
        endpoint_url=dynalite.endpoint,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    )


async def _raw_loops(dynalite: Dynalite, table: str, count: int, loops: int) -> float:
    """``loops`` concurrent read-free compare-and-swap loops, ``count`` bumps in all."""
    async with _dynamodb(dynalite) as client:
        try:
            await client.create_table(
                TableName=table,
                BillingMode="PAY_PER_REQUEST",
                AttributeDefinitions=[
                    {"AttributeName": "pk", "AttributeType": "S"},
                    {"AttributeName": "sk", "AttributeType": "S"},
                ],
                KeySchema=[
                    {"AttributeName": "pk", "KeyType": "HASH"},
                    {"AttributeName": "sk", "KeyType": "RANGE"},
                ],
            )
            await asyncio.sleep(1.0)
        except Exception as exc:
            if "ResourceInUse" not in type(exc).__name__ and "ResourceInUse" not in str(exc):
                raise

        async def loop(key: str, bumps: int) -> None:
            item = {"pk": {"S": key}, "sk": {"S": "head"}}
            await client.put_item(TableName=table, Item={**item, "v": {"N": "0"}})
            for version in range(bumps):
                await client.update_item(
                    TableName=table,
                    Key=item,
                    UpdateExpression="SET v = :next",
                    ConditionExpression="v = :current",
                    ExpressionAttributeValues={
                        ":next": {"N": str(version + 1)},
                        ":current": {"N": str(version)},
                    },
                )

        started = time.perf_counter()
        await asyncio.gather(*(loop(uuid.uuid4().hex, count // loops) for _ in range(loops)))
        return count / (time.perf_counter() - started)


async def _lake_rate(meta_addr: str, tables: list[TableRef], count: int, in_flight: int) -> float:
    """``count`` appends spread over ``tables``, ``in_flight`` writers per table."""
    async with MetaClient(f"http://{meta_addr}", timeout_s=120) as client:
        queues: dict[TableRef, list[int]] = {t: [] for t in tables}
        for i in range(count):
            queues[tables[i % len(tables)]].append(i)

        async def writer(table: TableRef) -> None:
            rows = queues[table]
            while rows:
                row = rows.pop()
                command = protocol.AppendCommand(table=table, operation_id=new_operation_id())
                await client.append(command, SCHEMA, [_batch(row)])

        started = time.perf_counter()
        await asyncio.gather(*(writer(t) for t in tables for _ in range(in_flight)))
        return count / (time.perf_counter() - started)


async def _registry_rate(dynalite: Dynalite, count: int) -> float:
    from lake_metasrv.registry.base import AppendCommit, TableRecord
    from lake_metasrv.registry.dynamo import DynamoRegistry

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    registry = DynamoRegistry(
        f"bench_registry_{uuid.uuid4().hex[:8]}", endpoint_url=dynalite.endpoint, region="us-east-1"
    )
    await registry.open()
    try:
        table = TableRef("bench", "registry")
        await registry.create_table(
            TableRecord(
                table=table,
                incarnation="inc",
                location="s3://bucket/bench/registry.lance",
                engine="lance",
                schema_ipc=schema_to_ipc(SCHEMA),
                version=0,
                engine_version=1,
                created_at_ms=0,
            )
        )
        started = time.perf_counter()
        for version in range(count):
            op = new_operation_id()
            await registry.commit_append(
                AppendCommit(
                    table=table,
                    incarnation="inc",
                    expected_version=version,
                    engine_version=version + 2,
                    operation_id=op,
                    operation_time_ms=operation_time_ms(op),
                    committed_at_ms=0,
                )
            )
        return count / (time.perf_counter() - started)
    finally:
        await registry.close()


def _start_meta(root: Path, s3: SeaweedS3, dynalite: Dynalite) -> LakeProcess:
    addr = f"127.0.0.1:{free_port()}"
    env = {
        **s3.env(),
        "AWS_ENDPOINT_URL_DYNAMODB": dynalite.endpoint,
        "LAKE_CLOUD_MODE": "true",
        "LAKE_S3_BUCKET": BUCKET,
        "LAKE_TABLE_PREFIX": "bench",
    }
    process = LakeProcess(
        "meta", ["-m", "lake_metasrv", "--addr", addr], addr, root / "meta.log", env
    )
    return process.start()


def run(quick: bool) -> list[Figure]:
    one_count = 40 if quick else 120
    many_count = 80 if quick else 320
    raw_count = 400 if quick else 1500
    runs = 3 if quick else 5
    with tempfile.TemporaryDirectory(prefix="lake-bench-dynamo-") as tmp:
        root = Path(tmp)
        (root / "s3").mkdir()
        s3 = SeaweedS3(root / "s3").start()
        dynalite = Dynalite(root).start()
        meta: LakeProcess | None = None
        try:
            s3.create_bucket(BUCKET)
            meta = _start_meta(root, s3, dynalite)
            addr = meta.addr

            async def create() -> None:
                async with MetaClient(f"http://{addr}") as admin:
                    for table in TABLES:
                        await admin.create_table(table, SCHEMA)

            asyncio.run(create())
            figures = [
                measure(
                    "dynamo_commit_one_table",
                    lambda: asyncio.run(_lake_rate(addr, TABLES[:1], one_count, IN_FLIGHT)),
                    lambda: asyncio.run(_raw_loops(dynalite, "bench_raw", raw_count, 1)),
                    unit="appends/s",
                    goal="ratio >= 0.5 (Lake appends/s over raw conditional puts/s)",
                    ratio_of=lambda lake, ref: lake / ref,
                    met=lambda lake, ref, ratio: ratio >= 0.5,
                    threshold=lambda lake, ref: 0.5,
                    runs=runs,
                ),
                measure(
                    "dynamo_commit_8_tables",
                    lambda: asyncio.run(_lake_rate(addr, TABLES, many_count, 2)),
                    lambda: asyncio.run(_raw_loops(dynalite, "bench_raw", raw_count, 8)),
                    unit="appends/s",
                    goal="report (8 tables in parallel vs 8 raw loops in parallel)",
                    ratio_of=lambda lake, ref: lake / ref,
                    met=lambda lake, ref, ratio: True,
                    runs=runs,
                ),
                measure(
                    "dynamo_commit_parallel_scaling",
                    lambda: asyncio.run(_lake_rate(addr, TABLES, many_count, 2)),
                    lambda: asyncio.run(_lake_rate(addr, TABLES[:1], one_count, IN_FLIGHT)),
                    unit="appends/s (8 tables vs 1 table)",
                    goal="report (> 1: tables commit independently)",
                    ratio_of=lambda lake, ref: lake / ref,
                    met=lambda lake, ref, ratio: ratio > 1,
                    threshold=lambda lake, ref: 1.0,
                    runs=runs,
                ),
                measure(
                    "dynamo_registry_commit",
                    lambda: asyncio.run(_registry_rate(dynalite, raw_count // 4)),
                    lambda: asyncio.run(_raw_loops(dynalite, "bench_raw", raw_count, 1)),
                    unit="commits/s",
                    goal="ratio >= 0.5 (registry commit protocol over raw conditional puts)",
                    ratio_of=lambda lake, ref: lake / ref,
                    met=lambda lake, ref, ratio: ratio >= 0.5,
                    threshold=lambda lake, ref: 0.5,
                    runs=runs,
                ),
            ]
            return figures
        finally:
            if meta is not None:
                meta.stop()
            dynalite.stop()
            s3.stop()
