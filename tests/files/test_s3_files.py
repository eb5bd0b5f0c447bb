"""FILE values on a real S3 stage (SeaweedFS): uploads, verified and ranged reads,
presigned and Query-issued capabilities, tenant escapes and corruption."""

from __future__ import annotations

import asyncio
import hashlib
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import lake_sdk
from lake_core.errors import PermissionDenied
from lake_core.filetype import FILE_STRUCT
from lake_core.models import DataLocation
from lake_objects import (
    CapabilityRejected,
    FileUpload,
    HashMismatch,
    InvalidRange,
    InvalidUpload,
    LocationOutsideStage,
    ObjectOverlong,
    ObjectReader,
    ObjectStoreUnavailable,
    PrematureEof,
    RangeMismatch,
    S3ObjectStore,
    StageUnavailable,
    TooManyParts,
)
from lake_sdk import LakeClient
from tests.files.conftest import EPISODES, INSERT, MIB, PREFIX, S3Lake, write_random
from tools.lake_testing.s3proxy import S3Proxy

pytestmark = [pytest.mark.s3, pytest.mark.asyncio]


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


async def _upload(lake: S3Lake, tmp_path: Path, size: int, seed: int = 1) -> DataLocation:
    source = write_random(tmp_path / f"src-{seed}.bin", size, seed)
    async with await LakeClient.connect(lake.url) as client:
        await client.insert(INSERT, [f"ep-{seed}", FileUpload.from_path(source, "video/mp4")])
        table = await client.query_table(
            f"SELECT video FROM robots.episodes WHERE episode_id = 'ep-{seed}'"
        )
    return lake_sdk.data_location(table, "video", 0)


async def test_multipart_insert_and_verified_read(s3_lake: S3Lake, tmp_path: Path) -> None:
    size = 4 * 5 * MIB + 12345  # five 5 MiB parts under the test part size
    source = write_random(tmp_path / "video.bin", size)
    progress: list[int] = []
    async with await LakeClient.connect(s3_lake.url, upload_concurrency=2) as client:
        version = await client.insert_many(
            INSERT,
            [
                ["ep-1", FileUpload.from_path(source, "video/mp4")],
                ["ep-2", FileUpload.from_path(source, "video/mp4")],
            ],
            progress=lambda p: progress.append(p.done),
        )
        assert version == 1  # one append, one table version for the batch
        store = await client.object_store()
        assert isinstance(store, S3ObjectStore)
        assert store.requests["UploadPart"] == 10
        assert store.requests["CompleteMultipartUpload"] == 2
        table = await client.query_table("SELECT * FROM robots.episodes ORDER BY episode_id")
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
        for row in range(2):
            location = lake_sdk.data_location(table, "video", row)
            assert location.uri.startswith(f"s3://{s3_lake.bucket}/{PREFIX}/tenants/local/")
            assert (location.size_bytes, location.sha256) == (size, digest)
            reader = await client.open(location)
            out = tmp_path / f"out-{row}.bin"
            assert await reader.copy_to(out) == size
            assert reader.verified
            assert hashlib.sha256(out.read_bytes()).hexdigest() == digest
    assert progress[-1] == size
    assert s3_lake.open_uploads() == []


async def test_empty_and_reader_uploads(s3_lake: S3Lake) -> None:
    async def chunks():  # type: ignore[no-untyped-def]
        for i in range(7):
            yield bytes([i]) * MIB

    async with await LakeClient.connect(s3_lake.url) as client:
        await client.insert_many(
            INSERT,
            [
                ["empty", FileUpload.from_reader(iter_bytes(b""), "application/octet-stream")],
                ["stream", FileUpload.from_reader(chunks(), "application/octet-stream")],
            ],
        )
        table = await client.query_table("SELECT * FROM robots.episodes ORDER BY episode_id")
        empty = lake_sdk.data_location(table, "video", 0)
        stream = lake_sdk.data_location(table, "video", 1)
        assert (empty.size_bytes, empty.sha256) == (0, hashlib.sha256(b"").hexdigest())
        assert stream.size_bytes == 7 * MIB
        assert await (await client.open(empty)).read() == b""
        data = await (await client.open(stream)).read()
        assert data == b"".join(bytes([i]) * MIB for i in range(7))
    assert s3_lake.open_uploads() == []


