"""Prepared statements: stateless sealed handles carrying SQL and bound values.

A handle is sealed to its caller like a ticket, so no replica keeps
statement state: any replica can plan it, bind parameters to it (a DoPut
that returns a new handle) or run it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pyarrow as pa

from lake_core.errors import InvalidArgument
from lake_core.flight.encoding import FlightDataDecoder, InvalidFlightData
from lake_core.principal import Principal
from lake_core.proto import flight_pb2 as pb
from lake_core.proto import flight_sql_pb2 as sql_pb
from lake_core.tickets import TicketSealer
from lake_query.flightsql.wire import PREPARED
from lake_query.planning import QuerySpec

__all__ = ["MAX_PARAMETER_MESSAGE_BYTES", "PreparedStatements"]

#: Largest parameter upload a bind accepts.
MAX_PARAMETER_MESSAGE_BYTES = 4 * 1024 * 1024


class PreparedStatements:
    """Seals and opens prepared-statement handles; binds parameters."""

    def __init__(self, sealer: TicketSealer, max_bytes: int) -> None:
        self._sealer = sealer
        self._max_bytes = max_bytes

    def open(self, handle: bytes, principal: Principal) -> QuerySpec:
        # Handles carry SQL: the SQL size limit bounds them too.
        if len(handle) > self._max_bytes:
            raise InvalidArgument(f"the statement handle exceeds {self._max_bytes} bytes")
        body = self._sealer.open(handle, principal)
        if body.get("k") != PREPARED or not isinstance(body.get("sql"), str):
            raise InvalidArgument("not a Lake prepared statement handle")
        params = body.get("params")
        return QuerySpec(sql=body["sql"], params_ipc=params if isinstance(params, str) else None)

    def seal(self, spec: QuerySpec, principal: Principal) -> bytes:
        return self._sealer.seal(
            principal, {"k": PREPARED, "sql": spec.sql, "params": spec.params_ipc}
        )

    async def bind(
        self,
        command: sql_pb.CommandPreparedStatementQuery,
        first: pb.FlightData,
        messages: AsyncIterator[pb.FlightData],
        principal: Principal,
    ) -> pb.PutResult:
        """Bind parameters: a new sealed handle carrying SQL and values."""
        spec = self.open(command.prepared_statement_handle, principal)
        decoder = FlightDataDecoder(
            max_bytes=MAX_PARAMETER_MESSAGE_BYTES, too_large=InvalidArgument
        )
        batches: list[pa.RecordBatch] = []
        try:
            batches += decoder.feed(first)
            async for message in messages:
                batches += decoder.feed(message)
        except InvalidFlightData as exc:
            raise InvalidArgument(f"invalid parameter data: {exc}") from None
        params = None
        if decoder.schema is not None and decoder.schema.names:
            table = pa.Table.from_batches(batches, schema=decoder.schema)
            if table.num_rows:
                params = table.combine_chunks().to_batches()[0]
        bound = QuerySpec(sql=spec.sql, params_ipc=QuerySpec.encode_parameters(params))
        result = sql_pb.DoPutPreparedStatementResult(
            prepared_statement_handle=self.seal(bound, principal)
        )
        return pb.PutResult(app_metadata=result.SerializeToString())
