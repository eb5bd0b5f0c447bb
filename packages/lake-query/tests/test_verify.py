"""DataFileVerifier: every data file checked once, before rows are served; failures rechecked."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import lance
import pyarrow as pa
import pytest

from lake_core.errors import (
    ConfigError,
    DataCorrupted,
    InvalidArgument,
    Unavailable,
    VersionReclaimed,
)
from lake_core.integrity import (
    DataFileDigest,
    DataFileDigestsRequest,
    DataFileDigestsResult,
    DataFileReader,
    digest_file,
    fragment_file_paths,
)
from lake_core.models import TableDescriptor
from lake_core.names import TableRef
from lake_core.planning_deadline import MARGIN_S, planning_until, wait_budget
from lake_query.planning.verify import VERIFY_ON_OPEN, DataFileVerifier, MetaDigests, verify_on_open
from tools.lake_testing.loops import loop_on_thread

TABLE = TableRef("ns", "t")


def dataset(tmp_path: Path, appends: int = 2) -> tuple[str, dict[str, DataFileDigest]]:
    uri = str(tmp_path / "t.lance")
    for i in range(appends):
        lance.write_dataset(
            pa.table({"id": list(range(i * 100, (i + 1) * 100))}),
            uri,
            mode="append" if i else "create",
        )
    digests = {}
    for path in fragment_file_paths(lance.dataset(uri).get_fragments()):
        size, sha = digest_file(Path(uri) / "data" / path)
        digests[path] = DataFileDigest(path=path, size_bytes=size, sha256=sha)
    return uri, digests


def descriptor(uri: str, version: int) -> TableDescriptor:
    return TableDescriptor(location=uri, incarnation="i1", version=version, engine_version=version)


def test_files_are_read_once_and_a_corrupt_one_is_refused_every_time(tmp_path: Path) -> None:
    uri, digests = dataset(tmp_path)
    fetches: list[TableRef] = []

    def source(table: TableRef, paths: Sequence[str]) -> dict[str, DataFileDigest]:
        fetches.append(table)
        return {path: digests[path] for path in paths}

    verifier = DataFileVerifier(source)
    first = lance.dataset(uri, version=1)
    verifier.check(first, TABLE, descriptor(uri, 1))
    # Version 2 adds one file: only that one is new; version 1's file is not read again.
    second_path = sorted(set(digests) - set(fragment_file_paths(first.get_fragments())))[0]
    data = Path(uri) / "data"
    raw = (data / second_path).read_bytes()
    (data / second_path).write_bytes(raw[:10] + bytes([raw[10] ^ 0xFF]) + raw[11:])
    for _ in range(2):
        with pytest.raises(DataCorrupted, match=r"^lake\.ns\.t version 2: ") as caught:
            verifier.check(lance.dataset(uri, version=2), TABLE, descriptor(uri, 2))
        assert uri not in str(caught.value)
    (data / second_path).write_bytes(raw)
    verifier.check(lance.dataset(uri, version=2), TABLE, descriptor(uri, 2))
    # Verified files are remembered: corrupting one now goes unnoticed (documented:
    # data files are immutable), and nothing is fetched or read again.
    calls = len(fetches)
    (data / second_path).write_bytes(b"garbage")
    verifier.check(lance.dataset(uri, version=2), TABLE, descriptor(uri, 2))
    assert len(fetches) == calls


def test_memory_is_bounded(tmp_path: Path) -> None:
    uri, digests = dataset(tmp_path, appends=3)
    verifier = DataFileVerifier(lambda table, paths: digests, capacity=2)
    for version in (1, 2, 3):
        verifier.check(lance.dataset(uri, version=version), TABLE, descriptor(uri, version))
    assert len(verifier._files._keys) == 2
    assert len(verifier._versions._keys) == 2


def test_the_setting_is_validated() -> None:
    assert verify_on_open({}) is True  # on by default (issue 36)
    assert verify_on_open({VERIFY_ON_OPEN: "false"}) is False
    assert verify_on_open({VERIFY_ON_OPEN: "true"}) is True
    assert verify_on_open({VERIFY_ON_OPEN: "0"}) is False
    with pytest.raises(ConfigError, match=VERIFY_ON_OPEN):
        verify_on_open({VERIFY_ON_OPEN: "yes please"})


class CountingReader(DataFileReader):
    """Counts the files it hashes; ``gate`` holds every read until set."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        super().__init__()
        self.reads: list[str] = []
        self.gate = gate
        self._lock = threading.Lock()

    def digest(self, location: str, path: str) -> tuple[int, str]:
        with self._lock:
            self.reads.append(path)
        if self.gate is not None:
            assert self.gate.wait(30)
        return super().digest(location, path)