class iter_bytes:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def read(self, size: int = -1) -> bytes:
        data, self._data = self._data[:size], self._data[size:]
        return data


async def test_ranges_are_exact_and_bad_ranges_do_no_io(s3_lake: S3Lake, tmp_path: Path) -> None:
    location = await _upload(s3_lake, tmp_path, 6 * MIB + 7)
    data = (tmp_path / "src-1.bin").read_bytes()
    async with await LakeClient.connect(s3_lake.url) as client:
        for start, end in [
            (0, 1),
            (5 * MIB - 3, 5 * MIB + 3),
            (0, len(data)),
            (len(data) - 1, len(data)),
        ]:
            reader = await client.open_range(location, start, end)
            assert await reader.read() == data[start:end]
        store = await client.object_store()
        before = dict(store.requests)
        proxied = s3_lake.proxy.total
        for start, end in [(5, 5), (9, 3), (0, len(data) + 1), (-1, 4)]:
            with pytest.raises(InvalidRange):
                await client.open_range(location, start, end)
        assert dict(store.requests) == before
        assert s3_lake.proxy.total == proxied


async def test_content_range_must_be_exact(s3_lake: S3Lake, tmp_path: Path) -> None:
    location = await _upload(s3_lake, tmp_path, 2 * MIB)
    async with await LakeClient.connect(s3_lake.url) as client:
        for fault in ("bad_content_range", "ignore_range"):
            s3_lake.proxy.fault = fault
            try:
                with pytest.raises(RangeMismatch):
                    await client.open_range(location, 100, 200)
            finally:
                s3_lake.proxy.fault = None
        assert await (await client.open_range(location, 100, 200)).read() != b""


async def test_a_range_beyond_a_shrunk_object_is_an_integrity_error(
    s3_lake: S3Lake, tmp_path: Path
) -> None:
    """S3's 416 for a range the DataLocation allows means the object is shorter than declared.

    Found by overwriting a stored object with fewer bytes: the direct read said
    ObjectStoreUnavailable (retry), which no retry could ever fix.
    """
    location = await _upload(s3_lake, tmp_path, MIB)
    key = location.uri.removeprefix(f"s3://{s3_lake.bucket}/")
    s3_lake.client().put_object(Bucket=s3_lake.bucket, Key=key, Body=b"short")
    async with await LakeClient.connect(s3_lake.url) as client:
        with pytest.raises(RangeMismatch, match="416"):
            await client.open_range(location, 100, 200)
        with pytest.raises(RangeMismatch, match="416"):
            await client.open_range_via_query(location, 100, 200, 60)


async def test_a_ranged_capability_read_during_an_outage_is_unavailable(
    s3_lake: S3Lake, tmp_path: Path
) -> None:
    """A 503 (or 429) answer to a ranged GET is an outage to retry, not a wrong range.

    Found by answering 503 from the S3 proxy: open_range_via_query raised
    RangeMismatch (an integrity error) while the direct read said Unavailable.
    """
    location = await _upload(s3_lake, tmp_path, MIB)
    async with await LakeClient.connect(s3_lake.url) as client:
        s3_lake.proxy.fault = "unavailable"
        try:
            with pytest.raises(ObjectStoreUnavailable):
                await client.open_range_via_query(location, 0, 10, 60)
            with pytest.raises(ObjectStoreUnavailable):
                await client.open_range(location, 0, 10)
        finally:
            s3_lake.proxy.fault = None
        assert await (await client.open_range_via_query(location, 0, 10, 60)).read() != b""


async def _drain(client: LakeClient, location: DataLocation) -> bytes:
    return await (await client.open(location)).read()


async def _read_all(opened: Awaitable[ObjectReader]) -> bytes:
    return await (await opened).read()


