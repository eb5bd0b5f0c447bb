"""Ray Data over Lake: one read task per Flight endpoint of one pinned plan.

Needs the ``ray`` extra (Ray Data; without it, importing this module raises
:class:`~lake_sdk.errors.MissingExtra` naming the ``pip install`` to run)::

    import ray
    from lake_sdk.ray import read_lake

    dataset = read_lake("SELECT * FROM robots.steps", url="grpc://query:50051")
    for batch in dataset.iter_batches(batch_format="pyarrow", batch_size=65536):
        ...

:func:`read_lake` plans the statement ONCE, in the calling process: Query pins
every table it names to one version and answers with its endpoints, each a
sealed ticket redeemable on any replica. Each endpoint becomes one Ray read
task, so wherever Ray schedules a task, on whichever machine, it reads the
same pinned rows; a retried task reads its endpoint again from the start
(Ray drops the blocks of a failed attempt), so every row arrives once. Plain
scans of one table split into several endpoints (fragment ranges); other
statements (ORDER BY, aggregates, LIMIT, joins) are one endpoint and so one
task.

Tickets expire (``LAKE_QUERY_TICKET_TTL_SECS``, 5 minutes by default): a
dataset is meant to be read soon after it is made. Call :func:`read_lake`
again for a later epoch, or pin the versions with ``as_of`` so that every
epoch reads the same rows.

Credentials: the bearer token travels to the workers inside the pickled read
tasks (a worker must present it to Query), and nowhere else: not in task
names, the datasource's ``repr``, Ray's logs or the dataset's ``repr``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from lake_core.errors import InvalidArgument
from lake_sdk._errors import calling, lake_error
from lake_sdk._frames import require_extra
from lake_sdk._sync import Client
from lake_sdk._transport import Connection, ConnectOptions

require_extra("ray", "ray", "Ray Data reads of Lake")
import ray.data  # noqa: E402  (after the check above, which names the install)
from ray.data.block import BlockMetadata  # noqa: E402
from ray.data.datasource import Datasource, ReadTask  # noqa: E402

__all__ = ["BLOCK_BYTES", "LakeDatasource", "read_lake"]

#: Ray Data's own default ``DataContext.target_max_block_size``: the block
#: size a read task aims at when Ray's context does not say.
BLOCK_BYTES = 128 * 1024 * 1024


class _Credentials:
    """A client's credentials on their way to Ray's workers.

    Unlike :class:`~lake_core.auth.Secret`, this pickles its token: Ray
    pickles each read task to ship it, and a worker must present the token.
    It never shows the token in a ``repr`` or ``str``.
    """

    __slots__ = ("_token", "ca_pem", "server_name")

    def __init__(self, token: str | None, ca_pem: bytes | None, server_name: str | None) -> None:
        self._token = token
        self.ca_pem = ca_pem
        self.server_name = server_name

    def options(self) -> ConnectOptions:
        return ConnectOptions.create(
            token=self._token, ca_pem=self.ca_pem, server_name=self.server_name
        )

    def __repr__(self) -> str:
        token = "***" if self._token is not None else None
        return f"_Credentials(token={token}, server_name={self.server_name!r})"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        return (_Credentials, (self._token, self.ca_pem, self.server_name))


def _read_endpoint(
    url: str, credentials: _Credentials, endpoint: bytes, block_bytes: int
) -> Iterator[pa.Table]:
    """Stream one endpoint (a serialized FlightEndpoint) as contiguous blocks.

    A block is yielded once more than ``block_bytes`` have arrived (the
    context's ``target_max_block_size``: Ray merges smaller outputs of a task
    into one block and passes a bigger one on as it is), and its columns are
    combined into one chunk here, in the worker: ``iter_batches`` slices a
    single-chunk block without copying, but copies every multi-chunk block it
    slices (Query sends 1-4 MB batches) in the consuming process.
    """
    point = flight.FlightEndpoint.deserialize(endpoint)
    connection = Connection(url, credentials.options()).at(point.locations)
    pending: list[pa.RecordBatch] = []
    size = 0
    with calling() as trailers:
        try:
            reader = connection.do_get(point.ticket)
            while True:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    break
                batch = chunk.data
                if batch is None or batch.num_rows == 0:
                    continue
                pending.append(batch)
                size += batch.nbytes
                if size > block_bytes:
                    yield _contiguous(pending)
                    pending, size = [], 0
        except (flight.FlightError, pa.ArrowException) as exc:
            raise lake_error(exc, trailers) from None
    if pending:
        yield _contiguous(pending)


def _contiguous(batches: list[pa.RecordBatch]) -> pa.Table:
    table = pa.Table.from_batches(batches)
    return table.combine_chunks() if len(batches) > 1 else table


class LakeDatasource(Datasource):
    """The endpoints of one pinned plan, one Ray read task each.

    Planning happens here, in the constructor (Ray calls
    :meth:`get_read_tasks` several times a run, so it does no I/O).
    """

    def __init__(
        self,
        sql: str,
        *,
        url: str,
        token: str | None = None,
        ca_pem: bytes | str | None = None,
        server_name: str | None = None,
        as_of: int | datetime | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        options = ConnectOptions.create(token=token, ca_pem=ca_pem, server_name=server_name)
        with Client(url, token=token, ca_pem=ca_pem, server_name=server_name) as client:
            info = client.plan(sql, as_of=as_of)
        self._url = url
        self._credentials = _Credentials(token, options.ca_pem, options.server_name)
        self._schema: pa.Schema = info.schema
        self._endpoints: list[bytes] = [e.serialize() for e in info.endpoints]
        self._rows = info.total_records if info.total_records >= 0 else None
        self._bytes = info.total_bytes if info.total_bytes >= 0 else None

    def __repr__(self) -> str:
        return f"LakeDatasource({self._url!r}, endpoints={len(self._endpoints)})"

    @property
    def schema(self) -> pa.Schema:
        """The statement's result schema, as Query planned it."""
        return self._schema

    @property
    def endpoint_count(self) -> int:
        return len(self._endpoints)

    def get_name(self) -> str:
        return "Lake"

    def estimate_inmemory_data_size(self) -> int | None:
        return self._bytes

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: Any = None,
    ) -> list[ReadTask]:
        # One task per endpoint whatever ``parallelism`` asks: an endpoint is
        # the unit Query pinned and sealed; splitting or merging them would
        # need another plan.
        count = len(self._endpoints)
        rows = None if self._rows is None or count == 0 else -(-self._rows // count)
        size = None if self._bytes is None or count == 0 else -(-self._bytes // count)
        url, credentials = self._url, self._credentials
        block_bytes = getattr(data_context, "target_max_block_size", None) or BLOCK_BYTES
        tasks = []
        for endpoint in self._endpoints:
            metadata = BlockMetadata(
                num_rows=rows, size_bytes=size, exec_stats=None, input_files=None
            )
            tasks.append(
                ReadTask(
                    _reader(url, credentials, endpoint, block_bytes),
                    metadata,
                    schema=self._schema,
                    per_task_row_limit=per_task_row_limit,
                )
            )
        return tasks


def _reader(url: str, credentials: _Credentials, endpoint: bytes, block_bytes: int) -> Any:
    def read() -> Iterator[pa.Table]:
        return _read_endpoint(url, credentials, endpoint, block_bytes)

    return read


def read_lake(
    sql: str,
    *,
    url: str,
    token: str | None = None,
    ca_pem: bytes | str | None = None,
    server_name: str | None = None,
    as_of: int | datetime | None = None,
    columns: Sequence[str] | None = None,
    limit: int | None = None,
    num_cpus: float | None = None,
    concurrency: int | None = None,
    ray_remote_args: dict[str, Any] | None = None,
) -> ray.data.Dataset:
    """A Ray Dataset of ``sql``'s result, one read task per endpoint of one pinned plan.

    ``columns`` keeps only those result columns and ``limit`` at most that
    many rows; both are applied by Query when it plans, so no worker reads
    more. ``as_of`` (a version or an aware datetime) reads every table as of
    then.

    ``num_cpus`` is what each read task reserves (Ray's default: one CPU). A
    read task mostly waits on Query, which decodes the table, so where CPUs
    are scarce give it less; with ``num_cpus=0`` the tasks also start at once
    instead of one at a time while Ray Data still learns the cluster's
    resources (the first second of an execution). ``concurrency`` caps how
    many read tasks run at once (say, with ``num_cpus=0``). Neither changes
    the tasks or their rows. Other ``ray_remote_args`` go to the read tasks
    as Ray takes them (Ray 2.60 warns that this argument is deprecated).
    """
    statement = _shaped(sql, columns, limit)
    _check_resources(num_cpus, concurrency)
    source = LakeDatasource(
        statement, url=url, token=token, ca_pem=ca_pem, server_name=server_name, as_of=as_of
    )
    # Only what was given: Ray warns on any ``ray_remote_args``, even an empty one.
    options: dict[str, Any] = {}
    if ray_remote_args:
        options["ray_remote_args"] = ray_remote_args
    dataset: ray.data.Dataset = ray.data.read_datasource(
        source,
        override_num_blocks=max(1, source.endpoint_count),
        num_cpus=None if num_cpus is None else float(num_cpus),
        concurrency=concurrency,
        **options,
    )
    return dataset


def _check_resources(num_cpus: float | None, concurrency: int | None) -> None:
    if num_cpus is not None and (
        type(num_cpus) not in (int, float) or not math.isfinite(num_cpus) or num_cpus < 0
    ):
        raise InvalidArgument(f"num_cpus must be a number >= 0, got {num_cpus!r}")
    if concurrency is not None and (type(concurrency) is not int or concurrency < 1):
        raise InvalidArgument(f"concurrency must be an int >= 1, got {concurrency!r}")


def _shaped(sql: str, columns: Sequence[str] | None, limit: int | None) -> str:
    if not isinstance(sql, str) or not sql.strip():
        raise InvalidArgument("SQL must be a non-empty string")
    if columns is None and limit is None:
        return sql
    if columns is not None:
        if isinstance(columns, str) or not columns or not all(isinstance(c, str) for c in columns):
            raise InvalidArgument("columns must be a non-empty list of column names")
        projection = ", ".join('"' + c.replace('"', '""') + '"' for c in columns)
    else:
        projection = "*"
    if limit is not None and (type(limit) is not int or limit < 0):
        raise InvalidArgument(f"limit must be an int >= 0, got {limit!r}")
    body = sql.strip().rstrip(";")
    # On lines of their own: a trailing -- comment in ``sql`` ends at its newline.
    shaped = f"SELECT {projection} FROM (\n{body}\n) AS lake_read"
    return shaped if limit is None else f"{shaped} LIMIT {limit}"
