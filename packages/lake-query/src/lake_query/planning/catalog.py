"""The lazy ``lake`` catalog DataFusion plans against, one per request.

DataFusion asks its schema providers for each table it meets while planning
(joins, subqueries and CTE bodies included), and the binder then

1. validates the name (before any I/O),
2. authorizes the namespace for the caller (hidden and absent tables get the
   same PermissionDenied),
3. pins the table to the exact descriptor the catalog cache holds (planning)
   or the ticket carries (execution), and
4. registers ``lance.FFILanceTableProvider`` over the dataset opened at that
   Lance version.

A table that does not exist, in ``lake`` or in a catalog nobody configured
(``other.ns.t``), is recorded by the binder (:attr:`Binder.missing`) and
raised as :class:`~lake_core.errors.TableNotFound` naming it: the error comes
from what the catalog looked up, never from DataFusion's message.

``SHOW TABLES``, ``SHOW COLUMNS`` and ``information_schema`` list the
tables the caller may see: DataFusion opens every listed table when the
listing runs, so planning pins them all (:meth:`PlanningBinder.pin_visible`)
and the listing at DoGet is exactly the one planned, from the ticket.

A name may select a past version (``t@v3``, ``t@<instant>``) or the
``t$versions`` listing (:mod:`~lake_query.planning.versions`): planning
resolves it from the head's Lance history and pins the exact version, keyed
by table and selector, so two versions of one table are two pins.
"""

from __future__ import annotations

import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any

import lance
import pyarrow.dataset as pads
from datafusion import RuntimeEnvBuilder, SessionConfig, SessionContext
from datafusion.catalog import CatalogProvider, CatalogProviderList, SchemaProvider, Table
from datafusion.expr import TableScan

from lake_core.errors import InvalidArgument, PermissionDenied, TableNotFound, VersionReclaimed
from lake_core.models import CatalogEntry, TableDescriptor
from lake_core.names import DEFAULT_CATALOG, TableRef
from lake_core.principal import Principal
from lake_query.planning.external import ExternalTables
from lake_query.planning.functions import FunctionBudget, register_bounded_functions
from lake_query.planning.spec import PinnedTable
from lake_query.planning.storage import DatasetOpener
from lake_query.planning.versions import (
    VERSIONS_SELECTOR,
    TableName,
    history,
    parse_table_name,
    resolve,
    versions_table,
)

__all__ = [
    "DEFAULT_SCHEMA",
    "Binder",
    "Lister",
    "PinnedBinder",
    "PlanningBinder",
    "Resolver",
    "WalkStart",
    "conflicting_metadata",
    "lists_tables",
    "session",
]

#: DataFusion's listing schema (``SHOW TABLES`` reads it too).
INFORMATION_SCHEMA = "information_schema"
_LISTING_HINT = re.compile(r"information_schema|\bshow\b", re.IGNORECASE)

#: Schema that unqualified table names resolve in (``SELECT * FROM t`` -> ``lake.public.t``).
DEFAULT_SCHEMA = "public"

Resolver = Callable[[TableRef], CatalogEntry | None]
Lister = Callable[[], Iterable[TableRef]]
#: Where a time-travel walk may start, older than the head (None: at the head).
#: (lake_query.planning.version_starts)
WalkStart = Callable[[TableRef, TableDescriptor, TableName], TableDescriptor | None]
#: A table as one request references it: the table, and its selector (None: current).
PinKey = tuple[TableRef, str | None]


