"""Planning and running SQL over pinned Lance table versions.

Every request gets its own DataFusion ``SessionContext`` whose ``lake``
catalog is lazy: DataFusion asks its schema providers for each table it
meets while planning (joins, subqueries and CTE bodies included), and the
provider then

1. validates the name (before any I/O),
2. authorizes the namespace for the caller (hidden and absent tables get the
   same PermissionDenied),
3. pins the table to the exact descriptor the catalog cache holds, and
4. registers ``lance.FFILanceTableProvider`` over the dataset opened at that
   Lance version.

Planning returns the result schema and the pinned set (a :class:`QuerySpec`,
which is what a ticket seals). Execution rebuilds the catalog from the
pinned set alone and never consults the cache, so an append between
GetFlightInfo and DoGet changes neither the schema nor the rows. A pinned
version that is gone fails with :class:`VersionReclaimed`; nothing falls
forward to a newer version.

Everything here blocks: callers run it off the event loop.
"""

from __future__ import annotations

import base64
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import lance
import pyarrow as pa
from datafusion import SessionConfig, SessionContext, SQLOptions
from datafusion.catalog import CatalogProvider, SchemaProvider, Table
from pydantic import BaseModel, ConfigDict

from lake_core.cloud import DatasetStorage
from lake_core.errors import (
    Internal,
    InvalidArgument,
    PermissionDenied,
    TableNotFound,
    Unavailable,
    Unimplemented,
    VersionReclaimed,
)
from lake_core.models import CatalogEntry, TableDescriptor, incarnation_of
from lake_core.names import DEFAULT_CATALOG, TableRef
from lake_core.principal import Principal
from lake_query.pinned import PinnedDatasets
from lake_query.pushdown import to_lance_filter
from lake_query.results import TARGET_BATCH_BYTES, coalesce_batches
from lake_query.statements import reject_writes, sql_error
from lake_query.verify import on_open

__all__ = [
    "DEFAULT_SCHEMA",
    "MAX_PARAMETER_BYTES",
    "PinnedTable",
    "PlannedQuery",
    "Planner",
    "QuerySpec",
    "ResultStream",
    "configure_storage",
    "open_pinned",
    "read_only_options",
]

#: Lance schema metadata key holding the table incarnation (set by Metasrv).
#: Schema that unqualified table names resolve in (``SELECT * FROM t`` -> ``lake.public.t``).
DEFAULT_SCHEMA = "public"
MAX_PARAMETER_BYTES = 64 * 1024

Resolver = Callable[[TableRef], CatalogEntry | None]
Lister = Callable[[], Iterable[TableRef]]


class PinnedTable(BaseModel):
    """One table of a query, pinned to an exact physical version."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    table: TableRef
    descriptor: TableDescriptor


class QuerySpec(BaseModel):
    """A query as a ticket carries it: SQL, pinned tables, bound parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    sql: str
    pins: tuple[PinnedTable, ...] = ()
    params_ipc: str | None = None

    @staticmethod
    def encode_parameters(batch: pa.RecordBatch | None) -> str | None:
        """Base64 IPC stream of a one-row parameter batch (``None`` for no parameters)."""
        if batch is None or batch.num_columns == 0:
            return None
        if batch.num_rows != 1:
            raise InvalidArgument(
                f"a Lake query binds exactly one row of parameters, got {batch.num_rows}"
            )
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        raw = sink.getvalue().to_pybytes()
        if len(raw) > MAX_PARAMETER_BYTES:
            raise InvalidArgument(f"query parameters exceed {MAX_PARAMETER_BYTES} bytes")
        return base64.b64encode(raw).decode("ascii")

    def parameters(self) -> dict[str, Any] | None:
        """Positional parameter values (``$1``, ``$2``, ...) for DataFusion."""
        if self.params_ipc is None:
            return None
        try:
            table = pa.ipc.open_stream(base64.b64decode(self.params_ipc)).read_all()
        except (ValueError, pa.ArrowException):
            raise InvalidArgument("malformed query parameters") from None
        if table.num_rows != 1:
            raise InvalidArgument("a Lake query binds exactly one row of parameters")
        return {str(i + 1): table.column(i)[0] for i in range(table.num_columns)}