#: The storage_timeout the stall tests give their clients, in seconds.
STALL_S = 1.0
#: Slack on top of the documented bound, for a loaded machine (the old wait was minutes).
SLACK_S = 10.0


async def _fails_promptly(
    proxy_fault: str, lake: S3Lake, read: Any, bound_s: float, proxy: S3Proxy | None = None
) -> None:
    """``read()`` under ``proxy_fault`` (of ``proxy``, or the lake's) raises a retryable
    ObjectStoreUnavailable within bound."""
    proxy = proxy or lake.proxy
    proxy.fault = proxy_fault
    began = time.monotonic()
    try:
        with pytest.raises(ObjectStoreUnavailable) as caught:
            await asyncio.wait_for(read(), 60)
    finally:
        proxy.fault = None
    took = time.monotonic() - began
    assert caught.value.retryable
    assert took < bound_s, f"{proxy_fault}: {took:.1f}s"


async def test_a_stalled_s3_fails_a_read_within_the_storage_timeout(
    s3_lake: S3Lake, tmp_path: Path
) -> None:
    """S3 that stops answering is ObjectStoreUnavailable within the client's storage_timeout.

    Found by stalling S3 under an SDK read (/tmp/attack/sdkcli/s3_stall.py): a
    GET waited 120 s per try, five tries (about 10 minutes), and a body that
    went silent 120 s, with no way for the caller to shorten it. Direct reads
    try three times (3 x storage_timeout and backoffs); capability reads once.
    """
    location = await _upload(s3_lake, tmp_path, MIB)
    async with lake_sdk.AsyncClient(s3_lake.url, storage_timeout=STALL_S) as client:
        for fault in ("stall", "stall_body"):
            await _fails_promptly(
                fault, s3_lake, lambda: _drain(client, location), 3 * STALL_S + SLACK_S
            )
    async with lake_sdk.AsyncClient(
        s3_lake.url, query_only=True, storage_timeout=STALL_S
    ) as client:
        for fault in ("stall", "stall_body"):
            await _fails_promptly(
                fault,
                s3_lake,
                lambda: _read_all(client.open_via_query(location, 60)),
                STALL_S + SLACK_S,
            )


async def test_a_slow_moving_read_outlasts_the_storage_timeout(
    s3_lake: S3Lake, tmp_path: Path
) -> None:
    """storage_timeout bounds silence, not the transfer: a read far longer than it completes."""
    location = await _upload(s3_lake, tmp_path, MIB)
    s3_lake.proxy.trickle_gap_s = STALL_S / 2  # 16 slivers: 8 s, four times 2 x storage_timeout
    s3_lake.proxy.fault = "trickle"
    try:
        async with lake_sdk.AsyncClient(s3_lake.url, storage_timeout=STALL_S) as client:
            began = time.monotonic()
            direct = await _drain(client, location)
            assert time.monotonic() - began > 4 * STALL_S
        async with lake_sdk.AsyncClient(
            s3_lake.url, query_only=True, storage_timeout=STALL_S
        ) as client:
            via_query = await _read_all(client.open_via_query(location, 60))
    finally:
        s3_lake.proxy.fault = None
    assert hashlib.sha256(direct).hexdigest() == location.sha256
    assert via_query == direct


@pytest.fixture
def upload_proxy(s3_lake: S3Lake, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Proxy]:
    """A second proxy for this test process's (the SDK's) S3 requests, with a 4 KiB
    receive buffer: what a stalled upload sent stays in the SDK's own buffers, as
    when a far store shuts its TCP window (here the kernel would take megabytes)."""
    proxy = S3Proxy(s3_lake.server.endpoint, recv_buffer=4096).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
    try:
        yield proxy
    finally:
        proxy.stop()


