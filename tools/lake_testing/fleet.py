"""The fleet workload: writers, readers on two replicas, tickets, a job, a stall, GC, all at once.

What a robot fleet does to Lake all day (TESTING.md, "The fleet workload"):
SDK writers append 1,000-row batches through replica A (one of them with FILE
values it uploads through the SDK) and, after each acknowledged append, read
their own rows back through replica B; ADBC clients run ``count(*)`` and a
filtered aggregate through A and B; ticket-then-read clients take a ticket
with GetFlightInfo, wait while appends land, then DoGet it; a durable async
job is submitted (PollFlightInfo) on A and collected on B; a stalled reader
opens a big DoGet with a default gRPC client and never reads it; an operator
runs ``lake gc`` plan and apply while the writers write.

Nothing here asserts: every read, append and GC outcome is recorded (errors
with their class, read latencies with the phase they ran in) in a
:class:`Record`; :func:`nothing_lost` then checks the table from a fresh
replica. The test (``tests/fleet``) asserts on the record; ``fleet_bench``
reports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import adbc_driver_flightsql.dbapi as flightsql
import grpc
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
from google.protobuf import any_pb2

import lake_sdk
from lake_core.errors import LakeError
from lake_core.filetype import FILE_STRUCT, file_field
from lake_core.ids import new_operation_id
from lake_core.metaclient import MetaClient
from lake_core.models import DataLocation
from lake_core.names import TableRef
from lake_core.proto import flight_sql_pb2
from lake_objects.source import FileUpload
from tools.lake_testing.plugin import write_ticket_keys
from tools.lake_testing.servers import LakeProcess, start_meta, start_query

__all__ = [
    "ROWS_PER_APPEND",
    "SCHEMA",
    "TABLE",
    "Endpoint",
    "Failure",
    "FleetShape",
    "GcRun",
    "LocalFleet",
    "LostCheck",
    "Record",
    "Workload",
    "batch",
    "lake_gc",
    "nothing_lost",
    "run_gc_during",
    "upload_garbage",
    "violations",
]

TABLE = TableRef("robots", "fleet_steps")
SCHEMA = pa.schema(
    [
        pa.field("writer", pa.int64()),
        pa.field("seq", pa.int64()),
        pa.field("row", pa.int64()),
        pa.field("reward", pa.float64()),
        pa.field("note", pa.utf8()),
        file_field("clip"),
    ]
)
ROWS_PER_APPEND = 1_000
COUNT_SQL = f"SELECT count(*) AS n FROM {TABLE.qualified}"
#: Filtered and aggregated, over every row: what a dashboard runs.
AGGREGATE_SQL = (
    f"SELECT writer, count(*) AS n, sum(reward) AS total FROM {TABLE.qualified} "
    "WHERE row % 10 < 7 GROUP BY writer ORDER BY writer"
)
TICKET_SQL = f"SELECT writer, seq, row FROM {TABLE.qualified}"
JOB_SQL = f"SELECT writer, count(*) AS n FROM {TABLE.qualified} GROUP BY writer"
#: ~10 KB a row: far more than a default gRPC client's receive window ever takes in.
STALL_SQL = f"SELECT writer, seq, row, repeat(note, 100) AS wide FROM {TABLE.qualified}"
MEDIA_TYPE = "application/octet-stream"


def batch(writer: int, seq: int, clips: list[DataLocation] | None = None) -> pa.RecordBatch:
    """Writer ``writer``'s ``seq``-th append; ``clips`` fill the first rows' FILE column."""
    rows = range(ROWS_PER_APPEND)
    values: list[dict[str, Any] | None] = [None] * ROWS_PER_APPEND
    for i, clip in enumerate(clips or []):
        values[i] = clip.model_dump()
    return pa.RecordBatch.from_pydict(
        {
            "writer": [writer] * ROWS_PER_APPEND,
            "seq": [seq] * ROWS_PER_APPEND,
            "row": list(rows),
            "reward": [(r % 101) / 100.0 for r in rows],
            "note": [f"w{writer} s{seq} r{r}: pick-and-place, nominal" for r in rows],
            "clip": pa.array(values, FILE_STRUCT),
        },
        schema=SCHEMA,
    )


@dataclass
class LocalFleet:
    """One local-mode Metasrv and its Query replicas (async jobs on, beside the catalog)."""

    root: Path
    meta: LakeProcess
    env: dict[str, str]
    replicas: list[LakeProcess] = field(default_factory=list)

    @classmethod
    def start(cls, root: Path) -> LocalFleet:
        env = {
            "LAKE_QUERY_TICKET_KEYS_FILE": str(write_ticket_keys(root / "ticket-keys.json")),
            "LAKE_MANAGED_OBJECT_ROOT": str(root / "data" / "objects"),
            "LAKE_ASYNC_QUERIES": "true",
        }
        return cls(root, start_meta(root / "data", root, env=env), env)

    @property
    def data(self) -> Path:
        return self.root / "data"

    def replicas_started(self, count: int) -> list[Endpoint]:
        """``count`` more replicas, started side by side (each start takes seconds here)."""
        started: list[LakeProcess | BaseException] = [RuntimeError("not started")] * count

        def one(i: int) -> None:
            try:
                started[i] = start_query(
                    self.meta.addr,
                    self.root,
                    env=self.env,
                    extra_args=("--data-dir", str(self.data)),  # async jobs beside the catalog
                )
            except BaseException as exc:
                started[i] = exc

        threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.replicas.extend(p for p in started if isinstance(p, LakeProcess))
        for outcome in started:
            if isinstance(outcome, BaseException):
                raise outcome
        processes = [p for p in started if isinstance(p, LakeProcess)]
        names = ["A", "B"] if count == 2 else [f"R{len(self.replicas) - i}" for i in range(count)]
        return [Endpoint(n, p.addr) for n, p in zip(names, processes, strict=True)]

    def admin(self, work: Callable[[MetaClient], Any]) -> Any:
        async def go() -> Any:
            async with MetaClient(f"http://{self.meta.addr}", timeout_s=120) as client:
                return await work(client)

        return asyncio.run(go())

    def leftovers(self) -> list[str]:
        """Partial objects an upload left in the stage (``.<name>.partial``)."""
        return [str(p) for p in (self.data / "objects").rglob(".*.partial")]

    def gc_during(self, workload: Workload, plans: Path) -> GcRun:
        """``lake gc`` plan and apply (default-sized safety age) while ``workload`` writes."""

        def garbage() -> list[DataLocation]:
            made = upload_garbage(workload.record, workload.a)
            for location in made:  # a local object's age is its modification time
                then = time.time() - 2 * GC_SAFETY_AGE_S
                os.utime(local_path(location), (then, then))
            return made

        def plan(attempt: int) -> tuple[int, dict[str, Any]]:
            target = str(plans / f"p{attempt}")
            return lake_gc(self.data, "--plan", target, "--safety-age-secs", str(GC_SAFETY_AGE_S))

        def apply(attempt: int) -> tuple[int, dict[str, Any]]:
            target, checkpoint = plans / f"p{attempt}", plans / f"p{attempt}.apply.json"
            return lake_gc(
                self.data, "--plan", str(target), "--apply", "--checkpoint", str(checkpoint)
            )

        return run_gc_during(workload, garbage, plan, apply, lambda g: local_path(g).exists())

    def stop(self) -> None:
        for process in self.replicas:
            process.stop()
        self.meta.stop()


#: ``lake gc --safety-age-secs`` of the local runs: an hour, as an operator would pick.
GC_SAFETY_AGE_S = 3600


def local_path(location: DataLocation) -> Path:
    return Path(location.uri.removeprefix("file://"))


def lake_gc(
    data_dir: Path, *args: str, env: dict[str, str] | None = None, timeout_s: float = 90
) -> tuple[int, dict[str, Any]]:
    """``lake --data-dir DATA gc ARGS --json`` in its own process: (exit code, JSON reply).

    A run that takes longer than ``timeout_s`` is killed and reported as exit code -1.
    """
    command = [sys.executable, "-c", "from lake_core.cli import main; main()"]
    command += ["--data-dir", str(data_dir), "gc", *args, "--json"]
    try:
        done = subprocess.run(
            command,
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        message = f"lake gc {args[:1]} did not finish in {timeout_s:.0f}s"
        return -1, {"error": "Timeout", "message": message, "_stderr": stderr[-3000:]}
    try:
        reply = json.loads(done.stdout) if done.stdout.strip() else {}
    except ValueError:
        reply = {"stdout": done.stdout}
    reply.setdefault("_stderr", done.stderr[-3000:])
    return done.returncode, reply


def statement(sql: str) -> flight.FlightDescriptor:
    wrapper = any_pb2.Any()
    wrapper.Pack(flight_sql_pb2.CommandStatementQuery(query=sql))
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


@dataclass(frozen=True)
class Endpoint:
    """One Query replica as clients see it."""

    name: str
    addr: str
    token: str | None = None

    @property
    def url(self) -> str:
        return f"grpc://{self.addr}"

    def sdk(self, timeout_s: float = 60) -> lake_sdk.Client:
        return lake_sdk.Client(self.url, token=self.token, connect_timeout=timeout_s)

    def adbc(self) -> Any:
        kwargs = {}
        if self.token:
            kwargs["adbc.flight.sql.authorization_header"] = f"Bearer {self.token}"
        return flightsql.connect(self.url, db_kwargs=kwargs)

    def flight(self) -> flight.FlightClient:
        """pyarrow's Flight client with default gRPC options (BDP probing on)."""
        return flight.FlightClient(f"grpc+tcp://{self.addr}")

    def call_options(
        self, extra: list[tuple[bytes, bytes]] | None = None
    ) -> flight.FlightCallOptions:
        headers = [(b"authorization", f"Bearer {self.token}".encode())] if self.token else []
        return flight.FlightCallOptions(headers=headers + (extra or []), timeout=120)