class Binder(ABC):
    """Resolves, authorizes and opens the tables of one request (memoized)."""

    def __init__(self, principal: Principal, opener: DatasetOpener) -> None:
        self.principal = principal
        self._opener = opener
        self._tables: dict[PinKey, Table] = {}
        self._datasets: dict[PinKey, tuple[TableDescriptor, Any]] = {}
        #: Qualified names of the tables this request named that do not exist, as met.
        self.missing: list[str] = []
        self._lock = threading.Lock()

    @abstractmethod
    def descriptor(self, ref: TableRef, wanted: TableName | None = None) -> TableDescriptor | None:
        """The pin for ``ref`` (at what ``wanted`` selects), or None if it does not exist."""

    @abstractmethod
    def known_tables(self) -> Iterable[TableRef]:
        """Every table this binder could resolve (for listings; no I/O)."""

    def pinned(  # noqa: B027
        self, ref: TableRef, descriptor: TableDescriptor, selector: str | None = None
    ) -> None:
        """Called once per table opened."""

    def not_found(self, qualified: str) -> TableNotFound:
        """Record ``qualified`` as a table this request named that does not exist."""
        self.missing.append(qualified)
        return TableNotFound(qualified)

    def missing_table(self) -> TableNotFound | None:
        """The error for the first table this request could not resolve, if any.

        Whatever DataFusion made of the lookup that raised it (it may keep
        only the text), planning failed because this table does not exist.
        """
        return TableNotFound(self.missing[0]) if self.missing else None

    def visible(self) -> list[TableRef]:
        return [t for t in self.known_tables() if self.principal.may_see(t.namespace)]

    def pin_visible(self) -> None:
        """Open (and so pin) every table the caller may see: what a listing reads."""
        for ref in sorted(self.visible(), key=lambda t: (t.namespace, t.name)):
            self.table(ref.namespace, ref.name)

    def table(self, namespace: str, name: str) -> Table:
        wanted = parse_table_name(name)  # InvalidArgument before any I/O
        ref = TableRef(namespace, wanted.name)  # InvalidName before any I/O
        key = (ref, wanted.selector)
        with self._lock:
            found = self._tables.get(key)
            if found is None:
                dataset = self._open(ref, wanted)
                if wanted.listing:
                    head = self._datasets[key][0]
                    steps = self._opener.version_steps(dataset, head)
                    found = Table(pads.dataset(versions_table(history(dataset, head, steps))))
                else:
                    found = Table(lance.FFILanceTableProvider(dataset))
                self._tables[key] = found
            return found

    def dataset(self, namespace: str, name: str) -> Any:
        """Authorize, pin and open one table as :meth:`table` does, without a provider."""
        wanted = parse_table_name(name)
        ref = TableRef(namespace, wanted.name)
        with self._lock:
            return self._open(ref, wanted)

    def _open(self, ref: TableRef, wanted: TableName | None = None) -> Any:
        key = (ref, None if wanted is None else wanted.selector)
        known = self._datasets.get(key)
        if known is not None:
            return known[1]
        if not self.principal.may_see(ref.namespace):
            raise PermissionDenied(f"permission denied: {ref.qualified}")
        descriptor = self.descriptor(ref, wanted)
        if descriptor is None:
            raise self.not_found(ref.qualified)
        dataset = self._opener.open(ref, descriptor)
        self._datasets[key] = (descriptor, dataset)
        self.pinned(ref, descriptor, key[1])
        return dataset

    def opened(self) -> list[Any]:
        """The datasets opened so far whose rows the query reads (not ``$versions`` heads)."""
        with self._lock:
            return [ds for (_, sel), (_, ds) in self._datasets.items() if sel != VERSIONS_SELECTOR]

    def opened_pins(self) -> list[tuple[TableRef, TableDescriptor, Any]]:
        """Every table opened so far, with its pin and dataset."""
        with self._lock:
            return [(ref, d, ds) for (ref, _), (d, ds) in self._datasets.items()]

    def open_all(self, pins: Iterable[PinnedTable]) -> list[Any]:
        """Authorize and open ``pins`` now (before the session exists).

        Returns the datasets whose rows the query reads (``$versions`` pins
        are opened and authorized, but read no rows of the table).
        """
        with self._lock:
            opened = [(p, self._open(p.table, parse_table_name(p.name))) for p in pins]
        return [dataset for pin, dataset in opened if pin.selector != VERSIONS_SELECTOR]

    def exists(self, namespace: str, name: str) -> bool:
        try:
            wanted = parse_table_name(name)
            ref = TableRef(namespace, wanted.name)
        except InvalidArgument:
            return False
        return self.principal.may_see(namespace) and self.descriptor(ref, wanted) is not None


