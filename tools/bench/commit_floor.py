"""The floor under Lake's commit figures: a server that does nothing but make Lance versions.

Lake's commit goals compare Metasrv with references that run in process. Any
Metasrv, however built, receives each append over Flight and makes it one
Lance version; this server does exactly that and nothing more, so its rate
is the most Lake could reach on the same machine and storage:

- transport: pyarrow's C++ Flight server and client (less work per call than
  Metasrv's grpcio, so the floor is generous to Lake);
- DoPut: the batch becomes a Lance fragment (written concurrently with other
  appends), then the dataset's next version, committed under a per-dataset
  lock on the kept handle with ``read_version``, as Metasrv's committer does;
- with ``registry=True`` (cloud): then the raw chain's registry step, a
  conditional update of the table's head version in DynamoDB, still under
  the lock: the visibility point every append needs;
- with ``durable=True`` (local roots): the fsyncs Lake makes of Lance's own
  files, with Lake's own tracker (:class:`~lake_metasrv.engine.local.LocalWrittenFiles`),
  in Lake's one pass after the Lance commit: the data files, the new manifest
  and transaction files, and their directories; nothing of Lake's own records;
- not done: authentication, the replay check, row checks, the rest of the
  registry's records, reference-delta sidecars, digests, retention (and,
  unless ``durable``, fsync).

Run it with :class:`FloorServer` (a child process, stopped by its pid) and
drive it with :func:`floor_rate`. Its root is a local directory or an
``s3://bucket/prefix``; for S3 the child reads the same ``LAKE_S3_*`` and
DynamoDB manifest settings as Metasrv (``DatasetStorage.from_env``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

import lance
import pyarrow as pa
import pyarrow.flight as flight

from lake_core.cloud import DatasetStorage
from lake_metasrv.engine.local import LocalWrittenFiles
from lake_metasrv.registry.dynamo_layout import REGISTRY_SCHEMA
from tools.bench.harness import timed_threads

__all__ = ["SCHEMA", "FloorServer", "floor_latencies", "floor_rate", "one_row_batch"]

#: The commit benchmarks' table: Lake's side, the references and the floor append to it.
SCHEMA = pa.schema([("id", pa.int64()), ("value", pa.float64())])
_CREATE = "create"
_REGISTRY_FLAG = "--registry"
_DURABLE_FLAG = "--durable"


def one_row_batch(row: int) -> pa.RecordBatch:
    """The one-row batch every commit benchmark appends for ``row``."""
    return pa.RecordBatch.from_pydict({"id": [row], "value": [row * 0.5]}, schema=SCHEMA)


class _Registry:
    """The raw chain's registry step on DynamoDB (``AWS_ENDPOINT_URL_DYNAMODB``), a fresh table."""

    def __init__(self, endpoint: str, region: str) -> None:
        import boto3

        self._client = boto3.client(
            "dynamodb",
            endpoint_url=endpoint,
            region_name=region,
            aws_access_key_id="floor",
            aws_secret_access_key="floor",
        )
        self._table = f"floor_registry_{uuid.uuid4().hex[:8]}"
        self._client.create_table(
            TableName=self._table, BillingMode="PAY_PER_REQUEST", **REGISTRY_SCHEMA
        )
        self._client.get_waiter("table_exists").wait(
            TableName=self._table, WaiterConfig={"Delay": 0.2}
        )

    def _head(self, name: str) -> dict[str, Any]:
        return {"pk": {"S": name}, "sk": {"S": "head"}}

    def create(self, name: str) -> None:
        self._client.put_item(TableName=self._table, Item={**self._head(name), "v": {"N": "0"}})

    def commit(self, name: str, version: int) -> None:
        """Move the head from ``version - 1`` to ``version``, or fail."""
        self._client.update_item(
            TableName=self._table,
            Key=self._head(name),
            UpdateExpression="SET v = :next",
            ConditionExpression="v = :current",
            ExpressionAttributeValues={
                ":next": {"N": str(version)},
                ":current": {"N": str(version - 1)},
            },
        )


