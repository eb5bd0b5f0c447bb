"""The robot-data part of ``lake demo``: one MCAP recording and one LeRobot dataset.

Each part runs when its extra is installed (``lake-sdk[mcap]``,
``lake-sdk[lerobot]``) and is skipped otherwise. The recording part writes a 5 s MCAP file with a JSON topic, adds it to a recordings table
(summary columns, the file uploaded to the stage), and reads one second of
it back in place, printing what that cost.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_sdk._client import AsyncClient
from lake_sdk._locations import data_location
from lake_sdk.mcap import messages_async
from lake_sdk.recordings import recordings_schema

__all__ = ["RECORDINGS", "show_dataset", "show_recording", "write_demo_recording"]

RECORDINGS = TableRef("robots", "recordings")
T0 = 1_793_491_200_000_000_000
SECOND = 1_000_000_000


def write_demo_recording(path: Path) -> Path:
    from mcap.writer import Writer

    with path.open("wb") as out:
        writer = Writer(out, chunk_size=4096)
        writer.start(profile="", library="lake demo")
        schema = writer.register_schema("demo.Pose", "jsonschema", b'{"type": "object"}')
        channel = writer.register_channel("/pose", "json", schema)
        for i in range(5 * 50):
            pose = {"x": i * 0.01, "y": -i * 0.02, "step": i}
            t = T0 + i * SECOND // 50
            writer.add_message(channel, log_time=t, publish_time=t, data=json.dumps(pose).encode())
        writer.finish()  # type: ignore[no-untyped-call]
    return path


async def show_recording(
    client: AsyncClient, admin: MetaClient, media: Path, say: Callable[[str], None]
) -> None:
    await admin.create_table(RECORDINGS, recordings_schema(["robot_id:utf8"]))
    path = write_demo_recording(media / "run-0001.mcap")
    added = await client.add_recording(RECORDINGS, path, values={"robot_id": "robot-0"})
    say(
        f"\nadded recording {added.name} to lake.{RECORDINGS} (version {added.version}): "
        f"{added.summary.message_count} messages, {added.summary.duration_s:.2f} s"
    )
    table = await client.query_table(f"SELECT recording FROM {RECORDINGS} LIMIT 1")
    location = data_location(table, "recording", 0)
    window = await messages_async(
        client, location, topics=["/pose"], start=T0 + 2 * SECOND, end=T0 + 3 * SECOND
    )
    poses = [m.decoded async for m in window]
    say(
        f"read 1 s of /pose in place: {len(poses)} messages, {window.bytes_fetched} of "
        f"{location.size_bytes} bytes fetched"
    )


async def show_dataset(
    client: AsyncClient, meta_addr: str, media: Path, say: Callable[[str], None]
) -> None:
    """Import a tiny LeRobot v3.0 dataset and export two of its episodes (needs PyAV)."""
    import asyncio

    from lake_sdk.lerobot import export_lerobot_async, import_lerobot_async
    from lake_sdk.lerobot.sample import write_dataset

    source = await asyncio.to_thread(write_dataset, media / "pick_place")
    done = await import_lerobot_async(
        client, source, namespace="robots", name="pick_place", meta_addr=meta_addr
    )
    say(
        f"\nimported LeRobot dataset pick_place: {done.episode_count} episodes, "
        f"{done.frame_count} frames, {done.videos_uploaded} MP4s uploaded"
    )
    exported = await export_lerobot_async(
        client,
        "SELECT episode_index FROM robots.pick_place_episodes WHERE length >= 4",
        media / "long_episodes",
    )
    say(
        f"exported {exported.episode_count} episodes ({exported.frame_count} frames) "
        f"as a LeRobot v3.0 dataset to {exported.root}"
    )
