"""What async-job unit tests run in place of a Query replica's executor."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from lake_core.principal import Principal
from lake_query.planning import QuerySpec

__all__ = ["ONE_COLUMN", "GatedExecute"]

#: The schema of every batch a :class:`GatedExecute` stream yields.
ONE_COLUMN = pa.schema([("n", pa.int64())])


class GatedExecute:
    """An ``execute()`` whose streams wait for ``gate``: jobs stay running until it is set.

    Records who started a stream and with what SQL, in start order.
    """

    def __init__(self) -> None:
        self.tenants: list[str] = []
        self.sqls: list[str] = []
        self.gate = threading.Event()

    def __call__(self, spec: QuerySpec, principal: Principal) -> Any:
        self.tenants.append(principal.tenant_id)
        self.sqls.append(spec.sql)
        gate = self.gate

        class Stream:
            def __iter__(self) -> Iterator[pa.RecordBatch]:
                gate.wait(30)
                yield pa.record_batch([pa.array([1])], schema=ONE_COLUMN)

            def close(self) -> None:
                pass

        return Stream()
