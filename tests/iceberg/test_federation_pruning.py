"""Manifest-statistics pruning agrees with the unpruned scan it replaces.

A differential test over generated filters (every rendered operator, NULLs,
NaN, infinities, -0.0, out-of-range and fractional literals, unicode): the
rows Lake returns through its pruned provider equal, as multisets, the rows
DataFusion returns from the same pinned snapshot unpruned. And pruning
really happens: a selective filter reads fewer data files.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from datafusion import SessionContext
from datafusion.catalog import Table
from datafusion.expr import Filter, TableScan
from pyiceberg.io import load_file_io
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import DataScan
from pyiceberg.transforms import IdentityTransform, TruncateTransform
from pyiceberg.types import BooleanType, DoubleType, IntegerType, LongType, NestedField, StringType

from lake_core.principal import DEV_PRINCIPAL
from lake_iceberg.federation import IcebergFederation
from lake_iceberg.federation.filters import to_iceberg_filter
from lake_query.planning import Planner
from tools.lake_testing.iceberg import (
    SeaweedIceberg,
    direct_and_iceberg_rust,
    in_process_federation,
)

pytestmark = [pytest.mark.iceberg, pytest.mark.s3]

NAMESPACE = "pruning"
FILES = 8
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "small", IntegerType(), required=False),
    NestedField(3, "name", StringType(), required=False),
    NestedField(4, "x", DoubleType(), required=False),
    NestedField(5, "ok", BooleanType(), required=False),
)
NAMES = ["alpha", "beta", "gamma", "Ωmega", "", "zeta", "a'b", "ünï"]
SPECIAL_FLOATS = [math.nan, math.inf, -math.inf, -0.0, 0.0, None]


def _rows(part: int) -> list[dict[str, Any]]:
    rng = random.Random(part)
    rows = []
    for i in range(40):
        n = part * 40 + i
        rows.append(
            {
                "id": n,
                "small": None if i % 11 == 0 else part * 10 + i % 10,
                "name": None if i % 13 == 0 else NAMES[(part + i % 2) % len(NAMES)],
                "x": rng.choice(SPECIAL_FLOATS) if i % 7 == 0 else part + rng.random(),
                "ok": None if i % 9 == 0 else bool((part + i) % 2),
            }
        )
    return rows


@pytest.fixture(scope="module")
def federation(iceberg_server: SeaweedIceberg) -> Iterator[IcebergFederation]:
    catalog = iceberg_server.catalog()
    catalog.create_namespace(NAMESPACE)
    table = catalog.create_table((NAMESPACE, "t"), schema=SCHEMA)
    arrow = SCHEMA.as_arrow()
    for part in range(FILES):  # one data file per part: ranges that statistics separate
        table.append(pa.Table.from_pylist(_rows(part), schema=arrow))
    with in_process_federation(iceberg_server, NAMESPACE) as fed:
        yield fed


def _literal(rng: random.Random, column: str) -> str:
    if column in ("id", "small"):
        return rng.choice(
            [
                str(rng.randint(-5, FILES * 40 + 5)),
                "2147483648",
                "-9223372036854775808",
                "3.5",
                "NULL",
            ]
        )
    if column == "name":
        return rng.choice([f"'{n}'".replace("a'b", "a''b") for n in NAMES] + ["'zzz'", "NULL"])
    if column == "x":
        return rng.choice(
            ["0.0", "-0.0", "2.5", "'NaN'::double", "'inf'::double", "3", "7.99", "NULL"]
        )
    return rng.choice(["true", "false", "NULL"])


def _predicate(rng: random.Random, depth: int = 0) -> str:
    column = rng.choice(["id", "small", "name", "x", "ok"])
    roll = rng.random()
    if depth < 2 and roll < 0.2:
        op = rng.choice(["AND", "OR"])
        return f"({_predicate(rng, depth + 1)} {op} {_predicate(rng, depth + 1)})"
    if depth < 2 and roll < 0.28:
        return f"NOT ({_predicate(rng, depth + 1)})"
    if roll < 0.36:
        return f"{column} IS {rng.choice(['', 'NOT '])}NULL"
    if roll < 0.46:
        values = ", ".join(_literal(rng, column) for _ in range(rng.randint(1, 4)))
        return f"{column} {rng.choice(['', 'NOT '])}IN ({values})"
    op = rng.choice(["=", "!=", "<", "<=", ">", ">="])
    if rng.random() < 0.3:
        return f"{_literal(rng, column)} {op} {column}"
    return f"{column} {op} {_literal(rng, column)}"


def _grid() -> list[str]:
    """Every operator on every rendered type, at and around the files' boundaries."""
    literals = {"id": ["0", "40", "200", "320"], "small": ["11", "52"], "name": ["'beta'", "'zzz'"]}
    return [
        f"{column} {op} {value}"
        for column, values in literals.items()
        for value in values
        for op in ("=", "!=", "<", "<=", ">", ">=")
    ] + ["ok = true", "ok != true"]


