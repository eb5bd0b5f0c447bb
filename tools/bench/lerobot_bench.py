"""LeRobot export: 100 episodes out of Lake as a v3.0 dataset, against copying the same files.

- ``lerobot_export``: ``export_lerobot`` of all 100 episodes of an imported
  dataset (frames queried and rewritten, tasks, episodes metadata, stats, and
  every MP4 streamed from the local stage with its size and SHA-256 verified)
  against ``shutil.copytree`` of the source dataset directory (the same
  files, no checks, no rewriting). The figure is the ratio of times; goal:
  export at least half as fast as the copy (time ratio <= 2.0).
- ``lerobot_export_floor`` (report): the least any verified export of the
  same selection costs, against the same copy in the same rounds: one Query
  round trip (``SELECT 1``: an export learns which files the SELECT picked
  before it can copy one), then every MP4 of the dataset read, SHA-256
  hashed and written by two threads (one per core; ``hashlib`` and the file
  calls release the GIL) in plain Python, with no Lake code. Lake's export
  also queries the episodes, frames and tasks and writes the data files and
  metadata; this floor does none of that.

Full size: 100 episodes of 30 frames, 10 per MP4, two 96x96 noise cameras.
Quick mode: 20 episodes of 10 frames, 32x32 (a smoke run).
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import lake_sdk
from lake_sdk.lerobot import export_lerobot, import_lerobot
from tools.bench.harness import (
    Figure,
    alternate,
    at_most,
    figure,
    machine,
    pairs_for,
    timed,
    warmup_for,
)
from tools.lake_testing.lerobot import DatasetSpec, write_dataset
from tools.lake_testing.plugin import write_ticket_keys
from tools.lake_testing.servers import start_meta, start_query

#: The floor's copy threads: one per core of the 2-core machine the goals are set on.
FLOOR_THREADS = 2
_PIECE = 1024 * 1024


def verified_copy(source: Path, target: Path) -> str:
    """``source`` read, SHA-256 hashed and written to ``target`` in 1 MiB pieces; its digest."""
    hasher = hashlib.sha256()
    buffer = bytearray(_PIECE)
    view = memoryview(buffer)
    with source.open("rb", buffering=0) as src, target.open("wb", buffering=0) as out:
        while got := src.readinto(buffer):
            hasher.update(view[:got])
            out.write(view[:got])
    return hasher.hexdigest()


def copy_verified(files: list[Path], root: Path, out: Path) -> None:
    """Every file of ``files`` (under ``root``) to the same place under ``out``, hashed."""
    for path in files:
        (out / path.relative_to(root)).parent.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(FLOOR_THREADS) as pool:
        list(pool.map(lambda p: verified_copy(p, out / p.relative_to(root)), files))


def run(quick: bool) -> list[Figure]:
    spec = (
        DatasetSpec(lengths=(10,) * 20, size=32, episodes_per_file=5, noise=True)
        if quick
        else DatasetSpec(lengths=(30,) * 100, size=96, episodes_per_file=10, noise=True)
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        source = write_dataset(root / "source", spec)
        env = {
            "LAKE_QUERY_TICKET_KEYS_FILE": str(write_ticket_keys(root / "ticket-keys.json")),
            "LAKE_MANAGED_OBJECT_ROOT": str(root / "data" / "objects"),
        }
        meta = start_meta(root / "data", root, env=env)
        try:
            query = start_query(meta.addr, root, env=env)
            try:
                with lake_sdk.Client(query.url, progress=False) as client:
                    import_lerobot(
                        client, source, namespace="bench", name="arm", meta_addr=meta.addr
                    )
                    runs = {"lake": 0, "reference": 0, "floor": 0}
                    videos = sorted(p for p in (source / "videos").rglob("*") if p.is_file())

                    def export() -> float:
                        out = root / f"export-{runs['lake']}"
                        runs["lake"] += 1
                        took = timed(
                            lambda: export_lerobot(
                                client, "SELECT episode_index FROM bench.arm_episodes", out
                            )
                        )
                        shutil.rmtree(out)
                        return took

                    def copy() -> float:
                        out = root / f"copy-{runs['reference']}"
                        runs["reference"] += 1
                        took = timed(lambda: shutil.copytree(source, out))
                        shutil.rmtree(out)
                        return took

                    def floor() -> float:
                        out = root / f"floor-{runs['floor']}"
                        runs["floor"] += 1

                        def work() -> None:
                            client.query_table("SELECT 1")
                            copy_verified(videos, source, out)

                        took = timed(work)
                        shutil.rmtree(out)
                        return took

                    samples = alternate(
                        {"lake": export, "reference": copy, "floor": floor},
                        pairs=pairs_for(quick),
                        warmup=warmup_for(quick),
                    )
            finally:
                query.stop()
        finally:
            meta.stop()
    exported = figure(
        "lerobot_export",
        samples["lake"],
        samples["reference"],
        unit="s",
        goal=at_most(2.0, "export >= 0.5x the speed of copying the same files"),
        load_1m=samples.load_1m,
    )
    least = figure(
        "lerobot_export_floor",
        samples["floor"],
        samples["reference"],
        unit="s",
        goal=None,
        load_1m=samples.load_1m,
        report_only="report: one Query round trip, then the MP4s SHA-256 verified on 2 threads",
    )
    return [exported, least]


if __name__ == "__main__":
    print(machine())
    for result in run(quick=False):
        print(result.json())