@dataclass(frozen=True)
class PlannedQuery:
    """A planned query: what to seal into a ticket, and the schema it will produce."""

    spec: QuerySpec
    schema: pa.Schema


class ResultStream:
    """A running query: its schema and its 1-4 MB batches (iteration blocks)."""

    def __init__(
        self, schema: pa.Schema, batches: Iterator[pa.RecordBatch], session: object = None
    ) -> None:
        self.schema = schema
        self._batches = batches
        # Lance's FFI scan needs its SessionContext alive while batches flow.
        self._session = session

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return self

    def __next__(self) -> pa.RecordBatch:
        try:
            return next(self._batches)
        except StopIteration:
            raise
        except Exception as exc:
            raise _execution_error(exc) from None


def read_only_options() -> SQLOptions:
    """DataFusion options refusing DDL, DML and statements at planning."""
    return SQLOptions().with_allow_ddl(False).with_allow_dml(False).with_allow_statements(False)


_storage = DatasetStorage()


def configure_storage(storage: DatasetStorage) -> None:
    """How this process opens datasets: ``s3://`` ones through the DynamoDB manifest table.

    Set once at startup from validated configuration (``lake query``);
    Query needs no access to the registry table, only to the manifests.
    """
    global _storage
    _storage = storage


def _is_outage(exc: BaseException) -> bool:
    text = str(exc)
    return "not found" not in text.lower() and any(marker in text for marker in _OUTAGE_MARKERS)


#: Datasets opened at pinned versions, shared by every request of this process.
_opened = PinnedDatasets()

_OUTAGE_MARKERS = ("LanceError(IO)", "error sending request", "timed out", "dispatch failure")


def open_pinned(
    table: TableRef, descriptor: TableDescriptor, storage: DatasetStorage | None = None
) -> Any:
    """The Lance dataset at exactly ``descriptor``'s version, or VersionReclaimed.

    Opened read-only at the pinned version; an ``s3://`` location goes through
    Lance's DynamoDB manifest store. Unreachable storage is UNAVAILABLE.
    """
    if descriptor.engine != "lance":
        raise Unimplemented(
            f"{table.qualified}: table engine {descriptor.engine!r} is not supported"
        )
    storage = storage or _storage
    uri = storage.lance_uri(descriptor.location)

    def opener() -> Any:
        return lance.dataset(
            uri,
            version=descriptor.engine_version,
            storage_options=storage.storage_options(descriptor.location),
        )

    try:
        dataset = _opened.open(uri, descriptor.incarnation, descriptor.engine_version, opener)
    except (ValueError, OSError) as exc:
        if _is_outage(exc):
            raise Unavailable(
                f"{table.qualified}: table storage is unreachable right now; retry"
            ) from None
        if "not found" in str(exc).lower():
            raise VersionReclaimed(
                f"{table.qualified} version {descriptor.version} is no longer available "
                "(retention reclaimed it, or the table was dropped); run the query again "
                "to read the current version"
            ) from None
        raise Internal(f"cannot open {table.qualified} at version {descriptor.version}") from None
    if not _owned_by(dataset.schema.metadata or {}, descriptor.incarnation):
        raise VersionReclaimed(
            f"{table.qualified} version {descriptor.version} is no longer available: "
            "the table was dropped and recreated since the query was planned; "
            "run the query again"
        )
    on_open.check(dataset, table, descriptor)  # LAKE_QUERY_VERIFY_ON_OPEN (lake_query.verify)
    return dataset


def _owned_by(metadata: dict[bytes, bytes], incarnation: str) -> bool:
    """Whether a dataset's schema metadata names ``incarnation`` as its owner.

    Metasrv stamps every dataset with its incarnation, because a table dropped
    and recreated at the same location restarts Lance's version numbers.
    """
    return incarnation_of(metadata) == incarnation


def _execution_error(exc: BaseException) -> Exception:
    text = str(exc)
    if _is_outage(exc):
        return Unavailable("table storage became unreachable while the query ran; retry")
    # A data file deleted under a running scan: retention reclaimed the version.
    if "Not found" in text and ".lance" in text:
        return VersionReclaimed(
            "a pinned table version was reclaimed while the query ran; run the query again"
        )
    return sql_error(exc)


