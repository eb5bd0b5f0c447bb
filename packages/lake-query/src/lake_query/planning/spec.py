"""What a ticket seals: the SQL, its pinned tables and its bound parameters."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict

from lake_core.errors import InvalidArgument
from lake_core.models import TableDescriptor
from lake_core.names import TableRef

__all__ = [
    "MAX_PARAMETER_BYTES",
    "ExternalPin",
    "PinnedTable",
    "PlannedQuery",
    "QuerySpec",
    "statement_pins",
]

MAX_PARAMETER_BYTES = 64 * 1024


class PinnedTable(BaseModel):
    """One table of a query, pinned to an exact physical version."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    table: TableRef
    descriptor: TableDescriptor
    #: What the SQL selected after the table's name (``@v3``, ``@<instant>``,
    #: ``$versions``); None for the current version. Two selectors of one
    #: table are two pins.
    selector: str | None = None

    @property
    def name(self) -> str:
        """The table name as the SQL wrote it (``t``, ``t@v3``, ``t$versions``)."""
        return self.table.name + (self.selector or "")


class ExternalPin(BaseModel):
    """One external table of a query (``iceberg.<namespace>.<table>``) at an exact snapshot.

    Only identities: no location, endpoint, warehouse or credential. ``snapshot_id``
    is None for a table that had no snapshot yet when planned.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    catalog: Literal["iceberg"]
    namespace: str
    table: str
    snapshot_id: int | None

    @property
    def qualified(self) -> str:
        return f"{self.catalog}.{self.namespace}.{self.table}"


class QuerySpec(BaseModel):
    """A query as a ticket carries it: SQL, pinned tables, bound parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    sql: str
    pins: tuple[PinnedTable, ...] = ()
    params_ipc: str | None = None
    #: External (Iceberg) tables at their pinned snapshots.
    external: tuple[ExternalPin, ...] = ()

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
    #: Fragment ids of each endpoint of a partitioned scan; () for one endpoint.
    partitions: tuple[tuple[int, ...], ...] = ()


def statement_pins(spec: QuerySpec) -> tuple[tuple[PinnedTable, ...], tuple[ExternalPin, ...]]:
    """Everything a planned statement is pinned to: native versions and external snapshots.

    What a durable job must carry to run the statement later exactly as planned
    (``Planner.execute`` takes the same ``QuerySpec``).
    """
    return spec.pins, spec.external