class _Service(flight.FlightServerBase):  # type: ignore[misc]
    """DoAction ``create`` makes an empty dataset; DoPut appends its batch as the next version."""

    def __init__(
        self,
        root: str,
        storage: DatasetStorage | None,
        registry: _Registry | None,
        durable: bool = False,
    ) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self._durable = durable
        self._root = root.rstrip("/")
        self._storage = storage
        self._registry = registry
        self._datasets: dict[str, Any] = {}
        self._options: dict[str, dict[str, str] | None] = {}
        self._locks: dict[str, threading.Lock] = {}

    def do_action(self, context: Any, action: flight.Action) -> Iterator[bytes]:
        if action.type != _CREATE:
            raise flight.FlightServerError(f"unknown action {action.type!r}")
        name = action.body.to_pybytes().decode()
        location = f"{self._root}/{name}.lance"
        uri, options = location, None
        if self._storage is not None:
            uri = self._storage.lance_uri(location)
            options = self._storage.storage_options(location)
        self._datasets[name] = lance.write_dataset(
            SCHEMA.empty_table(), uri, schema=SCHEMA, mode="create", storage_options=options
        )
        self._options[name] = options
        self._locks[name] = threading.Lock()
        if self._registry is not None:
            self._registry.create(name)
        return iter([])

    def do_put(
        self,
        context: Any,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        name = descriptor.path[0].decode()
        received = reader.read_all()
        # Buffers received over Flight are not aligned as Lance's writer requires.
        table = pa.Table.from_pydict(received.to_pydict(), schema=SCHEMA)
        options = self._options[name]
        fragments = lance.fragment.write_fragments(
            table, self._datasets[name], storage_options=options
        )
        written = LocalWrittenFiles(Path(self._root) / f"{name}.lance") if self._durable else None
        with self._locks[name]:
            if written is not None:
                written.before_commits()
            dataset = self._datasets[name]
            dataset = lance.LanceDataset.commit(
                dataset,
                lance.LanceOperation.Append(fragments),
                read_version=dataset.version,
                storage_options=options,
            )
            if written is not None:
                written.sync_commits(fragments)
            self._datasets[name] = dataset
            version = dataset.version - 1  # Lance's version 1 is the empty dataset
            if self._registry is not None:
                self._registry.commit(name, version)
        writer.write(pa.py_buffer(str(version).encode()))


class FloorServer:
    """The floor server as a child process: ``with FloorServer(root) as floor: floor.port``."""

    def __init__(
        self,
        root: str | Path,
        env: Mapping[str, str] | None = None,
        *,
        registry: bool = False,
        durable: bool = False,
    ) -> None:
        self.root = str(root)
        self._env = dict(os.environ if env is None else env)
        self._registry = registry
        self._durable = durable
        self._process: subprocess.Popen[str] | None = None
        self.port = 0

    def __enter__(self) -> FloorServer:
        return self.start()

    def start(self) -> FloorServer:
        """Start the child and wait until it listens."""
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tools.bench.commit_floor",
                self.root,
                *([_REGISTRY_FLAG] if self._registry else []),
                *([_DURABLE_FLAG] if self._durable else []),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=self._env,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline()  # the port once it listens; "" if it died
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"the commit floor server did not start (said {line!r})")
        self.port = int(line)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()
        self._process = None


def floor_rate(port: int, tables: int, count: int, in_flight: int) -> float:
    """Appends/s of ``count`` one-row appends over fresh ``tables``, ``in_flight`` per table.

    Spread and driven as the benchmarks drive Metasrv: the datasets are
    created first, untimed; each writer sends its table's next row and waits
    for the version before sending another.
    """
    address = f"grpc://127.0.0.1:{port}"
    names = [uuid.uuid4().hex for _ in range(tables)]
    with flight.FlightClient(address) as client:
        for name in names:
            list(client.do_action(flight.Action(_CREATE, name.encode())))
    queues: dict[str, list[int]] = {name: [] for name in names}
    for row in range(count):
        queues[names[row % tables]].append(row)
    lock = threading.Lock()

    def writer(name: str) -> None:
        with flight.FlightClient(address) as client:
            while True:
                with lock:
                    if not queues[name]:
                        return
                    row = queues[name].pop()
                put, answer = client.do_put(flight.FlightDescriptor.for_path(name), SCHEMA)
                put.write_batch(one_row_batch(row))
                put.done_writing()
                if answer.read() is None:
                    raise RuntimeError("the floor server answered an append with nothing")
                put.close()

    writers = [partial(writer, name) for name in names for _ in range(in_flight)]
    return count / timed_threads(writers)


def floor_latencies(port: int, count: int) -> list[float]:
    """Seconds each of ``count`` one-row appends took, one writer, one after another, one table."""
    address = f"grpc://127.0.0.1:{port}"
    name = uuid.uuid4().hex
    took: list[float] = []
    with flight.FlightClient(address) as client:
        list(client.do_action(flight.Action(_CREATE, name.encode())))
        for row in range(count):
            started = time.perf_counter()
            put, answer = client.do_put(flight.FlightDescriptor.for_path(name), SCHEMA)
            put.write_batch(one_row_batch(row))
            put.done_writing()
            if answer.read() is None:
                raise RuntimeError("the floor server answered an append with nothing")
            put.close()
            took.append(time.perf_counter() - started)
    return took


def _serve(root: str, registry: bool, durable: bool) -> None:
    if durable and DatasetStorage.is_s3(root):
        raise SystemExit("--durable is for local roots (S3 writes are durable once acknowledged)")
    storage = DatasetStorage.from_env(dict(os.environ)) if DatasetStorage.is_s3(root) else None
    heads = None
    if registry:
        heads = _Registry(os.environ["AWS_ENDPOINT_URL_DYNAMODB"], os.environ["AWS_REGION"])
    service = _Service(root, storage, heads, durable)
    print(service.port, flush=True)
    service.serve()


if __name__ == "__main__":
    _serve(sys.argv[1], _REGISTRY_FLAG in sys.argv[2:], _DURABLE_FLAG in sys.argv[2:])
