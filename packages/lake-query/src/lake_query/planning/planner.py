"""The planner: plan SQL with pinning, run it from the pins alone.

Planning returns the result schema and the pinned set (a :class:`QuerySpec`,
which is what a ticket seals). Execution rebuilds the catalog from the
pinned set alone and never consults the cache, so an append between
GetFlightInfo and DoGet changes neither the schema nor the rows. A pinned
version that is gone fails with :class:`VersionReclaimed`; nothing falls
forward to a newer version.

Everything here blocks: callers run it off the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import pyarrow as pa
from datafusion import SessionContext, SQLOptions

from lake_core.errors import LakeError, ResourceExhausted
from lake_core.principal import Principal
from lake_query.planning.abortable import AbortableBatches
from lake_query.planning.batches import coalesce_batches
from lake_query.planning.catalog import (
    Binder,
    Lister,
    PinnedBinder,
    PlanningBinder,
    Resolver,
    WalkStart,
    conflicting_metadata,
    lists_tables,
    session,
)
from lake_query.planning.direct import (
    DirectPlans,
    DirectScan,
    batch_rows_for,
    direct_plan,
    plain_projection,
    scan_directly,
)
from lake_query.planning.external import ExternalCatalog, ExternalTables, scan_filters
from lake_query.planning.functions import FunctionBudget
from lake_query.planning.limits import QueryLimits, SqlShape
from lake_query.planning.lookups import parse_lookup
from lake_query.planning.overflow import checked_arithmetic, may_overflow
from lake_query.planning.partitions import (
    PartitionLimits,
    fragment_ranges,
    incompatible_partition,
    scan_partition,
)
from lake_query.planning.pinned import PinnedDatasets
from lake_query.planning.reservations import MemoryBudget, Reservation
from lake_query.planning.scan_cache import ScanCache, ScanKey, estimated_bytes
from lake_query.planning.spec import PinnedTable, PlannedQuery, QuerySpec
from lake_query.planning.sql_errors import out_of_memory, reject_writes, sql_error
from lake_query.planning.storage import DatasetOpener

__all__ = ["Planner", "ResultStream", "read_only_options"]


class PlainExternal(NamedTuple):
    """A statement planned as a plain projection of one external table, at one version."""

    table: tuple[str, str, str]
    #: The table's metadata as planned (``ExternalTable.version``): any upstream
    #: commit, a schema change without a new snapshot included, changes it.
    version: str
    schema: pa.Schema


def _statement(spec: QuerySpec) -> QuerySpec:
    """``spec``'s text alone (SQL and bound parameters), the key of a statement."""
    return QuerySpec(sql=spec.sql, params_ipc=spec.params_ipc)


class ResultStream:
    """A running query: its schema and its 1-4 MB batches (iteration blocks)."""

    def __init__(
        self,
        schema: pa.Schema,
        batches: Iterator[pa.RecordBatch],
        session: object = None,
        on_error: Callable[[BaseException], Exception] = sql_error,
        reservation: Reservation | None = None,
        abortable: AbortableBatches | None = None,
    ) -> None:
        self.schema = schema
        self._batches: Iterator[pa.RecordBatch] | None = batches
        self._abortable = abortable
        # Lance's FFI scan needs its SessionContext alive while batches flow.
        self._session = session
        self._on_error = on_error
        self._reservation = reservation

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return self

    def __next__(self) -> pa.RecordBatch:
        if self._batches is None:
            raise StopIteration
        try:
            return next(self._batches)
        except StopIteration:
            self.close()
            raise
        except Exception as exc:
            error = self._on_error(exc)
        self.close()
        # Raised outside the handler and without the engine's frames: no traceback
        # may keep the batch iterator (DataFusion's stream) alive in a cycle, for
        # the collector to free inside a later DataFusion call (see close()).
        try:
            raise error.with_traceback(None) from None
        finally:
            del error

    def abort(self) -> None:
        """From any thread: stop the batch being computed, if the engine's can be stopped.

        Only DataFusion streams run with ``abortable=True`` can; a direct scan
        produces each batch quickly and stops between them.
        """
        if self._abortable is not None:
            self._abortable.abort()

    def close(self) -> None:
        """Release the session now, on this thread.

        A session holds Python functions (the bounded built-ins); left to
        the cycle collector (an error's traceback keeps it in a cycle), it
        would be freed at an arbitrary point inside another DataFusion call,
        which aborts the process.
        """
        batches, self._batches = self._batches, None
        # A scan cache's tee learns here that its stream ended early (keeps nothing).
        close = getattr(batches, "close", None)
        if close is not None:
            close()
        if self._abortable is not None:
            self._abortable.close()
        self._session = None
        if self._reservation is not None:
            self._reservation.release()


