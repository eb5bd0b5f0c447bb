"""External catalogs (the Iceberg plug-in) as DataFusion catalogs, found by entry point.

Query never imports a plug-in: it loads every ``lake.query.plugins`` entry
point while parsing its configuration. Each is a callable ``plugin(env)``
returning an :class:`ExternalCatalog` (configured, not started) or None when
its variables are unset. When ``LAKE_ICEBERG_*`` variables are set and no
plug-in answers for ``iceberg``, startup fails naming the install of ``lake-iceberg``.

Per request, :class:`ExternalTables` resolves ``<catalog>.<ns>.<table>``:

- the namespace must be in the principal's grants (and, inside the plug-in,
  in its allowlist); hidden and absent tables are the same TableNotFound;
- planning asks the plug-in for its current snapshot (one exact lookup) and
  records an :class:`~lake_query.planning.spec.ExternalPin`;
- execution asks for exactly the pinned snapshot (a fresh load), and passes
  the plan's filters above each scan so the plug-in can prune data files;
  a plain projection of one external table may be read by the plug-in
  itself (:meth:`ExternalTables.direct`), without DataFusion;
- a failure while the query runs is offered to each table's plug-in
  (:meth:`ExternalTables.scan_failure`): a storage fault is never the
  caller's mistake, so it comes back typed (DataCorrupted, Unavailable).

Listings never show external tables: the DataFusion catalog names no schemas
and no tables.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Protocol

import pyarrow as pa
from datafusion.catalog import CatalogProvider, SchemaProvider, Table
from datafusion.expr import Filter, TableScan

from lake_core.config import (
    ICEBERG_NAMESPACES,
    ICEBERG_REST_ENDPOINT,
    ICEBERG_WAREHOUSE,
)
from lake_core.errors import ConfigError, InvalidArgument, LakeError, TableNotFound
from lake_core.install import package_hint
from lake_core.names import TableRef
from lake_core.principal import Principal
from lake_query.planning.spec import ExternalPin

__all__ = [
    "PLUGIN_GROUP",
    "ExternalCatalog",
    "ExternalTable",
    "ExternalTables",
    "load_external_catalogs",
    "scan_filters",
]

PLUGIN_GROUP = "lake.query.plugins"
_ICEBERG_VARIABLES = (ICEBERG_REST_ENDPOINT, ICEBERG_WAREHOUSE, ICEBERG_NAMESPACES)

#: (catalog, namespace, table)
Key = tuple[str, str, str]


class ExternalTable(Protocol):
    """One external table pinned to a snapshot, for one request."""

    @property
    def snapshot_id(self) -> int | None: ...

    @property
    def version(self) -> str | None:
        """The table's metadata as loaded (changes with every upstream commit); None: unknown."""

    def provider(self, filters: Sequence[Any] = ()) -> Any:
        """A DataFusion table provider; ``filters`` are DataFusion exprs above its scan."""

    def batches(self, schema: pa.Schema, batch_rows: int) -> Iterator[pa.RecordBatch] | None:
        """Every row of the columns ``schema`` names, read by the plug-in; None: use provider()."""

    def scan_failure(self, error: BaseException) -> LakeError | None:
        """The typed storage fault (DataCorrupted, Unavailable) behind ``error``, else None."""


class ExternalCatalog(Protocol):
    """What a ``lake.query.plugins`` plug-in returns."""

    name: str

    def start(self) -> None:
        """Bounded startup checks (blocking), before the listener binds."""

    def close(self) -> None: ...

    def plan(self, namespace: str, table: str) -> ExternalTable:
        """The table at its current snapshot (planning); TableNotFound when hidden or absent."""

    def pinned(self, namespace: str, table: str, snapshot_id: int | None) -> ExternalTable:
        """The table at exactly ``snapshot_id`` (execution), never falling forward."""