def test_a_new_version_reads_and_asks_for_only_its_new_files(tmp_path: Path) -> None:
    uri, digests = dataset(tmp_path, appends=3)
    asked: list[list[str]] = []

    def source(table: TableRef, paths: Sequence[str]) -> dict[str, DataFileDigest]:
        asked.append(list(paths))
        return {path: digests[path] for path in paths}

    reader = CountingReader()
    verifier = DataFileVerifier(source, reader=reader)
    files = {
        v: fragment_file_paths(lance.dataset(uri, version=v).get_fragments()) for v in (1, 2, 3)
    }
    for version in (1, 2, 3):
        verifier.check(lance.dataset(uri, version=version), TABLE, descriptor(uri, version))
    new_in_2 = sorted(set(files[2]) - set(files[1]))
    new_in_3 = sorted(set(files[3]) - set(files[2]))
    assert [sorted(a) for a in asked] == [sorted(files[1]), new_in_2, new_in_3]
    assert sorted(reader.reads) == sorted(files[3])  # each file read exactly once
    # Another incarnation at the same location is another table: its files are read again.
    other = TableDescriptor(location=uri, incarnation="i2", version=3, engine_version=3)
    verifier.check(lance.dataset(uri, version=3), TABLE, other)
    assert len(reader.reads) == 2 * len(files[3])


def test_concurrent_first_uses_of_a_file_read_it_once(tmp_path: Path) -> None:
    uri, digests = dataset(tmp_path, appends=1)
    gate = threading.Event()
    reader = CountingReader(gate)
    verifier = DataFileVerifier(lambda table, paths: digests, reader=reader)
    with ThreadPoolExecutor(8) as pool:
        runs = [
            pool.submit(verifier.check, lance.dataset(uri, version=1), TABLE, descriptor(uri, 1))
            for _ in range(8)
        ]
        while not reader.reads:  # the first check is reading; let the others pile up
            gate.wait(0.01)
        gate.wait(0.2)
        gate.set()
        for run in runs:
            run.result(timeout=30)
    assert len(reader.reads) == 1


def test_concurrent_first_uses_of_a_corrupt_file_all_fail(tmp_path: Path) -> None:
    uri, digests = dataset(tmp_path, appends=1)
    [path] = digests
    target = Path(uri) / "data" / path
    raw = target.read_bytes()
    target.write_bytes(raw[:20] + bytes([raw[20] ^ 0x01]) + raw[21:])
    gate = threading.Event()
    reader = CountingReader(gate)
    verifier = DataFileVerifier(lambda table, paths: digests, reader=reader)
    with ThreadPoolExecutor(4) as pool:
        runs = [
            pool.submit(verifier.check, lance.dataset(uri, version=1), TABLE, descriptor(uri, 1))
            for _ in range(4)
        ]
        while not reader.reads:
            gate.wait(0.01)
        gate.wait(0.2)
        gate.set()
        for run in runs:
            with pytest.raises(DataCorrupted):
                run.result(timeout=30)
    # Not remembered: the next open reads it again, and fails again.
    with pytest.raises(DataCorrupted):
        verifier.check(lance.dataset(uri, version=1), TABLE, descriptor(uri, 1))
    assert len(reader.reads) >= 2


def test_a_missing_file_is_a_reclaimed_version_not_corruption(tmp_path: Path) -> None:
    uri, digests = dataset(tmp_path, appends=1)
    [path] = digests
    (Path(uri) / "data" / path).unlink()  # retention or GC took it
    verifier = DataFileVerifier(lambda table, paths: digests)
    with pytest.raises(VersionReclaimed, match=r"^lake\.ns\.t version 1 is no longer available"):
        verifier.check(lance.dataset(uri, version=1), TABLE, descriptor(uri, 1))


