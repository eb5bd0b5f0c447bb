"""Key lookups planned without DataFusion give exactly what DataFusion's planning gives.

Seeded generated statements, near the lookup shape and just outside it
(unknown, duplicate, upper-case and keyword names, ``*``, other catalogs,
hidden namespaces, missing tables, key columns of every plain type, extreme
and out-of-range literals, leading zeros, odd spacing and keyword case,
trailing semicolons; ``IN`` lists that are empty, of one value, unordered,
with duplicates, negative numbers, NULLs, casts and mixed types, ``NOT IN``,
and lists of thousands of keys), are planned by one Planner with lookups on
and one with them off, over tables with NULL and duplicate keys, field
metadata, two appended versions and a pin moved between planning and
execution. Both must agree on the error (class and text) or on the schema,
the pinned set, the partitions and the direct scan; then both plans run and
their rows are compared as multisets. A mutated lookup rule (``=`` or an IN
list) must make the comparison fail.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import datafusion
import pyarrow as pa
import pytest

from lake_core.principal import DEV_PRINCIPAL, Principal
from lake_query.planning import Planner, lookups
from lake_query.planning.spec import PlannedQuery

from .conftest import ROBOTS_ONLY, LocalCatalog

SEED = 20261201
GENERATED = 700


def _keys(start: int) -> pa.Table:
    ids = [0, 1, -1, 7, 7, None, 2**63 - 1, -(2**63) + 1, 42, 3 + start]
    n = len(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "k2": pa.array([None, 5, 5, 6, None, 1, 2, 3, 4, start], pa.int64()),
            "i32": pa.array([0, 1, -1, 7, 7, None, 2**31 - 1, 3, 4, 5], pa.int32()),
            "u8": pa.array([0, 1, 255, 7, 7, None, 3, 4, 5, 6], pa.uint8()),
            "f64": pa.array([0.0, 1.0, -1.0, 7.0, float("nan"), None, 1e300, -0.0, 4.0, 5.0]),
            "s": pa.array(["a", "b", None, "7", "it's", "", "ž", "Z", "x", "y"]),
            "ok": pa.array([True, False, None, True, True, False, True, None, False, True]),
        }
    ).slice(0, n)


def _with_field_metadata(table: pa.Table) -> pa.Table:
    fields = [
        f.with_metadata({b"lake.note": b"kept"}) if f.name == "s" else f for f in table.schema
    ]
    return table.cast(pa.schema(fields))


COLUMNS = ["id", "k2", "i32", "u8", "f64", "s", "ok", "nope", "ID", "from", "select"]
KEYS = [
    "id",
    "id",
    "id",
    "id",
    "id",
    "k2",
    "k2",
    "i32",
    "u8",
    "f64",
    "s",
    "ok",
    "nope",
    "ID",
    "where",
]
TABLES = [
    "robots.keys",
    "robots.keys",
    "robots.keys",
    "robots.keys",
    "lake.robots.keys",
    "keys",
    "robots.missing",
    "secret.keys",
    "other.robots.keys",
    "ROBOTS.keys",
    "robots.KEYS",
    '"robots".keys',
]
LITERALS = [
    "0",
    "1",
    "-1",
    "7",
    "42",
    "5",
    "007",
    "-0",
    "9223372036854775807",
    "-9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
    "99999999999999999999",
    "2147483648",
    "255",
    "256",
    "3",
    "13",
    "1.0",
    "'7'",
    "NULL",
]


def _in_list(rng: random.Random) -> str:
    """`` IN (...)`` around literals: mostly integers, sometimes anything in LITERALS."""
    pool = LITERALS[:17] * 8 + LITERALS  # mostly integers, some NULLs, floats, strings
    values = [rng.choice(pool) for _ in range(rng.choice([0, 1, 1, 2, 3, 5, 30]))]
    comma = rng.choice([", ", ",", " , "])
    inside = rng.choice(["", "", " "])
    word = rng.choice([" IN ", " in ", " IN", " NOT IN ", "\tIN "])
    return f"{word}({inside}{comma.join(values)}{inside})"


def _statement(rng: random.Random) -> str:
    picked = rng.sample(COLUMNS[:7], rng.randint(1, 4))
    if rng.random() < 0.15:
        picked.append(rng.choice(COLUMNS))  # maybe unknown, duplicate or a keyword
    gap = rng.choice([" ", "  ", "\n", "\t "])
    select = rng.choice(["SELECT", "select", "Select"])
    where = rng.choice(["WHERE", "where"])
    columns = rng.choice([", ", ",", " ,"]).join(picked)
    if rng.random() < 0.2:
        columns = rng.choice(["*", "*", "* ", "*, id"])
    op = rng.choice(["=", "=", "=", "=", " = ", "==", ">="])
    tail = rng.choice(["", "", "", "", "", " ", ";", " LIMIT 1", "\n"])
    table = rng.choice(TABLES)
    key = rng.choice(KEYS)
    condition = f"{op}{rng.choice(LITERALS)}" if rng.random() < 0.5 else _in_list(rng)
    return f"{select}{gap}{columns}{gap}FROM {table}{gap}{where} {key}{condition}{tail}"


def statements() -> list[str]:
    rng = random.Random(SEED)
    many = ", ".join(str((i * 7919) % 5000 - 2500) for i in range(3000))
    named = [
        "SELECT id, f64 FROM robots.keys WHERE id = 7",
        "SELECT * FROM robots.keys WHERE id = 7",
        "SELECT id FROM robots.keys WHERE id = 8",
        "SELECT id, s FROM lake.robots.keys WHERE id = -1",
        "SELECT s FROM robots.keys WHERE k2 = 5",
        "SELECT * FROM robots.keys WHERE id IN (7, 0, 7, -1, 9223372036854775807)",
        "SELECT id, k2 FROM robots.keys WHERE k2 IN (5)",
        "SELECT * FROM robots.keys WHERE id IN ()",
        "SELECT * FROM robots.keys WHERE id IN (7, NULL)",
        "SELECT * FROM robots.keys WHERE id IN (7, CAST(1 AS BIGINT))",
        "SELECT * FROM robots.keys WHERE id IN (7, 1.0)",
        f"SELECT id, s FROM robots.keys WHERE id IN ({many})",
    ]
    return named + sorted({_statement(rng) for _ in range(GENERATED * 2)})[:GENERATED]


def _rows(table: pa.Table) -> Counter[str]:
    return Counter(repr(row) for row in table.to_pylist())


def _plan(planner: Planner, sql: str, principal: Principal) -> PlannedQuery | str:
    try:
        return planner.plan(sql, principal)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def _run(planner: Planner, planned: PlannedQuery, principal: Principal) -> pa.Table:
    stream = planner.execute(planned.spec, principal)
    return pa.Table.from_batches(list(stream), schema=stream.schema)


def _outcome(planner: Planner, planned: PlannedQuery, principal: Principal) -> Counter[str] | str:
    try:
        return _rows(_run(planner, planned, principal))
    except Exception as exc:  # DataFusion may refuse a plan only when it runs
        return f"{type(exc).__name__}: {exc}"


def _catalog(catalog: LocalCatalog) -> None:
    catalog.create("robots.keys", _with_field_metadata(_keys(0)))
    catalog.append("robots.keys", _with_field_metadata(_keys(100)))  # duplicates across versions
    catalog.create("public.keys", _keys(0))
    catalog.create("secret.keys", _keys(0))


def run_differential(catalog: LocalCatalog) -> tuple[list[str], int, int, int]:
    """(disagreements, statements planned as lookups, of which IN lists, statements planned)."""
    _catalog(catalog)
    fast = Planner(catalog.resolve, catalog.refs)
    slow = Planner(catalog.resolve, catalog.refs, lookups=False)
    wrong: list[str] = []
    taken = listed = planned_ok = 0
    for principal in (DEV_PRINCIPAL, ROBOTS_ONLY):
        for sql in statements():
            got, want = _plan(fast, sql, principal), _plan(slow, sql, principal)
            if isinstance(got, str) or isinstance(want, str):
                if got != want:
                    wrong.append(f"{sql!r}: {got!r} vs {want!r}")
                continue
            planned_ok += 1
            parsed = lookups.parse_lookup(sql)
            is_lookup = parsed is not None and fast._direct.recall(got.spec) is not None
            taken += is_lookup
            listed += is_lookup and parsed is not None and parsed.in_list
            if got.spec != want.spec or got.partitions != want.partitions:
                wrong.append(f"{sql!r}: plans differ")
                continue
            if not got.schema.equals(want.schema, check_metadata=True):
                wrong.append(f"{sql!r}: schema {got.schema} vs {want.schema}")
                continue
            if _outcome(fast, got, principal) != _outcome(slow, want, principal):
                wrong.append(f"{sql!r}: rows differ")
                continue
            if is_lookup and fast._direct.recall(got.spec) != slow._direct.recall(want.spec):
                wrong.append(f"{sql!r}: direct scans differ")
    return wrong, taken, listed, planned_ok


def test_lookups_agree_with_datafusion_planning(catalog: LocalCatalog) -> None:
    wrong, taken, listed, planned = run_differential(catalog)
    assert wrong == []
    print(f"lookups: {taken} ({listed} IN lists) of {planned} planned statements")
    assert taken >= 100
    assert listed >= 40
    assert planned > 200


def test_a_pin_moved_after_planning_is_not_followed(catalog: LocalCatalog) -> None:
    _catalog(catalog)
    planner = Planner(catalog.resolve, catalog.refs)
    planned = planner.plan("SELECT id, k2 FROM robots.keys WHERE id = 7", DEV_PRINCIPAL)
    assert planner._direct.recall(planned.spec) is not None
    catalog.append("robots.keys", _with_field_metadata(_keys(200)))
    assert _run(planner, planned, DEV_PRINCIPAL).num_rows == 4  # two of each pinned version
    again = planner.plan("SELECT id, k2 FROM robots.keys WHERE id = 7", DEV_PRINCIPAL)
    assert _run(planner, again, DEV_PRINCIPAL).num_rows == 6


#: Wrong renderings of a lookup's filter: ``=`` as ``>=``; an IN list without its first key.
MUTATIONS: list[Callable[[str], str]] = [
    lambda row_filter: row_filter.replace(" = ", " >= "),
    lambda row_filter: re.sub(r" IN \(-?[0-9]+, ", " IN (", row_filter),
]


@pytest.mark.parametrize("mutation", MUTATIONS, ids=["equals", "in-list"])
def test_a_mutated_lookup_rule_is_caught(
    catalog: LocalCatalog, monkeypatch: pytest.MonkeyPatch, mutation: Callable[[str], str]
) -> None:
    original = lookups.KeyLookup.scan

    def wrong_scan(self: lookups.KeyLookup, schema: pa.Schema) -> object:
        scan = original(self, schema)
        if scan is None or scan.row_filter is None:
            return scan
        return replace(scan, row_filter=mutation(scan.row_filter))

    monkeypatch.setattr(lookups.KeyLookup, "scan", wrong_scan)
    wrong, _, _, _ = run_differential(catalog)
    assert any("rows differ" in w for w in wrong)


#: Names sqlparser reads specially in expression position (functions without
#: parentheses, or keywords that need one), beside plain names as a control.
SPECIAL_NAMES = [
    "current_date", "current_time", "current_timestamp", "localtime", "localtimestamp",
    "user", "current_user", "session_user", "current_role", "current_catalog",
    "current_schema", "extract", "position", "substring", "trim", "ceil", "floor",
    "array", "struct", "map", "date", "time", "timestamp", "convert", "try_cast",
    "overlay", "exists", "prior", "collate", "interval", "case", "cast", "not", "null",
    "true", "false", "reward", "robot",
]  # fmt: skip


@pytest.mark.parametrize("name", SPECIAL_NAMES)
def test_a_name_datafusion_does_not_read_as_the_column_is_never_a_lookup(name: str) -> None:
    """Where DataFusion answers something other than the column, the lookup path must not."""
    ctx = datafusion.SessionContext()
    table = pa.table({"id": pa.array([1], pa.int64()), name: pa.array([7], pa.int64())})
    ctx.register_record_batches("t", [table.to_batches()])
    for sql in (f"SELECT {name} FROM t WHERE id = 1", f"SELECT id FROM t WHERE {name} = 7"):
        try:
            got = ctx.sql(sql).to_arrow_table()
            column = sql.split()[1]
            agrees = (
                got.num_rows == 1
                and got.schema.field(0).type == pa.int64()
                and (got.column(0)[0].as_py() == table.column(column)[0].as_py())
            )
        except Exception:
            agrees = False
        if not agrees:
            assert lookups.parse_lookup(sql) is None, f"{sql!r} is not a plain lookup to DataFusion"
        elif name in ("reward", "robot"):  # the control: the shape itself is recognised
            assert lookups.parse_lookup(sql) is not None
