"""Managed-object benchmarks: SDK uploads and reads against raw references doing the same work.

- ``s3_upload_2gib``: the SDK's upload of a 2 GiB file to SeaweedFS (64 MiB
  parts, 4 in flight, streaming SHA-256) against raw aioboto3 multipart with
  the same part size and concurrency, SHA-256 on a worker thread and the
  same zero-copy part body, to the same endpoint. Goal >= 0.95.
- ``s3_upload_peak_rss``: peak RSS growth of a 2 GiB upload in a fresh
  process, against the *bound* part size x (concurrency + 2) + 100 MiB (a
  computed budget, not a measurement). Goal <= 1.
- ``s3_upload_rss_2048mib_vs_256mib``: peak RSS growth uploading 2 GiB
  against 256 MiB, each in a fresh process. Goal: at most +32 MiB.
- ``s3_range_64mib``: a 64 MiB ``open_range`` through the SDK against a raw
  ranged GET, both read in the same 1 MiB chunks and discarded. Goal >= 0.95.
- ``s3_open_256mib``: a whole verified ``open`` (size and SHA-256 proved at
  EOF) against a raw GET read in the same chunks and hashed the same way
  (SHA-256 of each chunk on a worker thread). Goal >= 0.95.
- ``verified_open_local_1gib``: draining ``open`` of a local 1 GiB object
  against hashlib SHA-256 over the same file in Lake's local chunk size.
  Goal >= 0.9.

Every uploaded object is deleted after its sample (untimed), and each group
of figures has its own SeaweedFS, removed after it (a full run needs ~25 GiB
of free space in the temp directory). Quick mode uses small sizes and few
pairs (a smoke test, not a measurement).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from lake_core.models import DataLocation
from lake_objects import FileUpload, StageSettings, open_store
from lake_objects._body import PartBody
from lake_objects.local import LOCAL_CHUNK_SIZE
from lake_objects.reader import CHUNK_SIZE
from lake_objects.s3 import DEFAULT_PART_SIZE, DEFAULT_UPLOAD_CONCURRENCY, s3_client
from tools.bench.harness import (
    Figure,
    alternate,
    at_least,
    at_most,
    figure,
    measure,
    pairs_for,
    timed,
    warmup_for,
)
from tools.lake_testing.seaweed import SeaweedS3

MIB = 1024 * 1024
BUCKET = "bench"


def _write_random(path: Path, size: int) -> Path:
    rng = np.random.default_rng(7)
    with path.open("wb") as out:
        left = size
        while left:
            step = min(left, 16 * MIB)
            out.write(rng.bytes(step))
            left -= step
    return path


def _throughput(size: int, fn: Callable[[], object]) -> Callable[[], float]:
    return lambda: size / MIB / timed(fn)


def _higher(goal: float, text: str) -> dict[str, Any]:
    return {"unit": "MiB/s", "goal": at_least(goal, text)}


async def _raw_multipart(client: Any, key: str, path: Path) -> str:
    """The reference: plain aioboto3 multipart doing the same work as Lake's upload.

    Same part size and concurrency; a slot is taken before each part is read;
    the part is read and SHA-256 updated on a worker thread, in source order;
    the same zero-copy part body. Returns the object's SHA-256.
    """
    created = await client.create_multipart_upload(Bucket=BUCKET, Key=key)
    slots = asyncio.Semaphore(DEFAULT_UPLOAD_CONCURRENCY)
    parts: list[dict[str, Any]] = []
    hasher = hashlib.sha256()

    async def send(number: int, body: PartBody) -> None:
        try:
            reply = await client.upload_part(
                Bucket=BUCKET, Key=key, UploadId=created["UploadId"], PartNumber=number, Body=body
            )
            parts.append({"PartNumber": number, "ETag": reply["ETag"]})
        finally:
            body.release()
            slots.release()

    def read_and_hash(source: Any) -> bytes:
        data: bytes = source.read(DEFAULT_PART_SIZE)
        hasher.update(data)
        return data

    tasks = []
    with path.open("rb") as source:
        number = 0
        while True:
            await slots.acquire()
            data = await asyncio.to_thread(read_and_hash, source)
            if not data:
                slots.release()
                break
            number += 1
            tasks.append(asyncio.create_task(send(number, PartBody(data))))
            del data
        await asyncio.gather(*tasks)
    parts.sort(key=lambda p: p["PartNumber"])
    await client.complete_multipart_upload(
        Bucket=BUCKET, Key=key, UploadId=created["UploadId"], MultipartUpload={"Parts": parts}
    )
    return hasher.hexdigest()


# VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec from the forking
# parent, so a child would inherit the benchmark process's own peak.
RSS_CHILD = """
import asyncio, json, sys
from lake_objects import FileUpload, StageSettings, open_store

def status_mib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024

