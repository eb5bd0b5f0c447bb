"""``lake demo``: a whole local Lake on loopback, end to end.

Starts Metasrv and one Query replica as separate processes over a local data
directory, creates a table with a FILE column through the administrative
client, inserts rows with generated media files as three committed versions
(the files go straight to the managed stage, only their DataLocations into the
table), runs SQL through the SDK (including a query pinned to an older
version's rows by snapshot-stable tickets), reads one file back verified and
stops both processes.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
import pyarrow as pa

from lake_core.cli import data_dir_option
from lake_core.install import package_hint
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.schemas import parse_column_spec
from lake_objects.source import FileUpload
from lake_sdk._client import AsyncClient
from lake_sdk._locations import data_location
from lake_sdk._progress import UploadProgressBar

TABLE = TableRef("robots", "episodes")
COLUMNS = (
    "episode_id:utf8",
    "robot_id:utf8",
    "reward:float64",
    "steps:int64",
    "recorded_at:timestamp",
    "video:file",
)
INSERT = (
    "INSERT INTO robots.episodes (episode_id, robot_id, reward, steps, recorded_at, video) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
MEDIA_BYTES = 256 * 1024


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports: nothing listens on them yet, so the kernel may repeat one."""
    ports: list[int] = []
    while len(ports) < count:
        port = _free_port()
        if port not in ports:
            ports.append(port)
    return ports