class _Binder(ABC):
    """Resolves, authorizes and opens the tables of one request (memoized)."""

    def __init__(self, principal: Principal) -> None:
        self.principal = principal
        self._tables: dict[TableRef, Table] = {}
        self._datasets: dict[TableRef, Any] = {}
        self._lock = threading.Lock()

    @abstractmethod
    def descriptor(self, ref: TableRef) -> TableDescriptor | None:
        """The pin for ``ref``, or None if it does not exist."""

    @abstractmethod
    def known_tables(self) -> Iterable[TableRef]:
        """Every table this binder could resolve (for listings; no I/O)."""

    def pinned(self, ref: TableRef, descriptor: TableDescriptor) -> None:  # noqa: B027
        """Called once per table opened."""

    def visible(self) -> list[TableRef]:
        return [t for t in self.known_tables() if self.principal.may_see(t.namespace)]

    def table(self, namespace: str, name: str) -> Table:
        ref = TableRef(namespace, name)  # InvalidName before any I/O
        with self._lock:
            found = self._tables.get(ref)
            if found is None:
                found = Table(lance.FFILanceTableProvider(self._open(ref)))
                self._tables[ref] = found
            return found

    def _open(self, ref: TableRef) -> Any:
        dataset = self._datasets.get(ref)
        if dataset is not None:
            return dataset
        if not self.principal.may_see(ref.namespace):
            raise PermissionDenied(f"permission denied: {ref.qualified}")
        descriptor = self.descriptor(ref)
        if descriptor is None:
            raise TableNotFound(ref.qualified)
        dataset = open_pinned(ref, descriptor)
        self._datasets[ref] = dataset
        self.pinned(ref, descriptor)
        return dataset

    def opened(self) -> list[Any]:
        """The datasets opened so far."""
        with self._lock:
            return list(self._datasets.values())

    def open_all(self, refs: Iterable[TableRef]) -> list[Any]:
        """Authorize and open ``refs`` now (before the session exists)."""
        with self._lock:
            return [self._open(ref) for ref in refs]

    def exists(self, namespace: str, name: str) -> bool:
        try:
            ref = TableRef(namespace, name)
        except InvalidArgument:
            return False
        return self.principal.may_see(namespace) and self.descriptor(ref) is not None


class _PlanningBinder(_Binder):
    """Pins each referenced table to the descriptor the catalog cache holds now."""

    def __init__(self, principal: Principal, resolve: Resolver, list_tables: Lister) -> None:
        super().__init__(principal)
        self._resolve = resolve
        self._list = list_tables
        self.pins: dict[TableRef, TableDescriptor] = {}

    def descriptor(self, ref: TableRef) -> TableDescriptor | None:
        entry = self._resolve(ref)
        return None if entry is None else entry.descriptor

    def known_tables(self) -> Iterable[TableRef]:
        return self._list()

    def pinned(self, ref: TableRef, descriptor: TableDescriptor) -> None:
        self.pins[ref] = descriptor


class _PinnedBinder(_Binder):
    """Resolves tables from a ticket's pinned set only: no cache, no pointer."""

    def __init__(self, principal: Principal, pins: Iterable[PinnedTable]) -> None:
        super().__init__(principal)
        self._pins = {p.table: p.descriptor for p in pins}

    def descriptor(self, ref: TableRef) -> TableDescriptor | None:
        # Planning pinned every table this SQL references, so a miss cannot
        # happen for a genuine ticket; it is never resolved elsewhere.
        return self._pins.get(ref)

    def known_tables(self) -> Iterable[TableRef]:
        return self._pins.keys()


class _LakeSchema(SchemaProvider):
    def __init__(self, binder: _Binder, namespace: str) -> None:
        self._binder = binder
        self._namespace = namespace

    def table_names(self) -> set[str]:
        return {t.name for t in self._binder.visible() if t.namespace == self._namespace}

    def table(self, name: str) -> Table | None:
        return self._binder.table(self._namespace, name)

    def table_exist(self, name: str) -> bool:
        return self._binder.exists(self._namespace, name)