async def main(bucket, path):
    store = open_store(StageSettings.s3(bucket).descriptor("bench"))
    await store.client()
    base = status_mib("VmRSS")
    await store.upload(FileUpload.from_path(path, "application/octet-stream"))
    peak = status_mib("VmHWM")
    await store.close()
    print(json.dumps({"base": base, "peak": peak}))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def _rss_growth(server: SeaweedS3, path: Path) -> float:
    done = subprocess.run(
        [sys.executable, "-c", RSS_CHILD, BUCKET, str(path)],
        env={**os.environ, **server.env()},
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return float(result["peak"] - result["base"])


def run(quick: bool) -> list[Figure]:
    upload_size = 128 * MIB if quick else 2048 * MIB
    open_size = 64 * MIB if quick else 1024 * MIB
    range_size = 16 * MIB if quick else 64 * MIB
    full_size = 32 * MIB if quick else 256 * MIB
    small, large = (256 * MIB, 320 * MIB) if quick else (256 * MIB, 2048 * MIB)
    pairs, warmup = pairs_for(quick), warmup_for(quick)
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="lake-objects-bench-") as tmp:
        root = Path(tmp)
        with ExitStack() as stack:
            # Quick runs share one SeaweedFS (its start-up is most of their time).
            shared = stack.enter_context(_seaweed(root / "s3")) if quick else None
            with _server(root / "upload", shared) as server:
                figures.append(_upload_figure(server, root, upload_size, pairs, warmup))
            with _server(root / "read", shared) as server:
                figures += _read_figures(server, root, range_size, full_size, pairs, warmup)
            with _server(root / "rss", shared) as server:
                figures += _rss_figures(server, root, small, large, 1 if quick else None)
        figures.append(_open_figure(root, open_size, pairs, warmup))
    return figures


@contextmanager
def _server(root: Path, shared: SeaweedS3 | None) -> Iterator[SeaweedS3]:
    """``shared``, or a SeaweedFS of its own removed after the group: deleted objects
    keep their disk space until the server goes, and 12 uploads of 2 GiB would hold
    24 GiB."""
    if shared is not None:
        yield shared
        return
    with _seaweed(root) as server:
        yield server


@contextmanager
def _seaweed(root: Path) -> Iterator[SeaweedS3]:
    server = SeaweedS3(root).start()
    saved = dict(os.environ)
    os.environ.update(server.env())  # the SDK's store reads its endpoint and keys here
    try:
        server.create_bucket(BUCKET)
        yield server
    finally:
        os.environ.clear()
        os.environ.update(saved)
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


class _S3:
    """One event loop with the SDK's store and a raw aioboto3 client on the same endpoint."""

    def __init__(self, server: SeaweedS3) -> None:
        self.loop = asyncio.new_event_loop()
        self.store = open_store(StageSettings.s3(BUCKET).descriptor("bench"))
        self._raw_cm = s3_client(server.endpoint, server.region, DEFAULT_UPLOAD_CONCURRENCY + 8)
        self.raw = self.loop.run_until_complete(self._raw_cm.__aenter__())

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def key_of(self, location: DataLocation) -> str:
        return location.uri.removeprefix(f"s3://{BUCKET}/")

    def delete(self, key: str) -> None:
        self.run(self.raw.delete_object(Bucket=BUCKET, Key=key))

    def close(self) -> None:
        self.run(self._raw_cm.__aexit__(None, None, None))
        self.run(self.store.close())
        self.loop.close()


def _upload_figure(
    server: SeaweedS3, root: Path, size: int, pairs: int | None, warmup: int
) -> Figure:
    source = _write_random(root / "upload.bin", size)
    s3 = _S3(server)
    try:
        digest: list[str] = []
        counter = iter(range(10**6))

        def lake_upload() -> float:
            began = time.perf_counter()
            location = s3.run(
                s3.store.upload(FileUpload.from_path(source, "application/octet-stream"))
            )
            elapsed = time.perf_counter() - began
            digest.append(location.sha256)
            s3.delete(s3.key_of(location))  # 2 GiB objects: keep the disk free (untimed)
            return size / MIB / elapsed

        def raw_upload() -> float:
            key = f"raw/{next(counter)}"
            began = time.perf_counter()
            digest.append(s3.run(_raw_multipart(s3.raw, key, source)))
            elapsed = time.perf_counter() - began
            s3.delete(key)
            return size / MIB / elapsed

        uploaded = measure(
            f"s3_upload_{size // MIB}mib",
            lake_upload,
            raw_upload,
            pairs=pairs,
            warmup=warmup,
            **_higher(0.95, ">= 0.95 of raw multipart + SHA-256, same body"),
        )
        assert len(set(digest)) == 1, "both sides hashed the same bytes"
        return uploaded
    finally:
        s3.close()
        source.unlink()