@dataclass(frozen=True)
class Failure:
    """One failed operation: who, where, the error's class and message."""

    actor: str
    replica: str
    kind: str
    message: str
    at_s: float
    phase: str = ""

    def line(self) -> str:
        return f"{self.at_s:7.2f}s {self.actor:<10} {self.replica:<8} {self.kind}: {self.message}"


@dataclass(frozen=True)
class Ack:
    writer: int
    seq: int
    operation_id: str
    version: int
    clips: tuple[DataLocation, ...]
    #: When it was acknowledged (seconds into the run) and in which phase.
    at_s: float = 0.0
    phase: str = ""


@dataclass
class GcRun:
    """What the GC actor saw: plan attempts, the plan's reply, apply's reply, the garbage."""

    garbage: list[DataLocation] = field(default_factory=list)
    plan_attempts: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    applied: tuple[int, dict[str, Any]] | None = None
    garbage_left: list[DataLocation] = field(default_factory=list)
    appends_during: int = 0


@dataclass
class Record:
    """Everything the workload's actors did, thread-safe."""

    started: float = field(default_factory=time.monotonic)
    #: The phase operations are recorded under (the bench names its phases).
    phase: str = "ingest"
    lock: threading.Lock = field(default_factory=threading.Lock)
    acks: list[Ack] = field(default_factory=list)
    #: (writer, seq) of appends that failed for good: they may or may not have landed.
    unacknowledged: list[tuple[int, int]] = field(default_factory=list)
    append_retries: list[Failure] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    #: Reads that answered but broke read-your-writes (writer, seen, expected at least).
    stale_reads: list[tuple[int, int, int]] = field(default_factory=list)
    #: read kind -> phase -> latencies (s).
    latencies: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    reads: Counter[str] = field(default_factory=Counter)
    tickets_read: int = 0
    jobs_read: int = 0
    stalled_open: int = 0
    gc: GcRun | None = None
    #: When (monotonic) the GC actor's garbage had all been uploaded.
    gc_garbage_at: float = 0.0
    append_seconds: float = 0.0

    def now(self) -> float:
        return time.monotonic() - self.started

    def fail(self, actor: str, replica: str, exc: BaseException, phase: str = "") -> None:
        message = " ".join(str(exc).split())[:300]
        phase = phase or self.phase
        failure = Failure(actor, replica, error_class(exc), message, self.now(), phase)
        with self.lock:
            self.failures.append(failure)

    def read_ok(self, kind: str, phase: str, seconds: float) -> None:
        with self.lock:
            self.reads[kind] += 1
            self.latencies.setdefault(kind, {}).setdefault(phase, []).append(seconds)

    def acked(self) -> int:
        with self.lock:
            return len(self.acks)

    def acked_rows(self, writer: int) -> int:
        with self.lock:
            return sum(ROWS_PER_APPEND for a in self.acks if a.writer == writer)

    def failure_classes(self) -> Counter[str]:
        return Counter(f"{f.actor}:{f.kind}" for f in self.failures)

    def report(self) -> str:
        lines = [
            f"appends acknowledged: {len(self.acks)} (unacknowledged {len(self.unacknowledged)},"
            f" retried {len(self.append_retries)}); reads ok: {dict(self.reads)};"
            f" tickets read {self.tickets_read}, jobs read {self.jobs_read},"
            f" stalled streams open {self.stalled_open}",
            f"read-your-writes violations: {len(self.stale_reads)} {self.stale_reads[:5]}",
            f"failed reads: {len(self.failures)} by class {dict(self.failure_classes())}",
        ]
        seen: set[tuple[str, str, str]] = set()
        for failure in self.failures:  # the first of each (actor, replica, class) in full
            key = (failure.actor, failure.replica, failure.kind)
            if key not in seen:
                seen.add(key)
                lines.append("  " + failure.line())
        for retry in self.append_retries[:5]:
            lines.append("  append retry: " + retry.line())
        if self.gc is not None:
            gc = self.gc
            lines.append(
                f"gc: garbage {len(gc.garbage)}, plan attempts "
                f"{[(code, r.get('error'), r.get('candidates')) for code, r in gc.plan_attempts]},"
                f" apply {gc.applied and (gc.applied[0], _brief(gc.applied[1]))},"
                f" garbage left {len(gc.garbage_left)}, appends meanwhile {gc.appends_during}"
            )
        return "\n".join(lines)