def _spawn(module: str, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    if importlib.util.find_spec(module) is None:
        raise click.ClickException(
            f"lake demo runs Metasrv and Query on this machine and needs {module.replace('_', '-')}: "
            + package_hint(["lake-metasrv", "lake-query"])
        )
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_ready(proc: subprocess.Popen[bytes], log: Path) -> None:
    """Block until the process logs that it is listening (or fails)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise click.ClickException(f"process exited early; its log:\n{log.read_text()[-3000:]}")
        if b"listening" in log.read_bytes():
            return
        time.sleep(0.1)
    raise click.ClickException(f"not ready after 60 s; its log:\n{log.read_text()[-3000:]}")


def _episodes(start: int, count: int, media: Path) -> list[list[object]]:
    """Rows to insert, each with a freshly generated (fake) camera video."""
    base = datetime(2026, 11, 1, tzinfo=UTC)
    rows: list[list[object]] = []
    for i in range(start, start + count):
        video = media / f"ep-{i:04d}.mp4"
        video.write_bytes(b"\x00\x00\x00\x18ftypmp42" + os.urandom(MEDIA_BYTES))
        rows.append(
            [
                f"ep-{i:04d}",
                f"robot-{i % 3}",
                round(0.5 + (i % 7) * 0.25, 2),
                100 + i * 10,
                base + timedelta(minutes=i),
                FileUpload.from_path(video, "video/mp4"),
            ]
        )
    return rows


async def _run(data_dir: Path) -> None:
    say = click.echo
    meta_port, query_port = _free_ports(2)
    meta_addr = f"127.0.0.1:{meta_port}"
    query_addr = f"127.0.0.1:{query_port}"
    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        meta_log = logs / "meta.log"
        meta = _spawn("lake_metasrv", ["--addr", meta_addr, "--data-dir", str(data_dir)], meta_log)
        procs.append(meta)
        await asyncio.to_thread(_wait_ready, meta, meta_log)
        say(f"started Metasrv on {meta_addr} (pid {meta.pid}), data in {data_dir}")
        query_log = logs / "query.log"
        query = _spawn(
            "lake_query",
            [
                "--addr",
                query_addr,
                "--metadata-addr",
                f"http://{meta_addr}",
                "--data-dir",
                str(data_dir),
            ],
            query_log,
        )
        procs.append(query)
        await asyncio.to_thread(_wait_ready, query, query_log)
        say(f"started Query on {query_addr} (pid {query.pid})")

        schema = pa.schema([parse_column_spec(c) for c in COLUMNS])
        async with MetaClient(f"http://{meta_addr}") as admin:
            created = await admin.create_table(TABLE, schema)
        say(f"created table lake.{TABLE} at version {created.entry.descriptor.version}")
        recordings = importlib.util.find_spec("mcap") is not None
        datasets = all(importlib.util.find_spec(m) is not None for m in ("av", "numpy"))

        media = data_dir / "media"
        media.mkdir(exist_ok=True)
        async with AsyncClient(f"grpc://{query_addr}") as client:
            for start in (0, 4, 8):
                with UploadProgressBar() as bar:
                    version = await client.insert_many(
                        INSERT, _episodes(start, 4, media), progress=bar
                    )
                say(f"inserted 4 episodes with videos -> committed version {version}")

            sql = (
                "SELECT robot_id, count(*) AS episodes, round(avg(reward), 3) AS mean_reward, "
                "sum(steps) AS steps FROM robots.episodes GROUP BY robot_id ORDER BY robot_id"
            )
            say(f"\nSQL> {sql}")
            say(_format(await client.query_table(sql)))

            listing = await client.query_table(
                "SELECT episode_id, video FROM robots.episodes ORDER BY episode_id LIMIT 2"
            )
            say("\nSQL> SELECT episode_id, video FROM robots.episodes ORDER BY episode_id LIMIT 2")
            for row in range(listing.num_rows):
                location = data_location(listing, "video", row)
                say(f"  {listing['episode_id'][row]}: {location.uri} ({location.size_bytes} bytes)")
            location = data_location(listing, "video", 0)
            reader = await client.open(location)
            size = len(await reader.read())
            say(f"read {size} bytes of {listing['episode_id'][0]}'s video back: sha256 verified")

            pinned = await client.query("SELECT count(*) AS n FROM robots.episodes")
            await client.insert_many(INSERT, _episodes(12, 4, media))
            say("\nplanned a count, then appended 4 more episodes before fetching it:")
            say(
                f"  pinned result: {(await pinned.to_table()).column('n')[0].as_py()} rows "
                "(the version seen at planning)"
            )
            latest = await client.query_table("SELECT count(*) AS n FROM robots.episodes")
            say(f"  a new query:   {latest.column('n')[0].as_py()} rows")

            try:
                await client.query_table("DELETE FROM robots.episodes")
            except Exception as exc:
                say(f"\nSQL> DELETE FROM robots.episodes\n  refused: {exc}")

            if recordings:  # lake-sdk[mcap]: an MCAP recording as a FILE value
                from lake_sdk.demo_recordings import show_recording

                async with MetaClient(f"http://{meta_addr}") as admin:
                    await show_recording(client, admin, media, say)
            if datasets:  # lake-sdk[lerobot]: a LeRobot v3.0 dataset in and out
                from lake_sdk.demo_recordings import show_dataset

                await show_dataset(client, meta_addr, media, say)
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(timeout=35)
            except subprocess.TimeoutExpired:
                proc.kill()
        if procs:
            say("\nstopped Query and Metasrv")


def _format(table: pa.Table) -> str:
    """A plain aligned text rendering of a small result."""
    rows = [[str(v) for v in row.values()] for row in table.to_pylist()]
    header = table.column_names
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _made_dir(value: str) -> Path:
    """``--data-dir``, created if missing; refused on one line if it cannot be.

    An empty value would resolve to the current directory and spread a whole
    Lake data directory over it, so it is refused rather than taken as ".".
    """
    if not value:
        raise click.BadParameter("must name a directory", param_hint="'--data-dir'")
    path = Path(value)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.BadParameter(
            f"cannot create {value!r}: {exc.strerror or exc}", param_hint="'--data-dir'"
        ) from None
    return path.resolve()


@click.command()
@data_dir_option(
    None,
    "Keep the demo's data here; without it, in a temporary directory",
    type=click.Path(file_okay=False),
    metavar="PATH",
)
def demo(data_dir: str | None) -> None:
    """Run a local Lake on loopback: create, append, commit, query."""
    # SIGTERM unwinds like Ctrl-C, so the servers the demo started are stopped too.
    signal.signal(signal.SIGTERM, _interrupt)
    if data_dir is not None:
        asyncio.run(_run(_made_dir(data_dir)))
        return
    with tempfile.TemporaryDirectory(prefix="lake-demo-") as tmp:
        asyncio.run(_run(Path(tmp)))