class PlanningBinder(Binder):
    """Pins each referenced table to the descriptor the catalog cache holds now."""

    def __init__(
        self,
        principal: Principal,
        opener: DatasetOpener,
        resolve: Resolver,
        list_tables: Lister,
        walk_start: WalkStart | None = None,
    ) -> None:
        super().__init__(principal, opener)
        self._resolve = resolve
        self._list = list_tables
        self._walk_start = walk_start
        self.pins: dict[PinKey, TableDescriptor] = {}

    def descriptor(self, ref: TableRef, wanted: TableName | None = None) -> TableDescriptor | None:
        entry = self._resolve(ref)
        if entry is None:
            return None
        head = entry.descriptor
        if wanted is None or wanted.selector is None or wanted.listing:
            return head
        # The head's Lance history says which Lance version holds the one asked for,
        # walked back from the head or from a version Metasrv names nearer to it.
        dataset, origin = self._walk_origin(ref, head, wanted)
        steps = self._opener.version_steps(dataset, origin, ahead=False)
        return resolve(ref, head, history(dataset, origin, steps), wanted)

    def _walk_origin(
        self, ref: TableRef, head: TableDescriptor, wanted: TableName
    ) -> tuple[Any, TableDescriptor]:
        """The dataset a walk starts from, and its version: the head's, or an older start's.

        Opened at the start, not the head: on a replica that has not read the
        table yet, the head's dataset (and verifying its files) is not needed.
        """
        start = None if self._walk_start is None else self._walk_start(ref, head, wanted)
        if start is not None:
            try:
                return self._opener.open(ref, start), start
            except VersionReclaimed:
                # So is everything older: a walk from the start reads nothing,
                # and resolve() says whether the table existed then.
                return self._opener.open(ref, head), start
        return self._opener.open(ref, head), head

    def known_tables(self) -> Iterable[TableRef]:
        return self._list()

    def pinned(
        self, ref: TableRef, descriptor: TableDescriptor, selector: str | None = None
    ) -> None:
        self.pins[(ref, selector)] = descriptor


class PinnedBinder(Binder):
    """Resolves tables from a ticket's pinned set only: no cache, no pointer."""

    def __init__(
        self, principal: Principal, opener: DatasetOpener, pins: Iterable[PinnedTable]
    ) -> None:
        super().__init__(principal, opener)
        self._pins = {(p.table, p.selector): p.descriptor for p in pins}

    def descriptor(self, ref: TableRef, wanted: TableName | None = None) -> TableDescriptor | None:
        # Planning pinned every table this SQL references, so a miss cannot
        # happen for a genuine ticket; it is never resolved elsewhere.
        return self._pins.get((ref, None if wanted is None else wanted.selector))

    def known_tables(self) -> Iterable[TableRef]:
        return {ref for ref, _ in self._pins}


class _LakeSchema(SchemaProvider):
    def __init__(self, binder: Binder, namespace: str) -> None:
        self._binder = binder
        self._namespace = namespace

    # datafusion-python 54 reads ``table_names`` as an attribute holding a sequence.
    @property
    def table_names(self) -> list[str]:  # type: ignore[override]
        return sorted(t.name for t in self._binder.visible() if t.namespace == self._namespace)

    # datafusion-python 54 also reads ``owner_name`` as an attribute and shows its
    # str() as information_schema.schemata's schema_owner: the inherited method
    # showed as its repr (an internal object and its address), None as 'None'.
    # Only an absent attribute is NULL.
    @property
    def owner_name(self) -> str | None:  # type: ignore[override]
        raise AttributeError("owner_name")

    def table(self, name: str) -> Table | None:
        return self._binder.table(self._namespace, name)

    def table_exist(self, name: str) -> bool:
        return self._binder.exists(self._namespace, name)


class _LakeCatalog(CatalogProvider):
    def __init__(self, binder: Binder) -> None:
        self._binder = binder

    def schema_names(self) -> set[str]:
        return {t.namespace for t in self._binder.visible()}

    # DataFusion accepts any SchemaProvider here, not only its Schema wrapper.
    def schema(self, name: str) -> _LakeSchema:  # type: ignore[override]
        return _LakeSchema(self._binder, name)


class _AbsentSchema(SchemaProvider):
    """A schema of a catalog this replica does not have: every table in it is missing."""

    def __init__(self, binder: Binder, catalog: str, namespace: str) -> None:
        self._binder = binder
        self._prefix = f"{catalog}.{namespace}"

    @property
    def table_names(self) -> list[str]:  # type: ignore[override]
        return []

    def table(self, name: str) -> Table | None:
        raise self._binder.not_found(f"{self._prefix}.{name}")

    def table_exist(self, name: str) -> bool:
        return False


