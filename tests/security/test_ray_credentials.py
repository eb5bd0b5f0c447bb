"""Ray reads of a secured Lake: the token reaches the workers and nothing else.

The read tasks carry alice's bearer token and the CA bundle to Ray's worker
processes (TLS, principal maps). The token must not appear in the
datasource's or the dataset's ``repr``, in a task name, or anywhere in Ray's
session logs; another tenant's table is refused in the caller.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from lake_core.errors import PermissionDenied
from tests.security.cluster import ROWS, RUNS, SECRETS, SecureCluster, runs
from tools.lake_testing.ray_local import local_ray

pytest.importorskip("ray")
from lake_sdk.ray import LakeDatasource, read_lake


@pytest.fixture(scope="module")
def ray_dir() -> Iterator[Path]:
    with local_ray(num_cpus=2, worker_niceness=0) as temp:
        yield temp


def _text_under(root: Path) -> str:
    parts = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                parts.append(path.read_bytes().decode(errors="replace"))
            except OSError:
                continue
    return "\n".join(parts)


def test_workers_read_with_the_token_and_it_shows_nowhere(
    secure: SecureCluster, ray_dir: Path
) -> None:
    url = secure.query.url.replace("grpc+tls://", "https://")
    token = secure.tokens["alice"]
    sql = f"SELECT * FROM {RUNS}"
    source = LakeDatasource(sql, url=url, token=token, ca_pem=secure.ca.cert_pem)
    assert token not in repr(source)
    assert all(token not in repr(task) for task in source.get_read_tasks(2))
    dataset = read_lake(sql, url=url, token=token, ca_pem=secure.ca.cert_pem)
    assert token not in repr(dataset)
    got = pa.concat_tables(dataset.iter_batches(batch_format="pyarrow", batch_size=65536))
    assert got.num_rows == ROWS
    assert got.sort_by("run_id").equals(pa.Table.from_batches([runs(0, ROWS)]))
    logs = _text_under(ray_dir)
    assert "ReadLake" in logs, "Ray's logs do not name the read task: nothing was checked"
    assert token not in logs


def test_another_tenants_table_is_refused_in_the_caller(
    secure: SecureCluster, ray_dir: Path
) -> None:
    url = secure.query.url.replace("grpc+tls://", "https://")
    with pytest.raises(PermissionDenied):
        read_lake(
            f"SELECT * FROM {SECRETS}",
            url=url,
            token=secure.tokens["alice"],
            ca_pem=secure.ca.cert_pem,
        )
