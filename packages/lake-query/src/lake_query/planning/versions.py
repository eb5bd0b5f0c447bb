"""Time travel: ``t@v3``, ``t@2026-11-30T12:00:00Z`` and ``t$versions``.

A table name in SQL may carry a selector after the table's own name:

    lake.ns."t@v3"                    Lake version 3
    lake.ns."t@2026-11-30T12:00:00Z"  the version current at that instant (UTC)
    lake.ns."t$versions"              one row per retained version, with the
                                      operation ids of the appends it holds

Which versions exist comes from Lance's own history, read from the dataset
opened at the pinned head (the registry's current version), never from a
mutable pointer. Walking back from the head through each version's
transaction gives exactly the versions the registry pointed at:

    Append      a Lake version (its rows are the fragments it adds)
    Overwrite   the table's creation (Lake version 0)
    Restore(r)  written over unregistered orphans: its state is version r,
                so the walk continues at r and the orphans are never seen
    anything    maintenance (compaction, indexes): the same rows and, as
    else        Metasrv commits it, the same Lake version on a new Lance one

The walk stops at the first version retention has reclaimed, so the listing
is the retained window, and a version older than it is VersionReclaimed.
``committed_at`` is Lance's commit time, taken just before the registry made
the version visible. Planning reads each step from the small ends of Lance's
files rather than the whole manifest, and through Lance only what those do
not settle (:mod:`lake_query.planning.version_files`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

import lance
import pyarrow as pa

from lake_core.errors import InvalidArgument, LakeError, VersionReclaimed
from lake_core.ids import operation_time_ms
from lake_core.models import TableDescriptor
from lake_core.names import TableRef

__all__ = [
    "VERSIONS_SCHEMA",
    "VERSIONS_SELECTOR",
    "RetainedVersion",
    "Step",
    "StepReader",
    "TableName",
    "history",
    "lance_steps",
    "operation_ids",
    "parse_table_name",
    "resolve",
    "versions_table",
]

#: The selector of the metadata table listing a table's versions.
VERSIONS_SELECTOR: Final = "$versions"

Operation = Literal["create", "append", "maintenance"]

VERSIONS_SCHEMA: Final = pa.schema(
    [
        pa.field("version", pa.int64(), nullable=False),
        pa.field("committed_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("operation", pa.string(), nullable=False),
        pa.field("rows_added", pa.int64(), nullable=False),
        pa.field("engine_version", pa.int64(), nullable=False),
        # The appends a version holds (a commit group: one or more operation ids).
        pa.field("operation_ids", pa.list_(pa.string()), nullable=False),
    ]
)
#: The Lance transaction property where Metasrv names a version's appends
#: (lake_metasrv.engine.OPERATION_IDS_PROPERTY).
_OPERATION_IDS_PROPERTY: Final = "lake.operation_ids"

_VERSION = re.compile(r"v([0-9]{1,18})")
# ASCII digits only: Python's \d also matches other scripts' digits (٦, ６), which int()
# reads as numbers, so "t@v٦" would have read version 6.
_INSTANT = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})",
    re.ASCII,
)


#: Which operations make a new Lake version. Maintenance moves the current
#: Lake version to a new Lance version (RegistryStore.commit_maintenance).
_NEW_LAKE_VERSION: Final = frozenset({"append"})


@dataclass(frozen=True)
class TableName:
    """A table name as SQL wrote it: the table, and what it selects of it."""

    name: str
    #: The text after the name (``@v3``, ``@<instant>``, ``$versions``), or None.
    selector: str | None = None
    version: int | None = None
    instant: datetime | None = None

    @property
    def listing(self) -> bool:
        return self.selector == VERSIONS_SELECTOR


def parse_table_name(text: str) -> TableName:
    """Split ``t@v3`` / ``t@<RFC 3339 UTC>`` / ``t$versions``; InvalidArgument if malformed."""
    at, dollar = text.find("@"), text.find("$")
    if at < 0 and dollar < 0:
        return TableName(text)
    cut = min(i for i in (at, dollar) if i >= 0)
    name, selector = text[:cut], text[cut:]
    shown = repr(text[:120])
    if selector == VERSIONS_SELECTOR:
        return TableName(name, selector)
    if selector.startswith("$"):
        raise InvalidArgument(
            f"table name {shown}: unknown metadata table {selector!r}; "
            f"the one metadata table is {VERSIONS_SELECTOR!r}"
        )
    wanted = selector[1:]
    number = _VERSION.fullmatch(wanted)
    if number:
        return TableName(name, selector, version=int(number.group(1)))
    return TableName(name, selector, instant=_parse_instant(wanted, shown))


def _parse_instant(text: str, shown: str) -> datetime:
    found = _INSTANT.fullmatch(text)
    if found is None:
        raise InvalidArgument(
            f"table name {shown}: after '@' write a version (@v3) or a UTC instant in "
            "RFC 3339 form (@2026-11-30T12:00:00Z)"
        )
    year, month, day, hour, minute, second, fraction, offset = found.groups()
    if offset not in ("Z", "z", "+00:00", "-00:00"):
        raise InvalidArgument(
            f"table name {shown}: the instant must be in UTC (end it with Z), not {offset}"
        )
    try:
        return datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            int(second),
            int((fraction or "0").ljust(6, "0")[:6]),
            tzinfo=UTC,
        )
    except ValueError:
        raise InvalidArgument(
            f"table name {shown}: {text!r} is not a valid date and time"
        ) from None


@dataclass(frozen=True)
class RetainedVersion:
    """One version a table can still be read at."""

    version: int
    engine_version: int
    committed_at: datetime
    operation: Operation
    rows_added: int
    #: The appends the version holds (empty for create and maintenance).
    operation_ids: tuple[str, ...] = ()


def _committed_at(info: dict[str, Any]) -> datetime:
    stamp: datetime = info["timestamp"]
    # Lance gives local wall-clock time without a zone; astimezone reads it as local.
    return stamp.astimezone(UTC)


@dataclass(frozen=True)
class Step:
    """What a walk needs of one Lance version: what its transaction did, and when."""

    committed_at: datetime
    #: ``restore``: a Restore, whose state is the version it names (never listed).
    kind: Operation | Literal["restore"]
    rows_added: int
    operation_ids: tuple[str, ...]
    #: The version the walk goes to next: the transaction's read version, or a Restore's target.
    previous: int


#: Reads one Lance version's :class:`Step` (None: reclaimed, before or while we walked).
StepReader = Callable[[int], Step | None]


def lance_steps(dataset: Any) -> StepReader:
    """Reads each step through Lance: the version's manifest, then its transaction.

    Lance's read_transaction borrows its dataset mutably: on the pinned dataset
    that concurrent queries share, any of them touching it meanwhile fails with
    "Already borrowed". Each step reads through a handle of its own.
    """

    def read(current: int) -> Step | None:
        try:
            own = dataset.checkout_version(current)
            info = own.get_version()
            transaction = own.read_transaction(current)
        except (OSError, ValueError):
            return None
        if transaction is None:
            return None
        operation = transaction.operation
        if isinstance(operation, lance.LanceOperation.Restore):
            return Step(_committed_at(info), "restore", 0, (), int(operation.version))
        kind: Operation
        held: tuple[str, ...] = ()
        if isinstance(operation, lance.LanceOperation.Append):
            kind, added = "append", sum(int(f.physical_rows) for f in operation.fragments)
            held = operation_ids(transaction.transaction_properties or {})
        elif isinstance(operation, lance.LanceOperation.Overwrite):
            kind, added = "create", int(info["metadata"].get("total_rows", 0))
        else:
            kind, added = "maintenance", 0
        return Step(_committed_at(info), kind, added, held, int(transaction.read_version))

    return read


def operation_ids(properties: Mapping[str, str]) -> tuple[str, ...]:
    """The appends an Append's transaction properties name (Metasrv's commit group)."""
    return tuple(i for i in properties.get(_OPERATION_IDS_PROPERTY, "").split(",") if i)


def history(
    dataset: Any, head: TableDescriptor, steps: StepReader | None = None
) -> Iterator[RetainedVersion]:
    """The retained versions at or before ``head``, newest first, read as far as asked.

    ``dataset`` is the table opened at ``head.engine_version``. Each step reads
    one version's manifest and transaction (``steps``, by default through
    Lance), so resolving a version near the head costs a few reads whatever
    the table retains (listing every version, as Lance's ``versions()`` does,
    read every retained manifest on each plan, and failed with "Not found"
    when retention deleted one meanwhile). A version that retention reclaimed
    ends the walk.
    """
    read = steps or lance_steps(dataset)
    current, version = head.engine_version, head.version
    while version >= 0:
        step = read(current)
        if step is None:
            return  # reclaimed (before or while we walked)
        if step.kind == "restore":
            current = step.previous
            continue
        yield RetainedVersion(
            version, current, step.committed_at, step.kind, step.rows_added, step.operation_ids
        )
        if step.kind == "create":
            return
        if step.kind in _NEW_LAKE_VERSION:
            version -= 1
        current = step.previous


def resolve(
    table: TableRef,
    head: TableDescriptor,
    versions: Iterator[RetainedVersion],
    wanted: TableName,
    now: datetime | None = None,
) -> TableDescriptor:
    """The exact version ``wanted`` selects, as a pin."""
    if wanted.version is not None:
        if wanted.version > head.version:
            raise InvalidArgument(
                f"{table.qualified} has no version {wanted.version}: "
                f"its latest version is {head.version}"
            )
        found = next((v for v in versions if v.version <= wanted.version), None)
        if found is None or found.version != wanted.version:
            raise VersionReclaimed(
                f"{table.qualified} version {wanted.version} is no longer available: "
                "retention reclaimed it"
            )
        return _pin(head, found)
    if wanted.instant is None:
        raise InvalidArgument(f"{table.qualified}: nothing to select in {wanted.selector!r}")
    instant = wanted.instant
    shown = _rfc3339(instant)
    if instant > (now or datetime.now(UTC)):
        raise InvalidArgument(f"{table.qualified}@{shown}: that instant is in the future")
    oldest: RetainedVersion | None = None
    for candidate in versions:
        if candidate.committed_at <= instant:
            return _pin(head, candidate)
        oldest = candidate
    created = oldest.committed_at if oldest is not None and oldest.operation == "create" else None
    if created is None:
        # The creation version is reclaimed: the incarnation id (a UUIDv7 minted as the
        # table was created) still says when the table began.
        created = _created_at(head)
    if created is not None and instant < created:
        raise InvalidArgument(
            f"{table.qualified} did not exist at {shown}: it was created at {_rfc3339(created)}"
        )
    raise VersionReclaimed(
        f"{table.qualified}: the version current at {shown} is no longer available: "
        "retention reclaimed it"
    )


def _created_at(head: TableDescriptor) -> datetime | None:
    """When ``head``'s table was created, from its incarnation id (None: not a UUIDv7)."""
    try:
        millis = operation_time_ms(head.incarnation)
    except LakeError:
        return None
    return datetime.fromtimestamp(millis / 1000, UTC)


def _pin(head: TableDescriptor, found: RetainedVersion) -> TableDescriptor:
    return head.model_copy(
        update={"version": found.version, "engine_version": found.engine_version}
    )


def _rfc3339(instant: datetime) -> str:
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")


def versions_table(versions: Iterator[RetainedVersion]) -> pa.Table:
    """The ``$versions`` rows, oldest first."""
    rows = sorted(versions, key=lambda v: v.engine_version)
    return pa.table(
        {
            "version": [v.version for v in rows],
            "committed_at": [v.committed_at for v in rows],
            "operation": [v.operation for v in rows],
            "rows_added": [v.rows_added for v in rows],
            "engine_version": [v.engine_version for v in rows],
            "operation_ids": [list(v.operation_ids) for v in rows],
        },
        schema=VERSIONS_SCHEMA,
    )