def _multiset(table: pa.Table) -> Counter[str]:
    def key(row: dict[str, Any]) -> str:
        return json.dumps({k: (repr(v) if isinstance(v, float) else v) for k, v in row.items()})

    return Counter(key(r) for r in table.to_pylist())


def test_pruned_scans_agree_with_unpruned_scans(federation: IcebergFederation) -> None:
    planner = Planner(lambda ref: None, external=[federation])
    table = federation.plan(NAMESPACE, "t")
    reference = SessionContext()
    reference.register_table("t", Table(table.provider()))
    rng = random.Random(20261201)
    checked = 0
    for where in [*_grid(), *(_predicate(rng) for _ in range(30))]:
        try:
            expected = reference.sql(f"SELECT * FROM t WHERE {where}").to_arrow_table()
        except Exception:
            continue  # not valid SQL for DataFusion (a type it refuses to compare)
        planned = planner.plan(f"SELECT * FROM iceberg.{NAMESPACE}.t WHERE {where}", DEV_PRINCIPAL)
        got = pa.Table.from_batches(
            list(planner.execute(planned.spec, DEV_PRINCIPAL)), expected.schema
        )
        assert _multiset(got) == _multiset(expected), where
        checked += 1
    assert checked >= 70
    # Execution really went through pruned copies (a local manifest list per filter).
    assert len(list(federation.files.root.glob("*/manifest-list.avro"))) >= 10


def _files_read(federation: IcebergFederation, where: str) -> int:
    """Data files the pruned copy lists for ``where`` (what the provider then reads)."""
    table = federation.plan(NAMESPACE, "t")
    ctx = SessionContext()
    ctx.register_table("t", Table(table.provider()))
    filters = scan_filters_local(ctx.sql(f"SELECT * FROM t WHERE {where}")).get("t", [])
    assert filters, "the filter sits above the scan"
    pinned = table._pinned
    assert pinned is not None
    row_filter = to_iceberg_filter(filters, SCHEMA.as_arrow())
    io = load_file_io(pinned._file_io, pinned._location)
    scan = DataScan(pinned.metadata, io, row_filter=row_filter, snapshot_id=pinned.snapshot_id)
    return len(list(scan.plan_files()))


def scan_filters_local(df: Any) -> dict[Any, list[Any]]:
    """scan_filters for a table registered without a catalog (the reference session)."""
    found: dict[Any, list[Any]] = {}

    def walk(plan: Any) -> None:
        node = plan.to_variant()
        below = node.input() if isinstance(node, Filter) else None
        below = below[0] if isinstance(below, list) else below
        if below is not None and isinstance(below.to_variant(), TableScan):
            found.setdefault("t", []).append(node.predicate())
        for child in plan.inputs():
            walk(child)

    walk(df.optimized_logical_plan())
    return found


def test_a_selective_filter_reads_fewer_files(federation: IcebergFederation) -> None:
    assert _files_read(federation, "id < 40") == 1
    assert _files_read(federation, "id >= 200 AND id < 240") == 1
    assert _files_read(federation, "small IN (11, 52)") == 2
    # Floats are never rendered: DataFusion orders NaN above 1000, Iceberg's bounds do not.
    assert _files_read(federation, "x > 1000") == FILES
    assert _files_read(federation, "name || 'x' = 'alphax'") == FILES  # unrendered: no pruning


