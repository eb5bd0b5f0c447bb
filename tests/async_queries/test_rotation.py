"""Durable async jobs through a ticket-key rotation, on real Query replicas.

The runbook's steps (docs/security.md): preload the new key, activate it,
retire the old one, each a restart of every replica with a new key ring. A
job submitted before activation must keep polling, resuming, retrying and
counting against its tenant's slots on every replica of a half-rolled fleet;
once its key is retired it fails typed, and the holder submits again.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

import lake_sdk
from lake_core import protocol
from lake_core.proto import flight_pb2
from lake_core.tickets import ticket_key_id
from lake_sdk._jobs import _statement
from tests.async_queries.conftest import SQL, TOKENS, AsyncLake, client
from tests.async_queries.test_lifecycle import wait_finished
from tools.lake_testing.dynalite import Dynalite
from tools.lake_testing.seaweed import SeaweedS3
from tools.lake_testing.servers import LakeProcess

KEYS = {
    "A": base64.b64encode(os.urandom(32)).decode(),
    "B": base64.b64encode(os.urandom(32)).decode(),
}
#: The retried submission's id (the SDK sends one id with every retry).
JOB_ID = "00112233445566778899aabbccddeeff"


def _ring(path: Path, active: str, keys: list[str]) -> None:
    """Write a replica's key ring as an operator would (mode 0600)."""
    doc = {"active": active, "keys": [{"id": k, "key": KEYS[k]} for k in keys]}
    path.write_text(json.dumps(doc))
    path.chmod(0o600)


def _roll(
    lake: AsyncLake, replicas: list[LakeProcess], rings: list[Path], active: str, keys: list[str]
) -> None:
    """Give each replica its new key ring and restart them (together: nothing runs between)."""
    for ring in rings:
        _ring(ring, active, keys)
    lake.restart(*replicas)


def _submit_with_id(replica: LakeProcess, sql: str = SQL) -> flight_pb2.PollInfo:
    """A raw PollFlightInfo submission carrying :data:`JOB_ID`, as a retrying client sends it."""
    descriptor = flight_pb2.FlightDescriptor(
        type=flight_pb2.FlightDescriptor.CMD, cmd=_statement(sql)
    )
    metadata = [
        ("authorization", f"Bearer {TOKENS['acme']}"),
        (protocol.ASYNC_JOB_ID_HEADER, JOB_ID),
    ]
    with grpc.insecure_channel(replica.addr) as channel:
        poll = channel.unary_unary(
            "/arrow.flight.protocol.FlightService/PollFlightInfo",
            request_serializer=flight_pb2.FlightDescriptor.SerializeToString,
            response_deserializer=flight_pb2.PollInfo.FromString,
        )
        reply: flight_pb2.PollInfo = poll(descriptor, metadata=metadata, timeout=60)
        return reply


def _claims(replicas: list[LakeProcess], job_id: str) -> int:
    """How many times any replica claimed the job (its log survives restarts)."""
    lines = (line for r in replicas for line in r.log().splitlines())
    return sum(1 for line in lines if "async job claimed" in line and job_id in line)