def read_only_options() -> SQLOptions:
    """DataFusion options refusing DDL, DML and statements at planning."""
    return SQLOptions().with_allow_ddl(False).with_allow_dml(False).with_allow_statements(False)


def _check(spec: QuerySpec, limits: QueryLimits, *, prepare: bool = False) -> SqlShape:
    """Refuse writes and oversized statements before any session exists."""
    reject_writes(spec.sql)
    # Preparing a statement plans it before its parameters are bound.
    bound = None if prepare else len(spec.parameters() or ())
    return limits.check_text(spec.sql, bound)


def _plan(ctx: SessionContext, spec: QuerySpec, limits: QueryLimits, binder: Binder) -> Any:
    """``spec`` planned in ``ctx`` over ``binder``'s catalog; a failure as a Lake error.

    A Lake error a table lookup raised is that error; a table the catalog
    could not resolve is TableNotFound from its record; anything else is
    DataFusion's message (:func:`~lake_query.planning.sql_errors.sql_error`).
    """
    params = spec.parameters()
    try:
        if params:
            df = ctx.sql_with_options(spec.sql, read_only_options(), param_values=params)
        else:
            df = ctx.sql_with_options(spec.sql, read_only_options())
    except Exception as exc:
        del ctx  # see ResultStream.close: no traceback may keep a session alive
        missing = None if isinstance(exc, LakeError) else binder.missing_table()
        raise (missing or sql_error(exc)) from None
    limits.check_plan(df)
    return df


def _pins(binder: PlanningBinder) -> tuple[PinnedTable, ...]:
    """What ``binder`` pinned, in a stable order (the ticket's pinned set)."""
    return tuple(
        PinnedTable(table=ref, descriptor=binder.pins[(ref, selector)], selector=selector)
        for ref, selector in sorted(
            binder.pins, key=lambda k: (k[0].namespace, k[0].name, k[1] or "")
        )
    )


def _result_schema(df: Any) -> pa.Schema:
    # Schema-level metadata comes from Lance (incarnation ids); field metadata
    # (the FILE marker) is part of the column type and stays.
    schema: pa.Schema = df.schema()
    return schema.remove_metadata()