async def test_a_stalled_upload_fails_within_the_storage_timeout(
    s3_lake: S3Lake, upload_proxy: S3Proxy, tmp_path: Path
) -> None:
    """An S3 that stops taking an upload's body fails it, typed, within the storage_timeout.

    Found by stalling a PUT's body mid-part (/tmp/attack/uploadstall/repro.py):
    aiohttp starts botocore's read timeout only once the body was sent, and
    waits for ``100 Continue`` with no timeout, so a single PUT or a multipart
    part hung forever. Each of three tries now fails within 1.25 x
    storage_timeout; the multipart upload is aborted and no object is left.
    """
    single = write_random(tmp_path / "single.bin", 4 * MIB, 1)
    multi = write_random(tmp_path / "multi.bin", 2 * 5 * MIB, 2)
    async with lake_sdk.AsyncClient(s3_lake.url, storage_timeout=STALL_S) as client:
        store = await client.object_store()
        assert isinstance(store, S3ObjectStore)
        assert store.part_size == 5 * MIB
        for after in (64 * 1024, 0):  # mid-body; before ``100 Continue``
            upload_proxy.upload_stall_after = after
            for source in (single, multi):
                await _fails_promptly(
                    "stall_upload",
                    s3_lake,
                    lambda source=source: store.upload(FileUpload.from_path(source, "video/mp4")),
                    3 * 1.25 * STALL_S + SLACK_S,
                    proxy=upload_proxy,
                )
        assert store.requests["AbortMultipartUpload"] == 2
        assert upload_proxy.stalled >= 4 * 3
    assert s3_lake.open_uploads() == []
    listed = s3_lake.client().list_objects_v2(Bucket=s3_lake.bucket)
    assert [o["Key"] for o in listed.get("Contents", []) if "/objects/" in o["Key"]] == []


async def test_a_slow_moving_upload_outlasts_the_storage_timeout(
    s3_lake: S3Lake, upload_proxy: S3Proxy, tmp_path: Path
) -> None:
    """storage_timeout bounds silence, not the upload: a store that takes each
    body slowly but steadily, for longer than it, still gets the whole object."""
    upload_proxy.upload_gap_s = 0.15 * STALL_S  # 1 MiB in 16 steps: 2.4 x storage_timeout
    single = write_random(tmp_path / "single.bin", 5 * MIB - 1, 3)
    multi = write_random(tmp_path / "multi.bin", 2 * 5 * MIB, 4)
    upload_proxy.fault = "slow_upload"
    try:
        async with lake_sdk.AsyncClient(s3_lake.url, storage_timeout=STALL_S) as client:
            store = await client.object_store()
            for source in (single, multi):
                began = time.monotonic()
                location = await store.upload(FileUpload.from_path(source, "video/mp4"))
                assert time.monotonic() - began > 2 * STALL_S
                assert location.sha256 == hashlib.sha256(source.read_bytes()).hexdigest()
                upload_proxy.fault = None
                assert await (await store.open(location)).read() == source.read_bytes()
                upload_proxy.fault = "slow_upload"
    finally:
        upload_proxy.fault = None


async def test_corrupted_objects_fail_open(s3_lake: S3Lake, tmp_path: Path) -> None:
    location = await _upload(s3_lake, tmp_path, 3 * MIB)
    data = (tmp_path / "src-1.bin").read_bytes()
    key = location.uri.removeprefix(f"s3://{s3_lake.bucket}/")
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x01
    cases = [
        (bytes(flipped), HashMismatch),
        (data[:-1], PrematureEof),
        (data + b"x", ObjectOverlong),
    ]
    async with await LakeClient.connect(s3_lake.url) as client:
        for body, error in cases:
            s3_lake.client().put_object(Bucket=s3_lake.bucket, Key=key, Body=body)
            with pytest.raises(error):
                await _drain(client, location)