def _read_figures(
    server: SeaweedS3,
    root: Path,
    range_size: int,
    full_size: int,
    pairs: int | None,
    warmup: int,
) -> list[Figure]:
    source = _write_random(root / "read.bin", max(full_size, 3 * MIB + 17 + range_size))
    s3 = _S3(server)
    try:
        location = s3.run(s3.store.upload(FileUpload.from_path(source, "application/octet-stream")))
        key = s3.key_of(location)
        start = 3 * MIB + 17
        end = start + range_size

        async def drain(chunks: Any) -> int:
            return sum([len(chunk) async for chunk in chunks])

        def lake_range() -> None:
            reader = s3.run(s3.store.open_range(location, start, end))
            assert s3.run(drain(reader)) == range_size

        async def raw_get(byte_range: str | None, hasher: Any) -> int:
            extra = {"Range": byte_range} if byte_range else {}
            reply = await s3.raw.get_object(Bucket=BUCKET, Key=key, **extra)
            body = reply["Body"]
            total = 0
            # The same reads as the SDK's: CHUNK_SIZE at a time, hashed on a thread.
            while chunk := await body.read(CHUNK_SIZE):
                total += len(chunk)
                if hasher is not None:
                    await asyncio.to_thread(hasher.update, chunk)
            return total

        def raw_range() -> None:
            assert s3.run(raw_get(f"bytes={start}-{end - 1}", None)) == range_size

        full = location.size_bytes

        def lake_open() -> None:
            async def go() -> None:
                reader = await s3.store.open(location)
                assert await drain(reader) == full
                assert reader.verified

            s3.run(go())

        def raw_open() -> None:
            hasher = hashlib.sha256()
            assert s3.run(raw_get(None, hasher)) == full
            assert hasher.hexdigest() == location.sha256

        return [
            measure(
                f"s3_range_{range_size // MIB}mib",
                _throughput(range_size, lake_range),
                _throughput(range_size, raw_range),
                pairs=pairs,
                warmup=warmup,
                **_higher(0.95, ">= 0.95 of a raw ranged GET read the same way"),
            ),
            measure(
                f"s3_open_{full // MIB}mib",
                _throughput(full, lake_open),
                _throughput(full, raw_open),
                pairs=pairs,
                warmup=warmup,
                **_higher(0.95, ">= 0.95 of a raw GET + SHA-256 read the same way"),
            ),
        ]
    finally:
        s3.close()
        source.unlink()


def _rss_figures(
    server: SeaweedS3, root: Path, small: int, large: int, pairs: int | None
) -> list[Figure]:
    """Peak RSS growth of uploads in fresh processes; the same runs give both figures."""
    small_path = _write_random(root / "small.bin", small)
    large_path = _write_random(root / "large.bin", large)
    try:
        samples = alternate(
            {
                "large": lambda: _rss_growth(server, large_path),
                "small": lambda: _rss_growth(server, small_path),
            },
            pairs=pairs,
            warmup=0,  # every sample is a fresh process
        )
    finally:
        small_path.unlink()
        large_path.unlink()
    bound = DEFAULT_PART_SIZE / MIB * (DEFAULT_UPLOAD_CONCURRENCY + 2) + 100
    return [
        figure(
            "s3_upload_peak_rss",
            samples["large"],
            [bound] * len(samples["large"]),
            unit="MiB",
            goal=at_most(1.0, "<= 1 of the bound part size x (concurrency + 2) + 100 MiB"),
            load_1m=samples.load_1m,
            reference_kind="bound",
        ),
        figure(
            f"s3_upload_rss_{large // MIB}mib_vs_{small // MIB}mib",
            samples["large"],
            samples["small"],
            unit="MiB",
            goal=at_most(32.0, "at most +32 MiB (memory independent of size)", scale="difference"),
            load_1m=samples.load_1m,
        ),
    ]


def _open_figure(root: Path, size: int, pairs: int | None, warmup: int) -> Figure:
    store = open_store(StageSettings.local(root / "objects").descriptor("bench"))
    source = _write_random(root / "open.bin", size)
    loop = asyncio.new_event_loop()
    try:
        location = loop.run_until_complete(
            store.upload(FileUpload.from_path(source, "application/octet-stream"))
        )
        source.unlink()
        path = Path(location.uri.removeprefix("file://"))

        def lake_open() -> None:
            async def drain() -> None:
                reader = await store.open(location)
                async for _ in reader:
                    pass
                assert reader.verified

            loop.run_until_complete(drain())

        def reference() -> None:
            digest = hashlib.sha256()
            with path.open("rb") as file:
                while chunk := file.read(LOCAL_CHUNK_SIZE):
                    digest.update(chunk)
            assert digest.hexdigest() == location.sha256

        return measure(
            "verified_open_local_1gib"
            if size == 1024 * MIB
            else f"verified_open_local_{size // MIB}mib",
            _throughput(size, lake_open),
            _throughput(size, reference),
            pairs=pairs,
            warmup=warmup,
            **_higher(0.9, ">= 0.9 of hashlib SHA-256 over the same file"),
        )
    finally:
        loop.close()