def _rotation(
    lake: AsyncLake,
    loaded: Callable[[int], None],
    env: dict[str, str],
    jobs: Callable[[], list[dict[str, object]]],
) -> None:
    rings = [lake.root / "ring-first.json", lake.root / "ring-second.json"]
    for ring in rings:
        _ring(ring, "A", ["A"])
    first, second = lake.add_queries(
        *({**env, "LAKE_QUERY_TICKET_KEYS_FILE": str(ring)} for ring in rings)
    )
    replicas = [first, second]
    loaded(3000)

    # Key A active: the tenant fills its 8 slots (one by a submission with a known id).
    with client(first) as acme, client(first, "globex") as globex:
        expected = acme.query_table(SQL)
        early = [acme.jobs.submit(f"{SQL} LIMIT {n + 1}") for n in range(6)]
        full = acme.jobs.submit(SQL)
        foreign = globex.jobs.submit(SQL)
        reply = _submit_with_id(first)
        with_id = lake_sdk.JobHandle(
            capability=reply.flight_descriptor.cmd, expires_at=reply.expiration_time.seconds
        )
        # Every job finished before the rotation: the stored records must not move after.
        full = wait_finished(acme, full)
        for handle in (*early, with_id):
            assert wait_finished(acme, handle).state == "done"
        assert wait_finished(globex, foreign).state == "done"
        assert full.state == "done"
    assert ticket_key_id(full.capability) == "A"
    stored = {job["job_id"]: job for job in jobs()}
    assert len(stored) == 9

    # Preload B everywhere, then activate it on the first replica only: a half-rolled fleet.
    _roll(lake, replicas, rings, "A", ["A", "B"])
    _roll(lake, [first], rings[:1], "B", ["A", "B"])

    for replica in replicas:
        with client(replica) as acme:
            # The handle from before activation polls and resumes the full result.
            refreshed = acme.jobs.poll(full)
            assert refreshed.state == "done"
            assert acme.jobs.resume(full).to_table().equals(expected)
            # The tenant's 9th outstanding job is refused, whichever key seals it.
            with pytest.raises(lake_sdk.ResourceExhausted):
                acme.jobs.submit(SQL)
            with client(replica, "acme2") as bob, pytest.raises(lake_sdk.ResourceExhausted):
                bob.jobs.submit(SQL)
            # Another tenant's handle is still another tenant's.
            with pytest.raises(lake_sdk.PermissionDenied):
                acme.jobs.poll(foreign)
        # The retried submission finds its job: it runs once.
        retried = _submit_with_id(replica)
        assert json.loads(retried.info.app_metadata)["state"] == "done"
    with client(first) as acme:
        refreshed = acme.jobs.poll(full)
    assert ticket_key_id(refreshed.capability) == "B"  # re-sealed under the active key
    assert {job["job_id"]: job for job in jobs()} == stored, "a poll or retry moved a job"
    assert _claims(replicas, JOB_ID) == 1

    # Finish the activation; a slot freed by an A-era job goes to a B-era one, and no more.
    _roll(lake, [second], rings[1:], "B", ["A", "B"])
    with client(second) as acme:
        assert acme.jobs.cancel(early[0]) is True
        late = wait_finished(acme, acme.jobs.submit(SQL))
        assert late.state == "done"
        assert ticket_key_id(late.capability) == "B"
    for replica in replicas:
        with client(replica) as acme, pytest.raises(lake_sdk.ResourceExhausted):
            acme.jobs.submit(SQL)

    # Retire A: its jobs fail typed, through either handle and on a retry; B's still serve.
    _roll(lake, replicas, rings, "B", ["B"])
    with client(first) as acme:
        for held in (full, refreshed):
            with pytest.raises(lake_sdk.FailedPrecondition, match="submit the query again"):
                acme.jobs.poll(held)
        assert acme.jobs.resume(late).to_table().equals(expected)
    with pytest.raises(grpc.RpcError) as refused:
        _submit_with_id(second)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "submit the query again" in str(refused.value.details())


def test_async_jobs_survive_a_ticket_key_rotation(
    async_lake: AsyncLake, loaded: Callable[[int], None]
) -> None:
    _rotation(async_lake, loaded, {}, async_lake.jobs)


@pytest.mark.s3
@pytest.mark.dynamodb
def test_async_jobs_survive_a_ticket_key_rotation_in_s3_mode(
    async_lake: AsyncLake,
    loaded: Callable[[int], None],
    s3_server: SeaweedS3,
    s3_bucket: str,
    dynamodb_server: Dynalite,
) -> None:
    import boto3

    table = "async_rotation_test"
    cloud = {
        **s3_server.env(),
        "AWS_ENDPOINT_URL_DYNAMODB": dynamodb_server.endpoint,
        "AWS_REGION": "us-east-1",
        "LAKE_S3_BUCKET": s3_bucket,
        "LAKE_ASYNC_DYNAMODB_TABLE": table,
        "LAKE_ASYNC_RESULT_PREFIX": "results/rotation",
    }
    dynamo = boto3.client(
        "dynamodb",
        endpoint_url=dynamodb_server.endpoint,
        region_name="us-east-1",
        aws_access_key_id="dynalite",
        aws_secret_access_key="dynalite",
    )

    def jobs() -> list[dict[str, object]]:
        items = dynamo.scan(TableName=table)["Items"]
        found = [json.loads(i["doc"]["S"]) for i in items if i["pk"]["S"].startswith("job#")]
        return sorted(found, key=lambda job: str(job["job_id"]))

    _rotation(async_lake, loaded, cloud, jobs)
    assert not (async_lake.data_dir / "async-query-state").exists()
