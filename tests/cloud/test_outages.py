"""Storage outages: S3 stops answering, DynamoDB restarts.

Query and Metasrv must answer UNAVAILABLE within their storage timeouts
(``LAKE_STORAGE_TIMEOUT_MS`` is 3 s here), never hang, and work again once
storage is back; nothing acknowledged is lost.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path

import pytest

from lake_core import protocol
from lake_core.errors import LakeError, Unavailable
from lake_core.ids import new_operation_id
from lake_core.names import TableRef
from tests.cloud.test_failover import ROWS, append_until_acknowledged, nothing_lost
from tools.lake_testing.data import EPISODES, EPISODES_SCHEMA, episodes
from tools.lake_testing.seaweed import SeaweedS3

pytestmark = [pytest.mark.slow, pytest.mark.s3, pytest.mark.dynamodb]

PROMPT_S = 15.0
PLANNING_MS = 6000


def test_s3_unreachable_is_unavailable_promptly_then_recovers(
    make_cloud_lake, tmp_path: Path
) -> None:
    s3 = SeaweedS3(tmp_path / "own-s3").start()  # this test pauses it: not the shared server
    try:
        lake = make_cloud_lake(s3=s3, meta_env={"LAKE_SHUTDOWN_GRACE_MS": "1000"})
        meta, query = lake.start_meta_and_query()
        lake.admin(lambda c: c.create_table(EPISODES, EPISODES_SCHEMA))
        acknowledged: dict[str, tuple[int, int]] = {}
        failures: list[LakeError] = []
        with lake.sdk(query) as client:
            first = new_operation_id()
            acknowledged[first] = (
                client.append_batches(EPISODES, [episodes(0, ROWS)], operation_id=first),
                0,
            )
            assert (
                client.query_table("SELECT count(*) AS n FROM robots.episodes")["n"][0].as_py()
                == ROWS
            )

            s3.pause()
            try:
                second = new_operation_id()
                started = time.monotonic()
                with pytest.raises(Unavailable):
                    client.append_batches(EPISODES, [episodes(ROWS, ROWS)], operation_id=second)
                print(f"append UNAVAILABLE after {time.monotonic() - started:.2f}s")
                assert time.monotonic() - started < PROMPT_S
                started = time.monotonic()
                with pytest.raises(Unavailable):
                    client.query_table("SELECT count(*) AS n FROM robots.episodes")
                print(f"query UNAVAILABLE after {time.monotonic() - started:.2f}s")
                assert time.monotonic() - started < PROMPT_S
                # Metadata reads do not touch S3: Metasrv still describes the table.
                described = lake.admin(lambda c: c.describe_table(EPISODES))
                assert described.entry.descriptor.version == 1
            finally:
                s3.resume()

            # Back: the same operation id commits once, and reads work again.
            version = append_until_acknowledged(
                client, ROWS, second, time.monotonic() + 60, failures
            )
            assert version == 2
            acknowledged[second] = (version, ROWS)
            table = client.query_table("SELECT count(*) AS n FROM robots.episodes")
            assert table["n"][0].as_py() == 2 * ROWS
        nothing_lost(lake, acknowledged)

        # A write stuck on S3 outlives LAKE_SHUTDOWN_GRACE_MS (1 s): SIGTERM exits
        # non-zero, and the lease is still handed back at once.
        s3.pause()
        try:
            stuck: list[object] = []

            def append_stuck() -> None:
                async def go() -> object:
                    async with lake.meta_client(meta) as direct:
                        command = protocol.AppendCommand(
                            table=EPISODES, operation_id=new_operation_id()
                        )
                        return await direct.append(
                            command, EPISODES_SCHEMA, [episodes(99_000, ROWS)]
                        )

                try:
                    stuck.append(asyncio.run(go()))
                except LakeError as exc:
                    stuck.append(exc)

            thread = threading.Thread(target=append_stuck)
            thread.start()
            time.sleep(0.5)
            meta.signal(signal.SIGTERM)
            assert meta.proc is not None
            assert meta.proc.wait(timeout=60) != 0
            thread.join(timeout=60)
            assert len(stuck) == 1
            assert isinstance(stuck[0], LakeError)
            assert lake.lease().get("released") is True
        finally:
            s3.resume()
    finally:
        s3.stop()


def test_dynalite_restart_between_two_appends_loses_nothing(make_cloud_lake) -> None:
    lake = make_cloud_lake()
    meta, query = lake.start_meta_and_query()
    lake.admin(lambda c: c.create_table(EPISODES, EPISODES_SCHEMA))
    acknowledged: dict[str, tuple[int, int]] = {}
    failures: list[LakeError] = []
    with lake.sdk(query) as client:
        first = new_operation_id()
        acknowledged[first] = (
            client.append_batches(EPISODES, [episodes(0, ROWS)], operation_id=first),
            0,
        )
        lake.dynamo.restart()
        second = new_operation_id()
        version = append_until_acknowledged(client, ROWS, second, time.monotonic() + 60, failures)
        acknowledged[second] = (version, ROWS)
        assert (
            client.append_batches(EPISODES, [episodes(ROWS, ROWS)], operation_id=second) == version
        )
    assert lake.leader() is meta
    nothing_lost(lake, acknowledged)


def test_dynamodb_down_refuses_appends_reads_verified_tables_then_recovers(
    make_cloud_lake,
) -> None:
    # Found by stopping dynalite under a serving cloud Lake. First the query came
    # back DataCorrupted ("its stored files are damaged"), since only S3 was probed.
    # Then it waited out Lance's DynamoDB client (9-16 s, past the planning deadline
    # on a slow machine) to say Unavailable, though a registered version's manifest
    # is in S3; and a table this replica had not verified yet waited for Metasrv's
    # digests past the deadline: DEADLINE_EXCEEDED, "simplify it", a lost thread.
    # Such a wait rides out a Metasrv takeover until just before the planning
    # deadline, made short here so that "before it" is well inside PROMPT_S.
    lake = make_cloud_lake(query_env={"LAKE_QUERY_PLANNING_TIMEOUT_MS": str(PLANNING_MS)})
    _meta, query = lake.start_meta_and_query()
    unread = TableRef("robots", "unread")
    lake.admin(lambda c: c.create_table(EPISODES, EPISODES_SCHEMA))
    lake.admin(lambda c: c.create_table(unread, EPISODES_SCHEMA))
    acknowledged: dict[str, tuple[int, int]] = {}
    with lake.sdk(query) as client:
        first = new_operation_id()
        acknowledged[first] = (
            client.append_batches(EPISODES, [episodes(0, ROWS)], operation_id=first),
            0,
        )
        client.append_batches(unread, [episodes(0, ROWS)])
        read = "SELECT count(*) AS n FROM robots.episodes"
        assert client.query_table(read)["n"][0].as_py() == ROWS
        lake.dynamo.stop()
        try:
            second = new_operation_id()
            started = time.monotonic()
            with pytest.raises(Unavailable):
                client.append_batches(EPISODES, [episodes(ROWS, ROWS)], operation_id=second)
            assert time.monotonic() - started < PROMPT_S
            # The pinned version is read from S3 alone; its files were verified before.
            started = time.monotonic()
            assert client.query_table(read)["n"][0].as_py() == ROWS
            assert time.monotonic() - started < PROMPT_S
            # Never verified here, and Metasrv (whose lease lives in DynamoDB) gives
            # no digests: a retryable outage, not the planning deadline's error.
            started = time.monotonic()
            with pytest.raises(Unavailable):
                client.query_table("SELECT count(*) AS n FROM robots.unread")
            assert time.monotonic() - started < PROMPT_S
        finally:
            lake.dynamo.start()
        assert "planning past its deadline" not in lake.logs()
        version = append_until_acknowledged(client, ROWS, second, time.monotonic() + 90, [])
        acknowledged[second] = (version, ROWS)
        assert version == 2
        assert client.query_table("SELECT count(*) AS n FROM robots.unread")["n"][0].as_py() == ROWS
    nothing_lost(lake, acknowledged)