class _LakeCatalog(CatalogProvider):
    def __init__(self, binder: _Binder) -> None:
        self._binder = binder

    def schema_names(self) -> set[str]:
        return {t.namespace for t in self._binder.visible()}

    # DataFusion accepts any SchemaProvider here, not only its Schema wrapper.
    def schema(self, name: str) -> _LakeSchema:  # type: ignore[override]
        return _LakeSchema(self._binder, name)


def _conflicting_metadata(datasets: Iterable[Any]) -> bool:
    """Whether two schemas carry one metadata key with different values."""
    seen: dict[bytes, bytes] = {}
    for dataset in datasets:
        for key, value in (dataset.schema.metadata or {}).items():
            if seen.setdefault(key, value) != value:
                return True
    return False


def _session(binder: _Binder, *, join_reordering: bool = True) -> SessionContext:
    config = (
        SessionConfig()
        .with_default_catalog_and_schema(DEFAULT_CATALOG, DEFAULT_SCHEMA)
        .with_create_default_catalog_and_schema(False)
        .with_information_schema(False)
    )
    if not join_reordering:
        # DataFusion 54 merges the inputs' schema metadata in joins; when a
        # key has different values on the two sides, swapping the build side
        # changes the merged schema and its optimizer fails the plan with
        # "Schema mismatch". Keeping the written join order avoids it.
        config = config.set("datafusion.optimizer.join_reordering", "false")
    ctx = SessionContext(config)
    ctx.register_catalog_provider(DEFAULT_CATALOG, _LakeCatalog(binder))
    return ctx


def _plan(ctx: SessionContext, spec: QuerySpec) -> Any:
    reject_writes(spec.sql)
    params = spec.parameters()
    try:
        if params:
            return ctx.sql_with_options(spec.sql, read_only_options(), param_values=params)
        return ctx.sql_with_options(spec.sql, read_only_options())
    except Exception as exc:
        raise sql_error(exc) from None


def _result_schema(df: Any) -> pa.Schema:
    # Schema-level metadata comes from Lance (incarnation ids); field metadata
    # (the FILE marker) is part of the column type and stays.
    schema: pa.Schema = df.schema()
    return schema.remove_metadata()


@dataclass(frozen=True)
class _DirectScan:
    """A query Lance's scanner answers alone: columns of one table, maybe a filter."""

    columns: list[str]
    row_filter: str | None  # Lance filter SQL
    batch_rows: int
    schema: pa.Schema


