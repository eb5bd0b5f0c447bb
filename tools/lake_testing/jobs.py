"""What async-job unit tests run in place of a Query replica's executor, and their records."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from lake_core.principal import Principal
from lake_query.jobs.model import JobRecord
from lake_query.planning import QuerySpec

__all__ = ["ONE_COLUMN", "GatedExecute", "job_record"]

#: The schema of every batch a :class:`GatedExecute` stream yields.
ONE_COLUMN = pa.schema([("n", pa.int64())])


def job_record(job_id: str, tenant: str = "t", state: str = "pending") -> JobRecord:
    """A job record as a submission stores it, submitted now, kept for an hour."""
    now = time.time()
    return JobRecord(
        job_id=job_id,
        tenant_key=tenant,
        request_digest="d",
        sealed="",
        state=state,  # type: ignore[arg-type]
        submitted_at=now,
        expires_at=now + 3600,
        max_result_bytes=1 << 30,
    )


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