class OldMetasrv:
    """A Metasrv of the previous release: whole-table digest requests only."""

    def __init__(self, digests: dict[str, DataFileDigest]) -> None:
        self.digests = digests
        self.requests: list[object] = []

    async def action(self, kind: str, request: object, model: type) -> object:
        self.requests.append(request)
        if isinstance(request, DataFileDigestsRequest):
            raise InvalidArgument("malformed TableRequest: paths: Extra inputs are not permitted")
        return DataFileDigestsResult(
            table=TABLE, incarnation="i1", files=list(self.digests.values())
        )


def test_a_replica_falls_back_to_whole_table_digests_from_an_older_metasrv() -> None:
    digests = {p: DataFileDigest(path=p, size_bytes=1, sha256="0" * 64) for p in ("a", "b", "c")}
    meta = OldMetasrv(digests)
    with loop_on_thread() as loop:
        source = MetaDigests(meta, loop)
        assert source(TABLE, ["b"]) == {"b": digests["b"]}
        assert source(TABLE, ["a", "x"]) == {"a": digests["a"]}
    # Asked by path once; whole-table requests after that.
    assert [type(r).__name__ for r in meta.requests] == [
        "DataFileDigestsRequest",
        "TableRequest",
        "TableRequest",
    ]


class FailingOverMetasrv:
    """Answers UNAVAILABLE ``outages`` times (a leader dying mid-call), then digests."""

    def __init__(self, digests: dict[str, DataFileDigest], outages: int) -> None:
        self.digests = digests
        self.outages = outages
        self.calls = 0

    async def action(self, kind: str, request: object, model: type) -> object:
        self.calls += 1
        if self.calls <= self.outages:
            raise Unavailable("metadata service unavailable: Stream removed (Socket closed)")
        return DataFileDigestsResult(
            table=TABLE, incarnation="i1", files=list(self.digests.values())
        )


def run_on_loop(meta: object, timeout_s: float, paths: list[str]) -> object:
    with loop_on_thread() as loop:
        return MetaDigests(meta, loop, timeout_s=timeout_s)(TABLE, paths)


def test_digests_ride_out_a_metasrv_takeover() -> None:
    digests = {"a": DataFileDigest(path="a", size_bytes=1, sha256="0" * 64)}
    meta = FailingOverMetasrv(digests, outages=3)
    assert run_on_loop(meta, 10.0, ["a"]) == digests
    assert meta.calls == 4


def test_an_outage_longer_than_the_timeout_is_still_unavailable() -> None:
    meta = FailingOverMetasrv({}, outages=1_000)
    with pytest.raises(Unavailable):
        run_on_loop(meta, 0.5, ["a"])
    assert 2 <= meta.calls <= 5


class SilentMetasrv:
    """Never answers (a Metasrv whose store hangs)."""

    def __init__(self) -> None:
        self.calls = 0

    async def action(self, kind: str, request: object, model: type) -> object:
        self.calls += 1
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


def test_a_metasrv_that_never_answers_is_unavailable_not_a_timeout() -> None:
    # Was a bare TimeoutError, which the client saw as a SQL error.
    started = time.monotonic()
    with pytest.raises(Unavailable, match="digests"):
        run_on_loop(SilentMetasrv(), 0.3, ["a"])
    assert time.monotonic() - started < 5


def test_a_planning_deadline_cuts_the_ride_out_short() -> None:
    # Riding out an outage for the whole timeout (30 s by default) outlived the
    # planning deadline: DEADLINE_EXCEEDED ("simplify it") and a lost thread.
    meta = FailingOverMetasrv({}, outages=1_000)
    started = time.monotonic()
    with planning_until(started + 1.0), pytest.raises(Unavailable):
        run_on_loop(meta, 30.0, ["a"])
    assert time.monotonic() - started < 1.0
    assert meta.calls >= 2


def test_the_wait_budget_is_unchanged_off_a_planning_thread() -> None:
    assert wait_budget(30.0) == 30.0
    with planning_until(time.monotonic() + 10.0):
        assert 9.0 < wait_budget(30.0) <= 10.0 - MARGIN_S
        assert wait_budget(2.0) == 2.0
    with planning_until(time.monotonic() - 1.0):
        assert wait_budget(30.0) == 0.001
    assert wait_budget(30.0) == 30.0