def _direct_plan(df: Any, datasets: list[Any], schema: pa.Schema) -> _DirectScan | None:
    """The direct scan for ``df`` when its plan is a scan of one table, else None.

    A plain projection (``SELECT a, b FROM t``), optionally filtered by a
    WHERE clause Lance's filter SQL can express, needs nothing else from
    DataFusion, whose Lance provider yields 8192-row batches that then have
    to be merged and adds its own per-query set-up. Lance's own scanner reads
    the same pinned version at the batch size Flight wants, using scalar
    indexes for the filter, several times faster.
    """
    if len(datasets) != 1:
        return None
    # The plan as written (analyzed, not optimized: the optimizer costs more
    # than the whole direct scan decision): Projection [Filter] TableScan.
    try:
        projection = df.logical_plan().to_variant()
        if type(projection).__name__ != "Projection":
            return None
        columns = []
        for expr in projection.projections():
            column = expr.to_variant()
            if type(column).__name__ != "Column":
                return None  # an expression, alias or literal
            columns.append(column.name())
        below = projection.input()[0].to_variant()
        predicate = None
        if type(below).__name__ == "Filter":
            predicate = below.predicate()
            below = below.input()[0].to_variant()
        if type(below).__name__ != "TableScan" or below.fetch() is not None or below.filters():
            return None
    except Exception:
        return None
    if columns != schema.names or len(set(columns)) != len(columns):
        return None
    row_filter = None
    if predicate is not None:
        row_filter = to_lance_filter([predicate], datasets[0].schema)
        if row_filter is None:
            return None
    row_bytes = sum(_estimated_width(field.type) for field in schema) or 1
    rows = max(1024, min(1 << 20, int(TARGET_BATCH_BYTES * 1.75) // row_bytes))
    return _DirectScan(columns, row_filter, rows, schema)


def _scan_directly(dataset: Any, plan: _DirectScan) -> Iterator[pa.RecordBatch] | None:
    """Run ``plan`` on ``dataset``; None if Lance refuses its filter (DataFusion can run it)."""
    try:
        scanner = dataset.scanner(
            columns=plan.columns, filter=plan.row_filter, batch_size=plan.batch_rows
        )
    except Exception as exc:
        if plan.row_filter is not None:
            return None
        raise _execution_error(exc) from None
    try:
        batches = scanner.to_batches()
    except Exception as exc:
        raise _execution_error(exc) from None
    return (batch for batch in batches if batch.num_rows)


class _DirectPlans:
    """Direct scans found while planning, for the DoGet that follows on this replica.

    Keyed by the whole planned spec (SQL, parameters, pinned versions), from
    which the direct scan follows deterministically: a hit spares DoGet a
    DataFusion session and a second planning. A miss (another replica, or
    an evicted entry) plans again, as before. Authorization is never cached.
    """

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._plans: OrderedDict[QuerySpec, _DirectScan] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, spec: QuerySpec, plan: _DirectScan) -> None:
        with self._lock:
            self._plans[spec] = plan
            self._plans.move_to_end(spec)
            while len(self._plans) > self.capacity:
                self._plans.popitem(last=False)

    def recall(self, spec: QuerySpec) -> _DirectScan | None:
        with self._lock:
            return self._plans.get(spec)


def _estimated_width(data_type: pa.DataType) -> int:
    try:
        return max(1, data_type.bit_width // 8)
    except ValueError:  # variable width: a guess; coalescing corrects it
        return 64


class Planner:
    """Plans SQL against the catalog cache and runs it against pinned versions.

    ``resolve`` maps a table to its current catalog entry (None if absent) and
    ``list_tables`` enumerates known tables; both must be cache reads.
    """

    def __init__(self, resolve: Resolver, list_tables: Lister = tuple) -> None:
        self._resolve = resolve
        self._list = list_tables
        self._direct = _DirectPlans()

    def plan(
        self,
        sql: str,
        principal: Principal,
        params: pa.RecordBatch | None = None,
    ) -> PlannedQuery:
        """Authorize, pin and plan ``sql``; nothing is executed."""
        reject_writes(sql)
        spec = QuerySpec(sql=sql, params_ipc=QuerySpec.encode_parameters(params))
        return self.plan_spec(spec, principal)

    def plan_spec(self, spec: QuerySpec, principal: Principal) -> PlannedQuery:
        """Plan ``spec.sql`` with its bound parameters, pinning tables afresh."""
        binder = _PlanningBinder(principal, self._resolve, self._list)
        df = _plan(_session(binder), spec)
        schema = _result_schema(df)
        pins = tuple(
            PinnedTable(table=ref, descriptor=binder.pins[ref])
            for ref in sorted(binder.pins, key=lambda r: (r.namespace, r.name))
        )
        planned = spec.model_copy(update={"pins": pins})
        direct = _direct_plan(df, binder.opened(), schema)
        if direct is not None:
            self._direct.remember(planned, direct)
        return PlannedQuery(spec=planned, schema=schema)

    def execute(self, spec: QuerySpec, principal: Principal) -> ResultStream:
        """Run a planned query from its pinned set alone."""
        binder = _PinnedBinder(principal, spec.pins)
        datasets = binder.open_all(p.table for p in spec.pins)  # authorizes every table
        known = self._direct.recall(spec)
        if known is not None and len(datasets) == 1:
            batches = _scan_directly(datasets[0], known)
            if batches is not None:
                return ResultStream(known.schema, coalesce_batches(batches, known.schema))
        session = _session(binder, join_reordering=not _conflicting_metadata(datasets))
        df = _plan(session, spec)
        schema = _result_schema(df)
        direct = _direct_plan(df, datasets, schema)
        batches = None if direct is None else _scan_directly(datasets[0], direct)
        if batches is not None:
            return ResultStream(schema, coalesce_batches(batches, schema), session)
        try:
            # The C stream interface moves batches with less Python per batch
            # than execute_stream() + to_pyarrow().
            reader = pa.RecordBatchReader.from_stream(df)
        except Exception as exc:
            raise _execution_error(exc) from None
        return ResultStream(schema, coalesce_batches(reader, schema), session)
