"""What ``LAKE_QUERY_VERIFY_ON_OPEN`` costs a replica's first query of a table version.

In process, over a local Lance dataset of several fragments: Lake's side is a
fresh :class:`~lake_query.planning.verify.DataFileVerifier` checking the version (one
read and SHA-256 of every data file) followed by a point query; the
reference is the same point query on a freshly opened dataset, unverified.
The second figure is the check once the version is verified (a set lookup).

- ``verify_on_open_first_query_ms``: goal: within the time to read and hash
  the data files at 200 MB/s on top of the query.
- ``verify_on_open_repeat_check_ms``: the check once the version is verified,
  against the point query itself. Goal: <= 3%.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

from lake_core.integrity import DataFileDigest, digest_file, fragment_file_paths
from lake_core.models import TableDescriptor
from lake_core.names import TableRef
from lake_query.planning.verify import DataFileVerifier
from tools.bench.harness import (
    Figure,
    at_most,
    machine,
    measure,
    pairs_for,
    timed,
    warmup_for,
)

TABLE = TableRef("bench", "verify")


def _dataset(root: Path, megabytes: int) -> tuple[str, dict[str, DataFileDigest]]:
    uri = str(root / "verify.lance")
    rows = megabytes * 1024 * 1024 // 16 // 8
    fragments = 8
    for i in range(fragments):
        ids = np.arange(i * rows, (i + 1) * rows, dtype=np.int64)
        batch = pa.table({"id": ids, "x": np.random.default_rng(i).random(rows)})
        lance.write_dataset(batch, uri, mode="append" if i else "create")
    data = Path(uri) / "data"
    digests = {}
    for path in fragment_file_paths(lance.dataset(uri).get_fragments()):
        size, sha = digest_file(data / path)
        digests[path] = DataFileDigest(path=path, size_bytes=size, sha256=sha)
    return uri, digests


def run(quick: bool) -> list[Figure]:
    megabytes = 8 if quick else 128
    with tempfile.TemporaryDirectory() as tmp:
        uri, digests = _dataset(Path(tmp), megabytes)
        version = lance.dataset(uri).version
        descriptor = TableDescriptor(
            location=uri, incarnation="bench", version=1, engine_version=version
        )

        def query(dataset: object) -> None:
            dataset.to_table(filter="id = 12345")  # type: ignore[attr-defined]

        def first_verified() -> float:
            verifier = DataFileVerifier(lambda table, paths: digests)
            dataset = lance.dataset(uri, version=version)
            return 1000 * timed(
                lambda: (verifier.check(dataset, TABLE, descriptor), query(dataset))
            )

        def unverified() -> float:
            dataset = lance.dataset(uri, version=version)
            return 1000 * timed(lambda: query(dataset))

        warm = DataFileVerifier(lambda table, paths: digests)
        warm.check(lance.dataset(uri, version=version), TABLE, descriptor)

        def repeat_check() -> float:
            dataset = lance.dataset(uri, version=version)
            return 1000 * timed(lambda: warm.check(dataset, TABLE, descriptor))

        budget_ms = megabytes / 200 * 1000
        first = measure(
            "verify_on_open_first_query_ms",
            first_verified,
            unverified,
            unit="ms",
            goal=at_most(
                budget_ms,
                f"<= query + {budget_ms:.0f} ms (read and hash {megabytes} MB at 200 MB/s)",
                scale="difference",
            ),
            pairs=pairs_for(quick),
            warmup=warmup_for(quick),
        )
        repeat = measure(
            "verify_on_open_repeat_check_ms",
            repeat_check,
            unverified,
            unit="ms",
            goal=at_most(0.03, "the check of a verified version <= 3% of the point query"),
            pairs=pairs_for(quick),
            warmup=warmup_for(quick),
        )
    return [first, repeat]


if __name__ == "__main__":
    print(machine())
    for figure in run(quick=False):
        print(figure.json())
