"""The transport ceiling under Lake's commit figures: Metasrv that answers without committing.

``commit_16_writers`` compares Metasrv with raw Lance appends in process.
Metasrv receives each append over its Flight server (grpcio, in Python),
authenticates it, decodes its Arrow stream and checks its rows before any
commit starts; none of that is in the raw loop. This server is the real
``lake meta`` with one change: an append that passed every check is
answered at once with the version it would have become (the next one) and
nothing is written. Driven exactly as Metasrv is, its rate is the most any
commit path behind this transport could reach on the same machine, with
the writers' own processes sharing it.

Run it as ``python -m tools.bench.null_meta --addr HOST:PORT --data-dir DIR``
(a child process, started and stopped by pid like Metasrv); tables are
created for real, appends are not. Never deploy it: it acknowledges appends
it does not keep.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from lake_core.protocol import AppendCommand, AppendResult
from lake_metasrv import cli
from lake_metasrv.appends import CheckedRows
from lake_metasrv.commits import CommitCoordinator
from lake_metasrv.engine.base import PreparedAppend
from lake_objects.scope import TenantScope


class AnswerAtOnce(CommitCoordinator):
    """A coordinator whose checked appends are answered without a commit."""

    async def _enqueue(
        self,
        command: AppendCommand,
        schema: pa.Schema,
        batches: Sequence[pa.RecordBatch],
        rows: int,
        op_time: int,
        scope: TenantScope,
        checked: CheckedRows,
        prepared: PreparedAppend | None,
    ) -> AppendResult:
        record = self._seen[command.table]  # set by the checks every append passed
        return AppendResult(
            table=command.table,
            operation_id=command.operation_id,
            version=record.version + 1,
            descriptor=record.descriptor(),
        )


def main() -> None:
    # ``lake meta`` builds its coordinator with CommitCoordinator.local(...).
    cli.CommitCoordinator = AnswerAtOnce  # type: ignore[misc]
    cli.meta()


if __name__ == "__main__":
    main()