class Planner:
    """Plans SQL against the catalog cache and runs it against pinned versions.

    ``resolve`` maps a table to its current catalog entry (None if absent) and
    ``list_tables`` enumerates known tables; both must be cache reads.
    ``datasets`` opens pinned versions (the replica's storage settings and its
    cache of opened datasets); by default local paths, uncached.
    ``lookups``: plan key lookups without DataFusion (:mod:`~lake_query.planning.lookups`);
    off only to compare that path with DataFusion's.
    ``walk_start``: where a time-travel selector's walk back through a table's
    history starts (:mod:`~lake_query.planning.version_starts`); None: its head.
    """

    def __init__(
        self,
        resolve: Resolver,
        list_tables: Lister = tuple,
        *,
        datasets: DatasetOpener | None = None,
        limits: QueryLimits | None = None,
        external: Iterable[ExternalCatalog] = (),
        partitions: PartitionLimits | None = None,
        lookups: bool = True,
        scans: ScanCache | None = None,
        walk_start: WalkStart | None = None,
    ) -> None:
        self.limits = limits or QueryLimits()
        #: Recent direct scans' batches (LAKE_QUERY_SCAN_CACHE_BYTES); None: none kept.
        self.scans = scans
        self.lookups = lookups
        self.partitions = partitions or PartitionLimits()
        #: Plug-in catalogs (``iceberg``) by SQL catalog name.
        self.external = {c.name: c for c in external}
        self._resolve = resolve
        self._list = list_tables
        #: Where time-travel walks start (lake_query.planning.version_starts); None: heads.
        self._walk_start = walk_start
        self._datasets = datasets or DatasetOpener(cache=PinnedDatasets())
        self._direct: DirectPlans[DirectScan] = DirectPlans()
        #: Result schemas of plain projections of one external table (no DataFusion at DoGet).
        self._plain_external: DirectPlans[pa.Schema] = DirectPlans()
        #: The same statements by their text (SQL and parameters, nothing pinned): planning
        #: them again at the snapshot they were planned at needs no DataFusion either.
        self._plain_statements: DirectPlans[PlainExternal] = DirectPlans()
        self.memory = MemoryBudget(
            self.limits.memory_limit_bytes,
            self.limits.memory_wait_ms / 1000,
            tenant_bytes=self.limits.memory_pools_per_tenant * self.limits.query_memory_bytes,
            slots=self.limits.memory_slots,
            tenant_slots=self.limits.memory_slots_per_tenant,
        )

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

    def plan_spec(
        self, spec: QuerySpec, principal: Principal, *, prepare: bool = False
    ) -> PlannedQuery:
        """Plan ``spec.sql`` with its bound parameters, pinning tables afresh.

        ``prepare``: a statement being prepared, whose ``$N`` are bound later.
        """
        shape = _check(spec, self.limits, prepare=prepare)
        if self.lookups and not prepare:
            planned = self._plan_lookup(spec, principal)
            if planned is not None:
                return planned
        planned_before = self._plan_plain_external(spec, principal)
        if planned_before is not None:
            return planned_before
        binder = PlanningBinder(
            principal, self._datasets, self._resolve, self._list, self._walk_start
        )
        external = ExternalTables(principal, self.external) if self.external else None
        budget = FunctionBudget(self.limits.max_function_output_bytes)
        ctx = session(binder, budget, functions=shape.bounded_functions, external=external)
        df = _plan(ctx, spec, self.limits, binder)
        del ctx
        schema = _result_schema(df)
        if lists_tables(spec.sql, df):
            # DoGet lists exactly the tables pinned now (and only those the caller may see).
            binder.pin_visible()
        update: dict[str, Any] = {"pins": _pins(binder)}
        if external is not None:
            update["external"] = external.pins()
        planned = spec.model_copy(update=update)
        opened = binder.opened()
        if (
            external is not None
            and not opened
            and len(planned.external) == 1
            and plain_projection(df, schema)
        ):
            self._plain_external.remember(planned, schema)
            pin = planned.external[0]
            version = external.version((str(pin.catalog), pin.namespace, pin.table))
            if version is not None:
                self._plain_statements.remember(
                    _statement(spec),
                    PlainExternal((str(pin.catalog), pin.namespace, pin.table), version, schema),
                )
        direct = direct_plan(df, opened, schema)
        parts: tuple[tuple[int, ...], ...] = ()
        if direct is not None:
            self._direct.remember(planned, direct)
            parts = fragment_ranges(opened[0], direct, self.partitions)
        return PlannedQuery(spec=planned, schema=schema, partitions=parts)

    def _plan_plain_external(self, spec: QuerySpec, principal: Principal) -> PlannedQuery | None:
        """``spec`` planned without DataFusion, if this replica planned its text before as a
        plain projection of one external table and that table is at the same snapshot now.

        What full planning would return: the table is resolved exactly as a
        lookup from DataFusion resolves it (the principal's grant, the plug-in's
        current snapshot), and a plan of the same text over the same table
        metadata has the same schema. Flight SQL clients such as ADBC prepare a
        statement and then execute it, which planned it twice. Any upstream
        commit since (another metadata version): None.
        """
        if not self.external:
            return None
        known = self._plain_statements.recall(_statement(spec))
        if known is None:
            return None
        external = ExternalTables(principal, self.external)
        external.resolve(*known.table)  # authorizes; TableNotFound as planning raises it
        if external.version(known.table) != known.version:
            return None  # committed to since: DataFusion plans it again
        planned = spec.model_copy(update={"pins": (), "external": external.pins()})
        self._plain_external.remember(planned, known.schema)  # for this replica's DoGet
        return PlannedQuery(spec=planned, schema=known.schema, partitions=())

    def _plan_lookup(self, spec: QuerySpec, principal: Principal) -> PlannedQuery | None:
        """``spec`` planned as a key lookup, or None: DataFusion plans it (errors included)."""
        lookup = parse_lookup(spec.sql, has_parameters=spec.params_ipc is not None)
        if lookup is None:
            return None
        binder = PlanningBinder(
            principal, self._datasets, self._resolve, self._list, self._walk_start
        )
        try:
            dataset = binder.dataset(lookup.namespace, lookup.table)
        except LakeError:
            return None
        direct = lookup.scan(dataset.schema)
        if direct is None:
            return None
        planned = spec.model_copy(update={"pins": _pins(binder)})
        self._direct.remember(planned, direct)
        parts = fragment_ranges(dataset, direct, self.partitions)
        return PlannedQuery(spec=planned, schema=direct.schema, partitions=parts)

    def execute(
        self, spec: QuerySpec, principal: Principal, *, abortable: bool = False
    ) -> ResultStream:
        """Run a planned query from its pinned set alone.

        ``abortable``: DataFusion's batches come through :class:`AbortableBatches`,
        so :meth:`ResultStream.abort` interrupts a batch being computed (async jobs).
        """
        shape = _check(spec, self.limits)
        binder = PinnedBinder(principal, self._datasets, spec.pins)
        datasets = binder.open_all(spec.pins)  # authorizes every table
        budget = FunctionBudget(self.limits.max_function_output_bytes)
        known = self._plain_external.recall(spec) if not datasets else None
        resolved: ExternalTables | None = None
        if known is not None:
            # Planned here as a plain projection of one external table: its fresh
            # pinned load, without a DataFusion session to find that again.
            resolved = ExternalTables(principal, self.external, spec.external)
            on_error = self._execution_errors(binder, budget, resolved)
            try:
                resolved.resolve_pins()
                rows = resolved.direct(known, batch_rows_for(known))
            except Exception as exc:
                raise on_error(exc) from None
            if rows is not None:
                return ResultStream(known, coalesce_batches(rows, known), on_error=on_error)
            # The plug-in refused a direct read: DataFusion runs it (not asked again below).
        external, plain = self._pinned_external(
            spec,
            principal,
            binder,
            budget,
            shape.bounded_functions,
            resolved,
        )
        on_error = self._execution_errors(binder, budget, external)
        if external is not None and plain is not None and not datasets and known is None:
            # A plain projection of one external table: the plug-in reads it (no DataFusion).
            try:
                rows = external.direct(plain, batch_rows_for(plain))
            except Exception as exc:
                raise on_error(exc) from None
            if rows is not None:
                return ResultStream(plain, coalesce_batches(rows, plain), on_error=on_error)
        scan = self._direct.recall(spec)
        if scan is not None and len(datasets) == 1 and external is None:
            direct = self._direct_stream(datasets[0], scan, on_error)
            if direct is not None:
                return direct
        reservation = self.memory.reserve(
            self.limits.query_memory_bytes if self.limits.enforce else 0, principal.tenant_id
        )
        if self.limits.enforce and reservation.nbytes < self.limits.query_memory_bytes:
            on_error = _busy_replica(on_error, reservation.nbytes)
        try:
            ctx = session(
                binder,
                budget,
                join_reordering=not conflicting_metadata(datasets),
                memory_bytes=reservation.nbytes if self.limits.enforce else None,
                functions=shape.bounded_functions,
                external=external,
            )
        except BaseException:
            reservation.release()
            raise
        try:
            return self._run(ctx, spec, binder, datasets, on_error, reservation, budget, abortable)
        except BaseException:
            reservation.release()
            del ctx  # see ResultStream.close: no traceback may keep a session alive
            raise

    def _pinned_external(
        self,
        spec: QuerySpec,
        principal: Principal,
        binder: Binder,
        budget: FunctionBudget,
        functions: frozenset[str],
        resolved: ExternalTables | None = None,
    ) -> tuple[ExternalTables | None, pa.Schema | None]:
        """The ticket's external tables, loaded at their exact snapshots, with scan filters.

        A first, metadata-only plan finds the filter above each external scan,
        so the plug-in can prune data files for the plan that runs. Also
        returns the result schema when the statement is a plain projection
        of one table (no filter, no LIMIT), which the plug-in may read itself.
        ``resolved``: this request's tables already loaded (not loaded again).
        """
        if not spec.external:
            return None, None
        external = resolved or ExternalTables(principal, self.external, spec.external)
        ctx = session(binder, budget, functions=functions, external=external)
        try:
            df = _plan(ctx, spec, self.limits, binder)
        except Exception:
            if external.error is not None:
                raise external.error.with_traceback(None) from None
            raise
        external.filters = scan_filters(df, self.external)
        schema = _result_schema(df)
        plain = schema if len(spec.external) == 1 and plain_projection(df, schema) else None
        del ctx, df
        return external, plain

    def execute_partition(
        self, spec: QuerySpec, fragment_ids: list[int], principal: Principal
    ) -> ResultStream:
        """Run one partition of a planned scan: only ``fragment_ids`` of its pinned version."""
        shape = _check(spec, self.limits)
        binder = PinnedBinder(principal, self._datasets, spec.pins)
        datasets = binder.open_all(spec.pins)  # authorizes every table
        budget = FunctionBudget(self.limits.max_function_output_bytes)
        on_error = self._execution_errors(binder, budget)
        plan = self._direct.recall(spec) if len(datasets) == 1 else None
        ctx: SessionContext | None = None
        try:
            if plan is None and len(datasets) == 1:
                # Another replica planned it: plan again (deterministic) to find the scan.
                ctx = session(binder, budget, functions=shape.bounded_functions)
                df = _plan(ctx, spec, self.limits, binder)
                plan = direct_plan(df, datasets, _result_schema(df))
                del df
                if plan is not None:
                    self._direct.remember(spec, plan)
            if plan is None:
                raise incompatible_partition()
            stream = self._direct_stream(datasets[0], plan, on_error, fragment_ids, ctx)
        except BaseException:
            del ctx  # see ResultStream.close: no traceback may keep a session alive
            raise
        assert stream is not None  # a partition never falls back to DataFusion
        return stream

    def _direct_stream(
        self,
        dataset: Any,
        plan: DirectScan,
        on_error: Callable[[BaseException], Exception],
        fragment_ids: list[int] | None = None,
        session: object = None,
    ) -> ResultStream | None:
        """A direct scan (of ``fragment_ids`` only, for a partition), replayed from the scan
        cache or kept in it as it streams. None: Lance refused a whole scan's filter
        (DataFusion runs it).

        The pinned tables are already authorized and opened: a hit skips no check.
        """
        scans = self.scans
        key = None if scans is None else ScanKey.of(dataset, plan, fragment_ids)
        if scans is not None and key is not None:
            kept = scans.replay(key)
            if kept is not None:
                return ResultStream(plan.schema, kept, session, on_error)
        if fragment_ids is None:
            batches = scan_directly(dataset, plan, on_error)
            if batches is None:
                return None
        else:
            batches = scan_partition(dataset, plan, fragment_ids, on_error)
        rows = coalesce_batches(batches, plan.schema)
        if scans is not None and key is not None:
            rows = scans.keep(key, rows, estimated_bytes(dataset, plan, fragment_ids))
        return ResultStream(plan.schema, rows, session, on_error)

    def _run(
        self,
        ctx: SessionContext,
        spec: QuerySpec,
        binder: Binder,
        datasets: list[Any],
        on_error: Callable[[BaseException], Exception],
        reservation: Reservation,
        budget: FunctionBudget,
        abortable: bool = False,
    ) -> ResultStream:
        df = _plan(ctx, spec, self.limits, binder)
        schema = _result_schema(df)
        direct = direct_plan(df, datasets, schema)
        stream = None
        if direct is not None:
            stream = self._direct_stream(datasets[0], direct, on_error, session=ctx)
        if stream is not None:
            reservation.release()  # a direct scan runs no DataFusion operator
            return stream
        error: Exception | None = None
        reader: Iterator[pa.RecordBatch] | None = None
        stoppable: AbortableBatches | None = None
        try:
            if self.limits.enforce and may_overflow(spec.sql):
                df = checked_arithmetic(ctx, df, budget)
            if abortable:
                reader = stoppable = AbortableBatches(df)
            else:
                # The C stream interface moves batches with less Python per batch
                # than execute_stream() + to_pyarrow().
                reader = pa.RecordBatchReader.from_stream(df)
        except Exception as exc:
            error = on_error(exc)
        if error is not None:
            del ctx, df
            raise error
        assert reader is not None
        return ResultStream(
            schema, coalesce_batches(reader, schema), ctx, on_error, reservation, stoppable
        )

    def _execution_errors(
        self, binder: Binder, budget: FunctionBudget, external: ExternalTables | None = None
    ) -> Callable[[BaseException], Exception]:
        """How a failure while the query runs becomes a Lake error.

        From what Lake itself recorded (a refused function output) and asked
        (the storage probes: native pins, then each external table's plug-in),
        before DataFusion's own message is used.
        """

        def classify(exc: BaseException) -> Exception:
            if isinstance(exc, LakeError):
                return exc
            refused = budget.error()
            if refused is not None:
                return refused
            storage = self._datasets.scan_failure(binder.opened_pins())
            if storage is None and external is not None:
                storage = external.scan_failure(exc)
            return storage if storage is not None else sql_error(exc)

        return classify


def _busy_replica(
    classify: Callable[[BaseException], Exception], granted: int
) -> Callable[[BaseException], Exception]:
    """``classify``, but a query that ran out of a pool the busy replica shrank may retry.

    On an idle replica the same statement gets the full pool; with less, its
    failure for memory is the replica's load, not the statement's size.
    """

    def classify_busy(exc: BaseException) -> Exception:
        if out_of_memory(exc):
            return ResourceExhausted(
                f"this replica was busy: the query ran out of the {granted >> 20} MiB of "
                "memory it could get (LAKE_QUERY_MEMORY_LIMIT_BYTES is in use by other "
                "queries); retry shortly"
            )
        return classify(exc)

    return classify_busy