def load_external_catalogs(
    env: Mapping[str, str], plugins: Iterable[EntryPoint] | None = None
) -> tuple[ExternalCatalog, ...]:
    """Every configured plug-in catalog (validated, not started)."""
    found: dict[str, ExternalCatalog] = {}
    for entry in plugins if plugins is not None else entry_points(group=PLUGIN_GROUP):
        factory: Callable[[Mapping[str, str]], ExternalCatalog | None] = entry.load()
        catalog = factory(env)
        if catalog is not None:
            found[catalog.name] = catalog
    configured = [v.name for v in _ICEBERG_VARIABLES if (env.get(v) or "").strip()]
    if configured and "iceberg" not in found and not _iceberg_installed(plugins):
        raise ConfigError(
            f"{', '.join(configured)} set but the Iceberg plug-in is not installed: "
            + package_hint(["lake-iceberg"])
        )
    return tuple(found.values())


def _iceberg_installed(plugins: Iterable[EntryPoint] | None) -> bool:
    names = {e.name for e in (plugins if plugins is not None else entry_points(group=PLUGIN_GROUP))}
    return "iceberg" in names


class ExternalTables:
    """The external tables of one request: resolved once each, pinned, memoized."""

    def __init__(
        self,
        principal: Principal,
        catalogs: Mapping[str, ExternalCatalog],
        pins: Iterable[ExternalPin] | None = None,
    ) -> None:
        self.principal = principal
        self.catalogs = catalogs
        #: None while planning; the ticket's pins while executing.
        self._ticket: dict[Key, ExternalPin] | None = (
            None if pins is None else {(str(p.catalog), p.namespace, p.table): p for p in pins}
        )
        self._tables: dict[Key, ExternalTable] = {}
        #: The Lake error a table lookup raised inside DataFusion's planning (which
        #: keeps only its text): the planner raises this one instead.
        self.error: LakeError | None = None
        #: Filters above each table's scan (execution), for the plug-in to prune by.
        self.filters: dict[Key, list[Any]] = {}
        self._lock = threading.Lock()

    def pins(self) -> tuple[ExternalPin, ...]:
        with self._lock:
            return tuple(
                ExternalPin(catalog=k[0], namespace=k[1], table=k[2], snapshot_id=t.snapshot_id)  # type: ignore[arg-type]
                for k, t in sorted(self._tables.items())
            )

    def table(self, catalog: str, namespace: str, name: str) -> Table:
        key = (catalog, namespace, name)
        try:
            with self._lock:
                found = self._tables.get(key)
                if found is None:
                    found = self._resolve(key)
                    self._tables[key] = found
            return Table(found.provider(self.filters.get(key, ())))
        except LakeError as exc:
            self.error = self.error or exc
            raise

    def resolve(self, catalog: str, namespace: str, name: str) -> ExternalTable:
        """One table resolved now, without DataFusion, with the checks of a lookup from it.

        Planning: the plug-in's current snapshot (``Planner``'s plain-projection
        fast path); execution: the ticket's pin. Memoized like a lookup.
        """
        key = (catalog, namespace, name)
        with self._lock:
            found = self._tables.get(key)
            if found is None:
                found = self._resolve(key)
                self._tables[key] = found
            return found

    def version(self, key: Key) -> str | None:
        """The metadata version of a table this request resolved (None: unknown or unresolved)."""
        with self._lock:
            found = self._tables.get(key)
        return None if found is None else getattr(found, "version", None)

    def resolve_pins(self) -> None:
        """Resolve every table the ticket pins now, without DataFusion (execution only).

        The same checks and fresh exact-snapshot loads as a lookup from
        DataFusion's planning: for a DoGet whose plain projection is known
        from planning on this replica (``Planner.execute``).
        """
        assert self._ticket is not None, "planning resolves tables through DataFusion"
        with self._lock:
            for key in sorted(self._ticket):
                if key not in self._tables:
                    self._tables[key] = self._resolve(key)

    def direct(self, schema: pa.Schema, batch_rows: int) -> Iterator[pa.RecordBatch] | None:
        """The rows of a plain projection of this request's only external table, or None."""
        with self._lock:
            tables = list(self._tables.values())
        return tables[0].batches(schema, batch_rows) if len(tables) == 1 else None

    def scan_failure(self, error: BaseException) -> LakeError | None:
        """The first typed storage fault a table's plug-in finds behind ``error``."""
        with self._lock:
            tables = list(self._tables.values())
        for table in tables:
            found = table.scan_failure(error)
            if found is not None:
                return found
        return None

    def _resolve(self, key: Key) -> ExternalTable:
        catalog, namespace, name = key
        qualified = ".".join(key)
        try:
            TableRef(namespace, name)  # InvalidName before any I/O
        except InvalidArgument:
            raise TableNotFound(qualified) from None
        if not self.principal.may_see(namespace):
            raise TableNotFound(qualified)  # hidden looks exactly like absent
        plugin = self.catalogs.get(catalog)
        if plugin is None:  # a ticket from a replica configured otherwise
            raise TableNotFound(qualified)
        if self._ticket is None:
            return plugin.plan(namespace, name)
        pin = self._ticket.get(key)
        if pin is None:  # a genuine ticket pins every table its SQL names
            raise TableNotFound(qualified)
        return plugin.pinned(namespace, name, pin.snapshot_id)

    def providers(self) -> dict[str, CatalogProvider]:
        """The DataFusion catalog of each plug-in, by its SQL catalog name."""
        return {name: _Catalog(self, name) for name in self.catalogs}


