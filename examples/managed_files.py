"""Upload two files as FILE values, find them with SQL, and stream each back verified.

    python examples/managed_files.py --query grpc://127.0.0.1:50051 --meta 127.0.0.1:50052

Needs a running Lake whose Query knows the managed stage (``lake query
--data-dir DIR`` for Metasrv's local stage, or ``LAKE_S3_BUCKET`` for S3).
The table ``robots.clips (clip_id utf8, video file)`` is created if missing,
so the script runs again as it is (each run adds one version).
The bytes go straight between this process and the stage; the table holds
only each file's DataLocation.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import uuid
from pathlib import Path

import pyarrow as pa

import lake_sdk
from lake_core.filetype import file_field
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_sdk import FileUpload, TableExists

CLIPS = TableRef("robots", "clips")


async def main(query_url: str, meta_addr: str) -> None:
    schema = pa.schema([pa.field("clip_id", pa.utf8()), file_field("video")])
    async with MetaClient(meta_addr if "://" in meta_addr else f"http://{meta_addr}") as admin:
        with contextlib.suppress(TableExists):
            await admin.create_table(CLIPS, schema)
    run = uuid.uuid4().hex[:8]  # tells this run's clips from earlier runs'
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for name, size in (("front.mp4", 3 * 1024 * 1024), ("wrist.mp4", 700_000)):
            path = Path(tmp) / name
            path.write_bytes(os.urandom(size))
            files.append(path)
        async with lake_sdk.AsyncClient(query_url) as client:
            # A progress bar per upload on a terminal (progress=False hides it).
            version = await client.insert_many(
                "INSERT INTO robots.clips (clip_id, video) VALUES (?, ?)",
                [[f"{p.stem}-{run}", FileUpload.from_path(p, "video/mp4")] for p in files],
            )
            print(f"inserted 2 clips at version {version}")
            # Only this run's clips: the example may run again on the same table.
            table = await client.query_table(
                f"SELECT clip_id, video FROM robots.clips WHERE clip_id LIKE '%-{run}' "
                "ORDER BY clip_id"
            )
            for row in range(table.num_rows):
                location = lake_sdk.data_location(table, "video", row)
                reader = await client.open(location)
                copied = await reader.copy_to(Path(tmp) / f"copy-{row}.mp4")  # verified at EOF
                print(
                    f"{table['clip_id'][row]}: {location.uri} {copied} bytes, "
                    f"sha256 {location.sha256[:16]}... verified={reader.verified}"
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--query", default="grpc://127.0.0.1:50051")
    parser.add_argument("--meta", default="127.0.0.1:50052")
    args = parser.parse_args()
    asyncio.run(main(args.query, args.meta))
