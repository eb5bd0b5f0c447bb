"""Managed-object benchmarks: SDK uploads and reads against raw references, one run.

- ``s3_upload_1gib``: the SDK's upload of a 1 GiB file to SeaweedFS (64 MiB
  parts, 4 in flight, streaming SHA-256 included) against raw aioboto3
  multipart with the same part size and concurrency to the same endpoint.
  Throughput ratio, goal >= 0.8.
- ``s3_upload_peak_rss``: peak RSS growth of that upload in a fresh process,
  against the bound part size x (concurrency + 2) + 100 MiB. Goal <= 1.
- ``s3_upload_rss_flat``: peak RSS growth uploading 2 GiB against 256 MiB.
  Goal: they differ by less than 32 MiB.
- ``verified_open_local_1gib``: draining ``open`` of a local 1 GiB object
  (size and SHA-256 proved at EOF) against hashlib SHA-256 over the same file
  in 1 MiB chunks. Throughput ratio, goal >= 0.8.
- ``s3_range_64mib``: a 64 MiB ``open_range`` from SeaweedFS through the SDK
  against one raw aioboto3 ranged GET. Throughput ratio, goal >= 0.9.

Quick mode uses small sizes and one run (a smoke test, not a measurement).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lake_objects import FileUpload, StageSettings, open_store
from lake_objects.s3 import DEFAULT_PART_SIZE, DEFAULT_UPLOAD_CONCURRENCY, s3_client
from tools.bench.harness import Figure, measure, timed
from tools.lake_testing.seaweed import SeaweedS3

MIB = 1024 * 1024
BUCKET = "bench"


def _write_random(path: Path, size: int) -> Path:
    rng = np.random.default_rng(7)
    with path.open("wb") as out:
        left = size
        while left:
            step = min(left, 16 * MIB)
            out.write(rng.integers(0, 256, step, dtype=np.uint8).tobytes())
            left -= step
    return path


def _throughput(size: int, fn: Callable[[], object]) -> Callable[[], float]:
    return lambda: size / MIB / timed(fn)


def _ratio_higher(goal: float) -> dict[str, Any]:
    return {
        "unit": "MiB/s",
        "goal": f">= {goal}",
        "ratio_of": lambda lake, ref: lake / ref,
        "met": lambda lake, ref, ratio: ratio >= goal,
        "threshold": lambda lake, ref: goal,
    }


async def _raw_multipart(client: Any, key: str, path: Path) -> None:
    """The reference: plain aioboto3 multipart, same part size and concurrency."""
    created = await client.create_multipart_upload(Bucket=BUCKET, Key=key)
    slots = asyncio.Semaphore(DEFAULT_UPLOAD_CONCURRENCY)
    parts: list[dict[str, Any]] = []

    async def send(number: int, data: bytes) -> None:
        try:
            reply = await client.upload_part(
                Bucket=BUCKET, Key=key, UploadId=created["UploadId"], PartNumber=number, Body=data
            )
            parts.append({"PartNumber": number, "ETag": reply["ETag"]})
        finally:
            slots.release()

    tasks = []
    with path.open("rb") as source:
        number = 0
        while True:
            await slots.acquire()
            data = await asyncio.to_thread(source.read, DEFAULT_PART_SIZE)
            if not data:
                slots.release()
                break
            number += 1
            tasks.append(asyncio.create_task(send(number, data)))
        await asyncio.gather(*tasks)
    parts.sort(key=lambda p: p["PartNumber"])
    await client.complete_multipart_upload(
        Bucket=BUCKET, Key=key, UploadId=created["UploadId"], MultipartUpload={"Parts": parts}
    )


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
    upload_size = 192 * MIB if quick else 1024 * MIB
    open_size = 128 * MIB if quick else 1024 * MIB
    range_size = 16 * MIB if quick else 64 * MIB
    small, large = (256 * MIB, 512 * MIB) if quick else (256 * MIB, 2048 * MIB)
    runs = 1 if quick else 3
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="lake-objects-bench-") as tmp:
        root = Path(tmp)
        server = SeaweedS3(root / "seaweed").start()
        saved = dict(os.environ)
        os.environ.update(server.env())
        try:
            server.create_bucket(BUCKET)
            figures += _s3_figures(server, root, upload_size, range_size, small, large, runs)
            figures.append(_open_figure(root, open_size, runs))
        finally:
            os.environ.clear()
            os.environ.update(saved)
            server.stop()
    return figures


def _s3_figures(
    server: SeaweedS3, root: Path, size: int, range_size: int, small: int, large: int, runs: int
) -> list[Figure]:
    source = _write_random(root / "upload.bin", size)
    loop = asyncio.new_event_loop()
    store = open_store(StageSettings.s3(BUCKET).descriptor("bench"))
    client_cm = s3_client(server.endpoint, server.region, DEFAULT_UPLOAD_CONCURRENCY + 8)
    raw = loop.run_until_complete(client_cm.__aenter__())
    figures: list[Figure] = []
    try:
        keys: list[str] = []

        def lake_upload() -> None:
            location = loop.run_until_complete(
                store.upload(FileUpload.from_path(source, "application/octet-stream"))
            )
            keys.append(location.uri.removeprefix(f"s3://{BUCKET}/"))

        counter = iter(range(10**6))

        def raw_upload() -> None:
            key = f"raw/{next(counter)}"
            loop.run_until_complete(_raw_multipart(raw, key, source))
            keys.append(key)

        figures.append(
            measure(
                "s3_upload_1gib" if size == 1024 * MIB else f"s3_upload_{size // MIB}mib",
                _throughput(size, lake_upload),
                _throughput(size, raw_upload),
                runs=runs,
                **_ratio_higher(0.8),
            )
        )
        # Ranged reads of an uploaded object.
        location = loop.run_until_complete(
            store.upload(FileUpload.from_path(source, "application/octet-stream"))
        )
        key = location.uri.removeprefix(f"s3://{BUCKET}/")
        start = 3 * MIB + 17
        end = start + range_size

        def lake_range() -> None:
            reader = loop.run_until_complete(store.open_range(location, start, end))

            async def drain() -> int:
                return sum([len(chunk) async for chunk in reader])

            assert loop.run_until_complete(drain()) == range_size

        def raw_range() -> None:
            async def get() -> int:
                reply = await raw.get_object(
                    Bucket=BUCKET, Key=key, Range=f"bytes={start}-{end - 1}"
                )
                return len(await reply["Body"].read())

            assert loop.run_until_complete(get()) == range_size

        figures.append(
            measure(
                f"s3_range_{range_size // MIB}mib",
                _throughput(range_size, lake_range),
                _throughput(range_size, raw_range),
                runs=max(runs, 5),
                **_ratio_higher(0.9),
            )
        )
        for key_name in keys:
            loop.run_until_complete(raw.delete_object(Bucket=BUCKET, Key=key_name))
    finally:
        loop.run_until_complete(client_cm.__aexit__(None, None, None))
        loop.run_until_complete(store.close())
        loop.close()
    # Memory, each upload in a fresh process.
    bound = DEFAULT_PART_SIZE / MIB * (DEFAULT_UPLOAD_CONCURRENCY + 2) + 100
    growth = _rss_growth(server, source)
    figures.append(
        measure(
            "s3_upload_peak_rss",
            lambda: growth,
            lambda: bound,
            unit="MiB",
            goal="<= 1 (part size x (concurrency + 2) + 100 MiB)",
            ratio_of=lambda lake, ref: lake / ref,
            met=lambda lake, ref, ratio: ratio <= 1.0,
            threshold=lambda lake, ref: 1.0,
            runs=1,
            warmup=0,
        )
    )
    source.unlink()
    small_path = _write_random(root / "small.bin", small)
    small_growth = _rss_growth(server, small_path)
    small_path.unlink()
    large_path = _write_random(root / "large.bin", large)
    large_growth = _rss_growth(server, large_path)
    large_path.unlink()
    figures.append(
        measure(
            f"s3_upload_rss_{large // MIB}mib_vs_{small // MIB}mib",
            lambda: large_growth,
            lambda: small_growth,
            unit="MiB",
            goal="difference < 32 MiB (memory independent of object size)",
            ratio_of=lambda lake, ref: lake / ref,
            met=lambda lake, ref, ratio: abs(lake - ref) < 32,
            runs=1,
            warmup=0,
        )
    )
    return figures


def _open_figure(root: Path, size: int, runs: int) -> Figure:
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
                while chunk := file.read(MIB):
                    digest.update(chunk)
            assert digest.hexdigest() == location.sha256

        return measure(
            "verified_open_local_1gib"
            if size == 1024 * MIB
            else f"verified_open_local_{size // MIB}mib",
            _throughput(size, lake_open),
            _throughput(size, reference),
            runs=max(runs, 5),
            **_ratio_higher(0.8),
        )
    finally:
        loop.close()