class _AbsentCatalog(CatalogProvider):
    def __init__(self, binder: Binder, name: str) -> None:
        self._binder = binder
        self._name = name

    def schema_names(self) -> set[str]:
        return set()

    def schema(self, name: str) -> _AbsentSchema:  # type: ignore[override]
        return _AbsentSchema(self._binder, self._name, name)


class _Catalogs(CatalogProviderList):
    """Every catalog a statement can name: ``lake``, the plug-ins', and any other name,
    which lists nothing and whose tables the binder records as missing."""

    def __init__(self, binder: Binder, catalogs: dict[str, CatalogProvider]) -> None:
        self._binder = binder
        self._catalogs = catalogs

    def catalog_names(self) -> set[str]:
        return set(self._catalogs)

    def catalog(self, name: str) -> CatalogProvider:
        return self._catalogs.get(name) or _AbsentCatalog(self._binder, name)


def lists_tables(sql: str, df: Any) -> bool:
    """Whether the planned ``df`` reads ``information_schema`` (``SHOW TABLES`` does).

    Conservative: a plan the bindings cannot walk counts as a listing (it
    then pins more tables than it needs, never fewer).
    """
    if _LISTING_HINT.search(sql) is None:
        return False

    def walk(plan: Any) -> bool:
        node = plan.to_variant()
        if isinstance(node, TableScan):
            parts = node.fqn()
            return len(parts) >= 2 and parts[-2] == INFORMATION_SCHEMA
        return any(walk(child) for child in plan.inputs())

    try:
        return walk(df.logical_plan())
    except Exception:
        return True


def conflicting_metadata(datasets: Iterable[Any]) -> bool:
    """Whether two schemas carry one metadata key with different values."""
    seen: dict[bytes, bytes] = {}
    for dataset in datasets:
        for key, value in (dataset.schema.metadata or {}).items():
            if seen.setdefault(key, value) != value:
                return True
    return False


#: DataFusion's default ``sort_spill_reservation_bytes``: a sort's merge reservation.
SORT_MERGE_RESERVATION_BYTES = 10 * 1024 * 1024


def session(
    binder: Binder,
    budget: FunctionBudget,
    *,
    join_reordering: bool = True,
    memory_bytes: int | None = None,
    functions: frozenset[str] = frozenset(),
    external: ExternalTables | None = None,
) -> SessionContext:
    """A DataFusion session over ``binder``'s ``lake`` catalog (and ``external`` ones).

    ``memory_bytes`` gives an executing session its own memory pool (sorts,
    aggregates and joins spill to disk past it where DataFusion can);
    planning sessions need none. ``functions``: the bounded built-ins the
    statement names (:data:`~lake_query.planning.functions.BOUNDED_FUNCTIONS`).
    """
    config = (
        SessionConfig()
        .with_default_catalog_and_schema(DEFAULT_CATALOG, DEFAULT_SCHEMA)
        .with_create_default_catalog_and_schema(False)
        .with_information_schema(True)
    )
    if not join_reordering:
        # DataFusion 54 merges the inputs' schema metadata in joins; when a
        # key has different values on the two sides, swapping the build side
        # changes the merged schema and its optimizer fails the plan with
        # "Schema mismatch". Keeping the written join order avoids it.
        config = config.set("datafusion.optimizer.join_reordering", "false")
    if memory_bytes is None:
        ctx = SessionContext(config)
    else:
        # Each sort keeps this much of its pool back to merge what it spilled (10 MiB
        # by default): in a small pool (a busy replica's), a proportionate share.
        merge = min(SORT_MERGE_RESERVATION_BYTES, memory_bytes // 8)
        config = config.set("datafusion.execution.sort_spill_reservation_bytes", str(merge))
        runtime = RuntimeEnvBuilder().with_fair_spill_pool(memory_bytes).with_disk_manager_os()
        ctx = SessionContext(config, runtime)
    if functions:
        register_bounded_functions(ctx, budget, functions)
    catalogs: dict[str, CatalogProvider] = {DEFAULT_CATALOG: _LakeCatalog(binder)}
    if external is not None:
        catalogs.update(external.providers())
    ctx.register_catalog_provider_list(_Catalogs(binder, catalogs))
    return ctx