def error_class(exc: BaseException) -> str:
    """The error's class, and for ADBC the gRPC status on the wire (its vendor code).

    ADBC's Flight SQL driver reports its own status (UNKNOWN for FAILED_PRECONDITION,
    INTERNAL for RESOURCE_EXHAUSTED); the vendor code is the gRPC code the server sent.
    pyarrow raises ``ArrowInvalid`` for several statuses and names the status in its
    message ("gRPC returned precondition failed error").
    """
    name = type(exc).__name__
    code = getattr(exc, "vendor_code", None)
    if isinstance(code, int):
        wire = next((s.name for s in grpc.StatusCode if s.value[0] == code), str(code))
        return f"{name}[{wire}]"
    said = re.search(r"gRPC returned ([a-z ]+?) error", str(exc))  # pyarrow's own wording
    if said is not None:
        return f"{name}[{said.group(1)}]"
    return name


def _brief(reply: dict[str, Any]) -> dict[str, Any]:
    keys = ("deleted", "already_absent", "complete", "error", "message")
    return {k: str(reply[k])[:200] for k in keys if k in reply}


@dataclass
class FleetShape:
    """How many of each actor, and for how long."""

    writers: int = 4
    #: Writers (the first ones) whose appends carry FILE values.
    file_writers: int = 1
    clips_per_append: int = 2
    clip_bytes: int = 20_000
    ticket_clients: int = 2
    #: How long a ticket is held before DoGet: at least this, and until appends landed.
    ticket_hold_s: float = 3.0
    jobs: bool = True
    stalled_reader: bool = True
    #: Seconds between two reads of one ADBC reader (0: back to back).
    read_pause_s: float = 0.05