async def test_presigned_capability_expires_and_resists_tampering(
    s3_lake: S3Lake, tmp_path: Path
) -> None:
    location = await _upload(s3_lake, tmp_path, 1000)
    async with await LakeClient.connect(s3_lake.url) as client:
        capability = await client.presign_read(location, 2)
        assert "X-Amz" not in repr(capability)
        assert capability.url not in str(capability)
        assert get(capability.url, dict(capability.headers))[0] == 200
        parsed = urllib.parse.urlsplit(capability.url)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        tampered = []
        for name, value in (
            (
                "X-Amz-Signature",
                ("0" if query["X-Amz-Signature"][0] != "0" else "1") + query["X-Amz-Signature"][1:],
            ),
            ("X-Amz-Expires", "3600"),
        ):
            changed = {**query, name: value}
            tampered.append(parsed._replace(query=urllib.parse.urlencode(changed)).geturl())
        other_key = parsed._replace(
            path=parsed.path[:-1] + ("0" if parsed.path[-1] != "0" else "1")
        )
        tampered.append(other_key.geturl())
        for url in tampered:
            assert get(url)[0] == 403
        for bad in (0, 3601, 1.5):
            with pytest.raises(lake_sdk.InvalidArgument, match="ttl"):
                await client.presign_read(location, bad)
        await asyncio.sleep(3.5)
        assert get(capability.url)[0] == 403


async def test_query_only_client_reads_through_query_capabilities(
    s3_lake: S3Lake, tmp_path: Path
) -> None:
    location = await _upload(s3_lake, tmp_path, 6 * MIB)
    data = (tmp_path / "src-1.bin").read_bytes()
    async with await LakeClient.connect_query_only(s3_lake.url) as client:
        with pytest.raises(StageUnavailable):
            await client.open(location)
        reader = await client.open_via_query(location, 60)
        assert await reader.read() == data
        assert reader.verified
        window = await client.open_range_via_query(location, 5 * MIB - 10, 5 * MIB + 10, 60)
        assert await window.read() == data[5 * MIB - 10 : 5 * MIB + 10]
        capability = await client.presign_read_via_query(location, 30)
        assert capability.url not in repr(capability)
        assert get(capability.url)[1] == data
        with pytest.raises(InvalidRange):
            await client.open_range_via_query(location, 10, 10, 60)
        s3_lake.proxy.fault = "redirect"
        try:
            with pytest.raises(CapabilityRejected):
                await client.open_via_query(location, 60)
        finally:
            s3_lake.proxy.fault = None
    assert "X-Amz-Signature" not in s3_lake.cluster.query.log()


ESCAPES = [
    "s3://{bucket}/{prefix}/tenants/other/objects/x",
    "s3://{bucket}/{prefix}/tenants/local/../other/objects/x",
    "s3://{bucket}/{prefix}/tenants/local/%2e%2e/other/x",
    "s3://{bucket}/{prefix}/tenants/local/objects/%2E%2E%2Fx",
    "s3://{bucket}/{prefix}/tenants/local//x",
    "s3://{bucket}/{prefix}/tenants/localx/objects/x",
    "s3://other-bucket/{prefix}/tenants/local/objects/x",
    "s3://{bucket}/tenants/local/objects/x",
    "file:///etc/passwd",
    "/etc/passwd",
    "S3://{bucket}/{prefix}/tenants/local/objects/x",
    "s3://{bucket}/{prefix}/tenants/local/objects/x?versionId=1",
]


def _escapes(lake: S3Lake) -> list[DataLocation]:
    return [
        DataLocation(
            uri=u.format(bucket=lake.bucket, prefix=PREFIX),
            media_type="video/mp4",
            size_bytes=10,
            sha256="ab" * 32,
        )
        for u in ESCAPES
    ]