@pytest.mark.parametrize(
    "columns", ["*", "small, name", "x, ok, id", "name"], ids=["all", "two", "reordered", "one"]
)
def test_plain_projections_read_directly_agree_with_iceberg_rust(
    federation: IcebergFederation, columns: str
) -> None:
    """The plug-in's pyarrow reader returns iceberg-rust's rows and schema, by field id."""
    got, expected = direct_and_iceberg_rust(federation, NAMESPACE, "t", columns)
    assert got.schema == expected.schema
    assert got.num_rows == FILES * 40
    assert _multiset(got) == _multiset(expected)


def test_a_filter_over_a_null_identity_partition_is_answered_unpruned(
    iceberg_server: SeaweedIceberg, federation: IcebergFederation
) -> None:
    """pyiceberg cannot evaluate ``name <= 'alpha'`` against a NULL partition value
    (a TypeError); Lake then scans unpruned instead of failing the statement."""
    spec = PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "name"))
    table = iceberg_server.catalog().create_table(
        (NAMESPACE, "nullpart"), SCHEMA, partition_spec=spec
    )
    table.append(pa.Table.from_pylist(_rows(0), schema=SCHEMA.as_arrow()))  # NULL names included
    planner = Planner(lambda ref: None, external=[federation])
    where = "NOT (name <= 'alpha' AND id < 5)"
    planned = planner.plan(
        f"SELECT id FROM iceberg.{NAMESPACE}.nullpart WHERE {where}", DEV_PRINCIPAL
    )
    got = sorted(
        r["id"] for b in planner.execute(planned.spec, DEV_PRINCIPAL) for r in b.to_pylist()
    )
    expected = sorted(
        r["id"]
        for r in _rows(0)
        if (r["name"] is not None and not (r["name"] <= "alpha" and r["id"] < 5))
        or (r["name"] is None and r["id"] >= 5)
    )
    assert got == expected


@pytest.mark.parametrize(("kind", "low"), [(IntegerType(), -(2**31)), (LongType(), -(2**63))])
def test_a_truncate_partition_that_wraps_near_the_minimum_loses_no_rows(
    iceberg_server: SeaweedIceberg, federation: IcebergFederation, kind: Any, low: int
) -> None:
    """Iceberg's truncate wraps near an int's minimum: ``truncate[10](-2**31)`` is
    ``2**31 - 2``, so those values sit in the highest partition. Pruning by value
    skipped that file: ``v < 10`` lost them, ``v = -2**31`` returned nothing."""
    schema = Schema(NestedField(1, "v", kind, required=False))
    spec = PartitionSpec(PartitionField(1, 1000, TruncateTransform(10), "v_trunc"))
    name = f"wrapping_{kind}"
    table = iceberg_server.catalog().create_table((NAMESPACE, name), schema, partition_spec=spec)
    values = [low, low + 1, low + 9, low + 10, -5, 3, 15, None]
    table.append(pa.Table.from_pylist([{"v": v} for v in values], schema=schema.as_arrow()))
    partitions = [task.file.partition[0] for task in table.scan().plan_files()]
    assert max(p for p in partitions if p is not None) > 2**30  # the minimum's, wrapped
    planner = Planner(lambda ref: None, external=[federation])
    for where, keep in [
        ("v < 10", lambda v: v < 10),
        (f"v = {low}", lambda v: v == low),
        (f"v <= {low + 9}", lambda v: v <= low + 9),
        (f"v IN ({low}, 3)", lambda v: v in (low, 3)),
        (f"NOT (v > {low})", lambda v: not v > low),
        ("v > 10", lambda v: v > 10),
    ]:
        planned = planner.plan(
            f"SELECT v FROM iceberg.{NAMESPACE}.{name} WHERE {where}", DEV_PRINCIPAL
        )
        got = [r["v"] for b in planner.execute(planned.spec, DEV_PRINCIPAL) for r in b.to_pylist()]
        assert sorted(got) == sorted(v for v in values if v is not None and keep(v)), where