class Workload:
    """Runs the actors against replicas ``a`` (writes and reads) and ``b`` (reads only)."""

    def __init__(
        self,
        a: Endpoint,
        b: Endpoint,
        shape: FleetShape,
        *,
        record: Record | None = None,
    ) -> None:
        self.a, self.b, self.shape = a, b, shape
        self.record = record or Record()
        self.stop = threading.Event()
        #: Set while writers may append (the bench pauses them for its idle phases).
        self.ingest = threading.Event()
        self.ingest.set()
        #: Set while ADBC readers may read (the bench pauses them to time appends alone).
        self.reading = threading.Event()
        self.reading.set()
        self._threads: list[threading.Thread] = []
        self._stall_clients: list[tuple[flight.FlightClient, Any]] = []

    # -- lifecycle -------------------------------------------------------------------

    @property
    def phase(self) -> str:
        return self.record.phase

    @phase.setter
    def phase(self, name: str) -> None:
        self.record.phase = name

    def start(self) -> None:
        shape = self.shape
        for w in range(shape.writers):
            self._spawn(f"writer-{w}", self._writer, w, w < shape.file_writers)
        for endpoint in (self.a, self.b):
            self._spawn(f"adbc-{endpoint.name}", self._adbc_reader, endpoint)
        for t in range(shape.ticket_clients):
            # Planned on one replica, redeemed on the other (A->B, B->A, ...).
            planner, redeemer = ((self.a, self.b), (self.b, self.a))[t % 2]
            self._spawn(f"ticket-{t}", self._ticket_client, t, planner, redeemer)
        if shape.jobs:
            self._spawn("job", self._job_client)
        if shape.stalled_reader:
            self._spawn("stall", self._stalled_reader)

    def _spawn(self, name: str, target: Callable[..., None], *args: Any) -> None:
        def run() -> None:
            try:
                target(*args)
            except BaseException as exc:  # an actor's own bug: recorded, never silent
                self.record.fail(name, "-", exc)

        thread = threading.Thread(target=run, name=f"fleet-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def wait_for_appends(self, count: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.record.acked() < count:
            if time.monotonic() > deadline or self.stop.is_set():
                return False
            time.sleep(0.05)
        return True

    def finish(self, timeout_s: float = 120) -> None:
        self.stop.set()
        self.ingest.set()  # paused actors see the stop
        self.reading.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(timeout=max(0.1, deadline - time.monotonic()))
        for client, reader in self._stall_clients:
            with contextlib.suppress(Exception):
                reader.cancel()
            with contextlib.suppress(Exception):
                client.close()
        stuck = [t.name for t in self._threads if t.is_alive()]
        if stuck:
            self.record.fail("workload", "-", TimeoutError(f"actors still running: {stuck}"))

    # -- actors ----------------------------------------------------------------------

    def _writer(self, w: int, with_files: bool) -> None:
        record = self.record
        with self.a.sdk() as client, self.b.flight() as reader:
            store = client.object_store() if with_files else None
            seq = 0
            while not self.stop.is_set():
                self.ingest.wait()
                if self.stop.is_set():
                    break
                clips: list[DataLocation] = []
                if store is not None:
                    for _ in range(self.shape.clips_per_append):
                        body = io.BytesIO(os.urandom(self.shape.clip_bytes))
                        clips.append(store.upload(FileUpload.from_reader(body, MEDIA_TYPE)))
                op_id = new_operation_id()
                version = self._append(client, w, seq, clips, op_id)
                if version is not None:
                    with record.lock:
                        record.acks.append(
                            Ack(w, seq, op_id, version, tuple(clips), record.now(), record.phase)
                        )
                    self._read_own_writes(reader, w, version)
                seq += 1

    def _append(
        self,
        client: lake_sdk.Client,
        w: int,
        seq: int,
        clips: list[DataLocation],
        op_id: str,
    ) -> int | None:
        """One append, retried with its operation id while the error is retryable (90 s)."""
        record = self.record
        rows = batch(w, seq, clips)
        deadline = time.monotonic() + 90
        started = time.monotonic()
        while True:
            try:
                version = client.append_batches(TABLE, [rows], operation_id=op_id)
                with record.lock:
                    record.append_seconds += time.monotonic() - started
                return version
            except LakeError as exc:
                if exc.retryable and time.monotonic() < deadline and not self.stop.is_set():
                    with record.lock:
                        record.append_retries.append(
                            Failure(
                                f"writer-{w}",
                                self.a.name,
                                type(exc).__name__,
                                str(exc)[:200],
                                record.now(),
                            )
                        )
                    time.sleep(0.2)
                    continue
                record.fail(f"append-{w}", self.a.name, exc)
                with record.lock:
                    record.unacknowledged.append((w, seq))
                return None

    def _read_own_writes(self, reader: flight.FlightClient, w: int, version: int) -> None:
        """Count this writer's rows on B, naming the version its append committed.

        The SDK sends ``lake-min-versions`` with the versions its own connection
        committed; the writer appended through A, so its reader on B sends the
        header itself, as docs/consistency.md says any Flight SQL client may.
        """
        expected = self.record.acked_rows(w)
        sql = f"SELECT count(*) AS n FROM {TABLE.qualified} WHERE writer = {w}"
        options = self.b.call_options(
            [(b"lake-min-versions", f"{TABLE.qualified}={version}".encode())]
        )
        phase = self.phase
        started = time.monotonic()
        try:
            info = reader.get_flight_info(statement(sql), options)
            table = reader.do_get(info.endpoints[0].ticket, options).read_all()
            seen = int(table.column("n")[0].as_py())
        except Exception as exc:
            self.record.fail("ryw", self.b.name, exc, phase)
            return
        self.record.read_ok("ryw", phase, time.monotonic() - started)
        if seen < expected:
            with self.record.lock:
                self.record.stale_reads.append((w, seen, expected))

    def _adbc_reader(self, endpoint: Endpoint) -> None:
        with endpoint.adbc() as conn:
            turn = 0
            while not self.stop.is_set():
                self.reading.wait()
                sql, kind = (COUNT_SQL, "count") if turn % 2 == 0 else (AGGREGATE_SQL, "aggregate")
                turn += 1
                phase = self.phase
                started = time.monotonic()
                try:
                    with conn.cursor() as cursor:
                        cursor.execute(sql)
                        cursor.fetch_arrow_table()
                except Exception as exc:
                    self.record.fail(f"adbc-{kind}", endpoint.name, exc, phase)
                else:
                    self.record.read_ok(
                        f"{kind}@{endpoint.name}", phase, time.monotonic() - started
                    )
                self.stop.wait(self.shape.read_pause_s)

    def _ticket_client(self, t: int, planner: Endpoint, redeemer: Endpoint) -> None:
        actor = f"ticket-{t}"
        with planner.flight() as plan_client, redeemer.flight() as read_client:
            while not self.stop.is_set():
                try:
                    info = plan_client.get_flight_info(
                        statement(TICKET_SQL), planner.call_options()
                    )
                except Exception as exc:
                    self.record.fail(actor, planner.name, exc)
                    self.stop.wait(0.5)
                    continue
                taken, before = time.monotonic(), self.record.acked()
                # Hold it while appends land: a few seconds, and at least two appends.
                while not self.stop.is_set() and (
                    time.monotonic() - taken < self.shape.ticket_hold_s
                    or (self.ingest.is_set() and self.record.acked() < before + 2)
                ):
                    if time.monotonic() - taken > 30:
                        break
                    time.sleep(0.05)
                try:
                    table = read_client.do_get(
                        info.endpoints[0].ticket, redeemer.call_options()
                    ).read_all()
                except Exception as exc:
                    self.record.fail(actor, redeemer.name, exc)
                    continue
                keys = pc.add(
                    pc.multiply(table["writer"], 10**12),
                    pc.add(pc.multiply(table["seq"], 10**4), table["row"]),
                )
                if pc.count_distinct(keys).as_py() != table.num_rows:
                    self.record.fail(actor, redeemer.name, AssertionError("a ticket's rows repeat"))
                with self.record.lock:
                    self.record.tickets_read += 1

    def _job_client(self) -> None:
        """Durable async jobs: submit on A (PollFlightInfo), collect on B after appends land."""
        with self.a.sdk() as submitter, self.b.sdk() as collector:
            while not self.stop.is_set():
                before = self.record.acked()
                try:
                    handle = submitter.jobs.submit(JOB_SQL)
                except Exception as exc:
                    self.record.fail("job-submit", self.a.name, exc)
                    self.stop.wait(1.0)
                    continue
                waited = time.monotonic()
                while (
                    not self.stop.is_set()
                    and self.ingest.is_set()
                    and self.record.acked() < before + 2
                    and time.monotonic() - waited < 30
                ):
                    time.sleep(0.05)
                try:
                    table = collector.jobs.resume(handle).to_table()
                except Exception as exc:
                    self.record.fail("job-collect", self.b.name, exc)
                    continue
                finally:  # release the job's stored result, as jobs.query does once read
                    with contextlib.suppress(Exception):
                        collector.jobs.cancel(handle)
                if table.num_rows and pc.sum(table["n"]).as_py() % ROWS_PER_APPEND != 0:
                    self.record.fail("job-collect", self.b.name, AssertionError("a partial append"))
                with self.record.lock:
                    self.record.jobs_read += 1

    def _stalled_reader(self) -> None:
        """A default gRPC client opens a big DoGet on A and never reads it."""
        # Wait until the table holds enough rows for the result to dwarf any window.
        if not self.wait_for_appends(8, timeout_s=120):
            return
        client = self.a.flight()
        try:
            info = client.get_flight_info(statement(STALL_SQL), self.a.call_options())
            reader = client.do_get(info.endpoints[0].ticket, self.a.call_options())
        except Exception as exc:
            self.record.fail("stall-open", self.a.name, exc)
            client.close()
            return
        self._stall_clients.append((client, reader))
        with self.record.lock:
            self.record.stalled_open += 1


def upload_garbage(record: Record, endpoint: Endpoint, count: int = 4) -> list[DataLocation]:
    """Objects uploaded through the SDK and never appended: what GC must reclaim."""
    made = []
    with endpoint.sdk() as client:
        store = client.object_store()
        for _ in range(count):
            body = io.BytesIO(os.urandom(5_000))
            made.append(store.upload(FileUpload.from_reader(body, MEDIA_TYPE)))
    record.gc_garbage_at = time.monotonic()
    return made


def run_gc_during(
    workload: Workload,
    make_garbage: Callable[[], list[DataLocation]],
    plan: Callable[[int], tuple[int, dict[str, Any]]],
    apply: Callable[[int], tuple[int, dict[str, Any]]],
    exists: Callable[[DataLocation], bool],
    *,
    plan_attempts: int = 3,
) -> GcRun:
    """Plan and apply once while writers append; ``plan(n)``/``apply(n)`` run ``lake gc``."""
    run = GcRun(garbage=make_garbage())
    before = workload.record.acked()
    for attempt in range(plan_attempts):
        code, reply = plan(attempt)
        run.plan_attempts.append((code, reply))
        if code == 0:
            break
    else:
        run.garbage_left = [g for g in run.garbage if exists(g)]
        return run
    attempt = len(run.plan_attempts) - 1
    run.applied = apply(attempt)
    run.appends_during = workload.record.acked() - before
    run.garbage_left = [g for g in run.garbage if exists(g)]
    return run


@dataclass
class LostCheck:
    """The nothing-lost check's findings (empty lists: nothing lost)."""

    rows: int = 0
    missing: list[tuple[int, int, int]] = field(default_factory=list)
    duplicated: list[tuple[int, int, int]] = field(default_factory=list)
    unexpected: list[tuple[int, int]] = field(default_factory=list)
    version_gaps: list[int] = field(default_factory=list)
    final_version: int = 0
    files_checked: int = 0
    files_bad: list[str] = field(default_factory=list)
    #: Open multipart uploads and partial objects left in the stage.
    leftovers: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        out = []
        if self.missing:
            out.append(
                f"{len(self.missing)} acknowledged (writer, seq) short of rows: {self.missing[:5]}"
            )
        if self.duplicated:
            out.append(f"{len(self.duplicated)} rows appear more than once: {self.duplicated[:5]}")
        if self.unexpected:
            out.append(f"batches never appended: {self.unexpected[:5]}")
        if self.version_gaps:
            out.append(f"versions without an acknowledged append: {self.version_gaps[:10]}")
        if self.leftovers:
            out.append(f"uploads left open or partial: {self.leftovers[:5]}")
        if self.files_bad:
            out.append(f"{len(self.files_bad)} FILE values unreadable: {self.files_bad[:3]}")
        return out


def _wait_for_version(client: lake_sdk.Client, version: int, timeout_s: float = 60.0) -> None:
    """Wait until ``client``'s replica lists ``version`` of the table (its catalog caught up)."""
    listing = f'SELECT max(version) AS v FROM lake.{TABLE.namespace}."{TABLE.name}$versions"'
    deadline = time.monotonic() + timeout_s
    while True:
        latest = client.query_table(listing)["v"][0].as_py() or 0
        if latest >= version:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the fresh replica still lists version {latest}, not {version}")
        time.sleep(0.1)


def nothing_lost(
    record: Record,
    fresh: Endpoint,
    final_version: int,
    *,
    create_version: int = 0,
    leftovers: Callable[[], list[str]] = list,
) -> LostCheck:
    """TESTING.md's nothing-lost check, through a replica started after the workload.

    Every acknowledged append's rows appear exactly once; nothing else appears
    but appends that failed ambiguously; the Lake versions after the create
    are exactly the acknowledged appends' (several appends may share one
    version when Metasrv groups them, none may be missing); every FILE of
    every retained version opens and verifies its size and SHA-256. The
    table is append-only (maintenance rewrites layout, never rows), so the
    newest version's FILE values include every older version's.
    """
    check = LostCheck(final_version=final_version, leftovers=leftovers())
    # Read exactly the last acknowledged version: a replica that forwarded none of
    # the appends sees a commit within its catalog refresh (docs/consistency.md),
    # and the check is of what was committed, not of how fast replicas learn it.
    with fresh.sdk() as client:
        _wait_for_version(client, final_version)
        table = client.query_table(
            f"SELECT writer, seq, row FROM {TABLE.qualified}", as_of=final_version
        )
        check.rows = table.num_rows
        counts: Counter[tuple[int, int, int]] = Counter(
            zip(
                table["writer"].to_pylist(),
                table["seq"].to_pylist(),
                table["row"].to_pylist(),
                strict=True,
            )
        )
        check.duplicated = [key for key, n in counts.items() if n > 1]
        per_batch: Counter[tuple[int, int]] = Counter((w, s) for w, s, _ in counts)
        acked = {(a.writer, a.seq) for a in record.acks}
        check.missing = [
            (w, s, per_batch.get((w, s), 0))
            for w, s in sorted(acked)
            if per_batch.get((w, s), 0) != ROWS_PER_APPEND
        ]
        maybe = set(record.unacknowledged)
        check.unexpected = sorted(k for k in per_batch if k not in acked and k not in maybe)
        landed_unacked = sum(1 for k in per_batch if k in maybe)
        versions = {a.version for a in record.acks}
        gaps = [v for v in range(create_version + 1, final_version + 1) if v not in versions]
        if len(gaps) > landed_unacked or any(v > final_version for v in versions):
            check.version_gaps = gaps + sorted(v for v in versions if v > final_version)
        clips = client.query_table(
            f"SELECT clip FROM {TABLE.qualified} WHERE clip IS NOT NULL", as_of=final_version
        )
        referenced = {DataLocation(**value) for value in clips["clip"].to_pylist()}
        acked_clips = {clip for a in record.acks for clip in a.clips}
        check.files_bad = [
            f"{c.uri}: acknowledged, not in the table" for c in acked_clips - referenced
        ]
        for location in sorted(referenced, key=lambda loc: loc.uri):
            check.files_checked += 1
            try:
                with client.open(location) as reader:
                    body = reader.read()
                    if not reader.verified or len(body) != location.size_bytes:
                        check.files_bad.append(f"{location.uri}: not verified")
            except Exception as exc:
                check.files_bad.append(f"{location.uri}: {type(exc).__name__}: {exc}"[:300])
    return check


def assert_workload_held(record: Record, lost: LostCheck) -> None:
    """Assert issue 30's contract: every broken promise fails the test, naming itself.

    A lost or doubled row, an unreadable FILE, a failed GC, a stale read and
    any failed read (a memory refusal included) each break it.
    """
    broken = violations(record, lost)
    assert broken == [], broken


def violations(
    record: Record, lost: LostCheck, *, jobs: bool = True, stall: bool = True
) -> list[str]:
    """Issue 30's contract, one line per broken promise (empty: the workload held)."""
    out: list[str] = []
    if record.acked() < 20:
        out.append(f"the writers wrote only {record.acked()} appends")
    if record.failures:
        out.append(f"{len(record.failures)} failed operations: {dict(record.failure_classes())}")
    if record.stale_reads:
        out.append(f"read-your-writes broken {len(record.stale_reads)} times on B")
    if record.tickets_read < 2:
        out.append(f"only {record.tickets_read} ticket-then-read clients succeeded")
    if jobs and record.jobs_read < 1:
        out.append("no async job was collected")
    if stall and record.stalled_open != 1:
        out.append("the stalled reader never opened its stream")
    out.extend(f"nothing-lost: {p}" for p in lost.problems())
    gc = record.gc
    if gc is None:
        out.append("gc never ran")
        return out
    if not gc.plan_attempts or gc.plan_attempts[-1][0] != 0:
        out.append(f"gc plan failed: {[(c, _brief(r)) for c, r in gc.plan_attempts]}")
    elif gc.applied is None or gc.applied[0] != 0 or gc.applied[1].get("complete") is not True:
        out.append(f"gc apply failed: {gc.applied and (gc.applied[0], _brief(gc.applied[1]))}")
    if gc.garbage_left:
        out.append(f"{len(gc.garbage_left)} of {len(gc.garbage)} garbage objects survived apply")
    return out