async def test_tenant_escapes_refused_by_sdk_query_and_metasrv_without_storage_requests(
    s3_lake: S3Lake,
) -> None:
    from lake_core.ids import new_operation_id
    from lake_core.metaclient import MetaClient
    from lake_core.protocol import AppendCommand

    async with await LakeClient.connect(s3_lake.url) as client:
        store = await client.object_store()
        query_only = await LakeClient.connect_query_only(s3_lake.url)
        proxied = s3_lake.proxy.total
        for location in _escapes(s3_lake):
            # SDK: reads, ranges, presigning, inserts of an existing DataLocation.
            with pytest.raises(LocationOutsideStage):
                await client.open(location)
            with pytest.raises(LocationOutsideStage):
                await client.open_range(location, 0, 5)
            with pytest.raises(LocationOutsideStage):
                await client.presign_read(location, 60)
            with pytest.raises(LocationOutsideStage):
                await client.insert(INSERT, ["ep-x", location])
            # Query: capability issuance and appends.
            with pytest.raises(PermissionDenied):
                await query_only.open_via_query(location, 60)
            batch = pa.RecordBatch.from_arrays(
                [pa.array(["ep-x"]), pa.array([location.model_dump()], FILE_STRUCT)],
                schema=await client.table_schema(EPISODES),
            )
            with pytest.raises(PermissionDenied):
                await query_only.append_batches(EPISODES, [batch])
            # Metasrv, reached directly (bypassing Query).
            async with MetaClient(f"http://{s3_lake.cluster.meta.addr}") as meta:
                with pytest.raises(PermissionDenied):
                    await meta.append(
                        AppendCommand(table=EPISODES, operation_id=new_operation_id()),
                        batch.schema,
                        [batch],
                    )
        await query_only.close()
        assert sum(store.requests.values()) == 0
        assert s3_lake.proxy.total == proxied == 0
        assert (await client.query_table("SELECT count(*) AS n FROM robots.episodes"))["n"][
            0
        ].as_py() == 0


async def test_upload_limits_fail_before_any_s3_request(s3_lake: S3Lake, tmp_path: Path) -> None:
    for bad in (0, 17, -1):
        with pytest.raises(InvalidUpload):
            await LakeClient.connect(s3_lake.url, upload_concurrency=bad)
    async with await LakeClient.connect(s3_lake.url) as client:
        store = await client.object_store()
        assert isinstance(store, S3ObjectStore)
        store.max_parts = 2  # stands in for S3's 10,000 so the test moves 15 MiB, not 50 GB

        async def three_parts():  # type: ignore[no-untyped-def]
            for i in range(15):
                yield bytes([i]) * MIB

        with pytest.raises(TooManyParts):
            await client.insert(INSERT, ["big", FileUpload.from_reader(three_parts(), "video/mp4")])
        assert store.requests["UploadPart"] == 2  # part 3 was never sent
        assert store.requests["AbortMultipartUpload"] == 1
        big = write_random(tmp_path / "big.bin", 11 * MIB)
        store.requests.clear()
        with pytest.raises(TooManyParts):
            await client.insert(INSERT, ["big", FileUpload.from_path(big, "video/mp4")])
        assert sum(store.requests.values()) == 0
    assert s3_lake.open_uploads() == []


async def test_cancelled_upload_is_aborted(s3_lake: S3Lake) -> None:
    started = asyncio.Event()

    async def slow():  # type: ignore[no-untyped-def]
        for i in range(40):
            if i == 12:
                started.set()
            yield bytes([i]) * MIB
            await asyncio.sleep(0.05)

    async with await LakeClient.connect(s3_lake.url) as client:
        task = asyncio.create_task(
            client.insert(INSERT, ["slow", FileUpload.from_reader(slow(), "video/mp4")])
        )
        await started.wait()
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        store = await client.object_store()
        assert store.requests["AbortMultipartUpload"] == 1
    assert s3_lake.open_uploads() == []


async def test_a_file_truncated_while_uploading_is_not_stored(
    s3_lake: S3Lake, tmp_path: Path
) -> None:
    """Its torn bytes were completed as an object whose DataLocation then verified."""
    async with await LakeClient.connect(s3_lake.url) as client:
        store = await client.object_store()
        assert isinstance(store, S3ObjectStore)
        source = write_random(tmp_path / "src.bin", 3 * store.part_size, 7)

        def truncate(progress) -> None:  # type: ignore[no-untyped-def]
            if 0 < progress.done < 3 * store.part_size:  # after the first part
                source.write_bytes(b"x" * MIB)

        with pytest.raises(InvalidUpload, match="changed while it was uploaded"):
            await store.upload(FileUpload.from_path(source, "video/mp4"), progress=truncate)
        rows = await client.query_table("SELECT count(*) AS n FROM robots.episodes")
    assert rows.column("n")[0].as_py() == 0
