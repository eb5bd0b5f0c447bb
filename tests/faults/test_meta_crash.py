"""Metasrv dies mid-stream; nothing acknowledged is lost or doubled.

The nothing-lost check runs from fresh processes: a new Query replica and a
new SDK client read every table back after the crash.
"""

from __future__ import annotations

import threading
import time

import pyarrow.compute as pc
import pytest

import lake_sdk
from lake_core.errors import LakeError
from lake_core.ids import new_operation_id
from tools.lake_testing.data import (
    EPISODES,
    EPISODES_SCHEMA,
    create_table,
    describe_version,
    episodes,
)
from tools.lake_testing.faults import fault_env
from tools.lake_testing.plugin import LakeCluster

ROWS_PER_APPEND = 50


def _append_until_acknowledged(
    client: lake_sdk.Client,
    start: int,
    op_id: str,
    deadline: float,
    failures: list[LakeError] | None = None,
) -> int:
    """Retry one append with the same operation id until the server answers."""
    while True:
        try:
            return client.append_batches(
                EPISODES, [episodes(start, ROWS_PER_APPEND)], operation_id=op_id
            )
        except LakeError as exc:
            if not exc.retryable or time.monotonic() > deadline:
                raise
            if failures is not None:
                failures.append(exc)
            time.sleep(0.2)


def _nothing_lost(cluster: LakeCluster, acknowledged: dict[str, tuple[int, int]]) -> None:
    # Concurrent appends may share a version (a commit group); versions have no gaps.
    versions = {version for version, _ in acknowledged.values()}
    assert versions == set(range(1, len(versions) + 1)), "versions must have no gaps"
    assert describe_version(cluster.meta.addr, EPISODES) == len(versions)
    fresh = cluster.add_query()
    with lake_sdk.connect(fresh.url) as client:
        table = client.query_table("SELECT steps FROM robots.episodes")
    counts = pc.value_counts(table["steps"]).to_pylist()
    assert all(c["counts"] == 1 for c in counts), "an acknowledged row appears twice"
    expected = {start + i for _, start in acknowledged.values() for i in range(ROWS_PER_APPEND)}
    assert set(table["steps"].to_pylist()) == expected


@pytest.mark.slow
def test_sigkill_during_a_stream_of_appends(lake_cluster: LakeCluster) -> None:
    create_table(lake_cluster.meta.addr, EPISODES, EPISODES_SCHEMA)
    acknowledged: dict[str, tuple[int, int]] = {}
    errors: list[BaseException] = []
    interrupted: list[LakeError] = []

    def writer() -> None:
        try:
            with lake_sdk.connect(lake_cluster.query.url, append_attempts=1) as client:
                for n in range(40):
                    start = n * ROWS_PER_APPEND
                    op_id = new_operation_id()
                    version = _append_until_acknowledged(
                        client, start, op_id, time.monotonic() + 90, interrupted
                    )
                    acknowledged[op_id] = (version, start)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    while len(acknowledged) < 8:
        time.sleep(0.01)
    lake_cluster.meta.kill()
    time.sleep(1.0)
    lake_cluster.meta.start()
    thread.join(timeout=180)
    assert not thread.is_alive()
    assert not errors, errors
    assert len(acknowledged) == 40
    assert interrupted, "the kill must land while appends are in flight"
    _nothing_lost(lake_cluster, acknowledged)


@pytest.mark.slow
@pytest.mark.parametrize(
    "crash_point", ["before_lance_commit", "after_lance_commit", "after_registry_commit"]
)
def test_retry_after_a_crash_at_each_commit_step_gives_exactly_one_version(
    lake_cluster: LakeCluster, crash_point: str
) -> None:
    create_table(lake_cluster.meta.addr, EPISODES, EPISODES_SCHEMA)
    acknowledged: dict[str, tuple[int, int]] = {}
    with lake_sdk.connect(lake_cluster.query.url, append_attempts=1) as client:
        op_id = new_operation_id()
        acknowledged[op_id] = (
            client.append_batches(EPISODES, [episodes(0, ROWS_PER_APPEND)], operation_id=op_id),
            0,
        )

    # Restart Metasrv armed to die at the crash point of the next commit.
    armed = lake_cluster.replace_meta(fault_env(f"meta.{crash_point}"))
    op_id = new_operation_id()
    with lake_sdk.connect(lake_cluster.query.url, append_attempts=1) as client:
        try:
            with pytest.raises(LakeError) as lost:
                client.append_batches(
                    EPISODES, [episodes(1000, ROWS_PER_APPEND)], operation_id=op_id
                )
            assert lost.value.retryable, f"a lost reply must be retryable, got {lost.value!r}"
            assert armed.proc is not None
            assert armed.proc.wait(timeout=30) == 137
        finally:
            armed.stop()  # a no-op once it crashed as armed; never left running

        lake_cluster.meta.start()
        version = _append_until_acknowledged(client, 1000, op_id, time.monotonic() + 60)
        assert version == 2
        again = client.append_batches(
            EPISODES, [episodes(1000, ROWS_PER_APPEND)], operation_id=op_id
        )
        assert again == version
        acknowledged[op_id] = (version, 1000)
    _nothing_lost(lake_cluster, acknowledged)


@pytest.mark.slow
def test_sigkill_during_concurrent_appends_loses_and_doubles_nothing(
    lake_cluster: LakeCluster,
) -> None:
    """Four SDK writers at once, so Metasrv commits groups; a SIGKILL lands mid-group."""
    create_table(lake_cluster.meta.addr, EPISODES, EPISODES_SCHEMA)
    acknowledged: dict[str, tuple[int, int]] = {}
    errors: list[BaseException] = []
    interrupted: list[LakeError] = []
    lock = threading.Lock()

    def writer(base: int) -> None:
        try:
            with lake_sdk.connect(lake_cluster.query.url, append_attempts=1) as client:
                for n in range(10):
                    start, op_id = base + n * ROWS_PER_APPEND, new_operation_id()
                    version = _append_until_acknowledged(
                        client, start, op_id, time.monotonic() + 90, interrupted
                    )
                    with lock:
                        acknowledged[op_id] = (version, start)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(100_000 * w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    while len(acknowledged) < 8:
        assert not errors, errors
        time.sleep(0.01)
    lake_cluster.meta.kill()
    time.sleep(1.0)
    lake_cluster.meta.start()
    for thread in threads:
        thread.join(timeout=180)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    assert len(acknowledged) == 40
    _nothing_lost(lake_cluster, acknowledged)