class _Schema(SchemaProvider):
    def __init__(self, tables: ExternalTables, catalog: str, namespace: str) -> None:
        self._tables = tables
        self._catalog = catalog
        self._namespace = namespace

    # datafusion-python 54 reads ``table_names`` as an attribute holding a sequence.
    @property
    def table_names(self) -> list[str]:  # type: ignore[override]
        return []  # never enumerate the external catalog

    def table(self, name: str) -> Table | None:
        return self._tables.table(self._catalog, self._namespace, name)

    def table_exist(self, name: str) -> bool:
        return False  # existence is only ever learned by an exact, authorized lookup


class _Catalog(CatalogProvider):
    def __init__(self, tables: ExternalTables, name: str) -> None:
        self._tables = tables
        self._name = name

    def schema_names(self) -> set[str]:
        return set()

    def schema(self, name: str) -> _Schema:  # type: ignore[override]
        return _Schema(self._tables, self._name, name)


def scan_filters(df: Any, catalogs: Iterable[str]) -> dict[Key, list[Any]]:
    """The filter directly above each external table's scan in ``df``'s optimized plan.

    DataFusion keeps a filter its provider cannot take above the scan, so it
    holds for every row that scan must produce. A table scanned more than
    once (a self-join), or once without a filter, gets none: one pruned
    provider serves all of a table's scans in a statement.
    """
    names = set(catalogs)
    scans: dict[Key, list[Any]] = {}

    def walk(plan: Any) -> None:
        node = plan.to_variant()
        if isinstance(node, Filter):
            below = node.input()
            below = below[0] if isinstance(below, list) else below
            scan = below.to_variant()
            if isinstance(scan, TableScan):
                key = _scan_key(scan, names)
                if key is not None:
                    scans.setdefault(key, []).append(node.predicate())
                return
        elif isinstance(node, TableScan):
            key = _scan_key(node, names)
            if key is not None:
                scans.setdefault(key, []).append(None)
        for child in plan.inputs():
            walk(child)

    try:
        walk(df.optimized_logical_plan())
    except Exception:  # a node the bindings cannot convert: prune nothing, lose no rows
        return {}
    return {k: [p[0]] for k, p in scans.items() if len(p) == 1 and p[0] is not None}


def _scan_key(scan: Any, names: set[str]) -> Key | None:
    parts = scan.fqn()
    if len(parts) != 3 or parts[0] not in names:
        return None
    return (str(parts[0]), str(parts[1]), str(parts[2]))
