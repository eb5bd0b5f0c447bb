"""LeRobot export: 100 episodes out of Lake as a v3.0 dataset, against copying the same files.

- ``lerobot_export``: ``export_lerobot`` of all 100 episodes of an imported
  dataset (frames queried and rewritten, tasks, episodes metadata, stats, and
  every MP4 streamed from the local stage with its size and SHA-256 verified)
  against ``shutil.copytree`` of the source dataset directory (the same
  files, no checks, no rewriting). The figure is the ratio of times; goal:
  export at least half as fast as the copy (time ratio <= 2.0).

Full size: 100 episodes of 30 frames, 10 per MP4, two 96x96 noise cameras.
Quick mode: 20 episodes of 10 frames, 32x32 (a smoke run).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import lake_sdk
from lake_sdk.lerobot import export_lerobot, import_lerobot
from tools.bench.harness import Figure, at_most, machine, measure, pairs_for, timed, warmup_for
from tools.lake_testing.lerobot import DatasetSpec, write_dataset
from tools.lake_testing.plugin import write_ticket_keys
from tools.lake_testing.servers import start_meta, start_query


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
                    runs = {"lake": 0, "reference": 0}

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

                    figure = measure(
                        "lerobot_export",
                        export,
                        copy,
                        unit="s",
                        goal=at_most(2.0, "export >= 0.5x the speed of copying the same files"),
                        pairs=pairs_for(quick),
                        warmup=warmup_for(quick),
                    )
            finally:
                query.stop()
        finally:
            meta.stop()
    return [figure]


if __name__ == "__main__":
    print(machine())
    for result in run(quick=False):
        print(result.json())
