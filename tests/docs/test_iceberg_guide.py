"""docs/iceberg.md runs as written: a local SeaweedFS catalog, a pyiceberg table, the Lake query."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.lake_testing.iceberg import SeaweedIceberg, federation_env
from tools.lake_testing.servers import start_meta, start_query

pytestmark = [pytest.mark.iceberg, pytest.mark.s3]

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "iceberg.md"
PRINTED = "[{'episode_id': 1, 'reward': 0.5}, {'episode_id': 3, 'reward': 0.75}]"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SeaweedIceberg]:
    # Its own server: the guide creates analytics.episodes, as other tests do.
    weed = SeaweedIceberg(tmp_path / "weed").start()
    try:
        yield weed
    finally:
        weed.stop()


def test_the_guide_runs(
    server: SeaweedIceberg, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.docs.test_examples import python_blocks

    write, query = python_blocks(GUIDE)
    names = {
        "CATALOG_URL": server.iceberg_endpoint,
        "S3_URL": server.endpoint,
        "ACCESS_KEY": server.access_key,
        "SECRET_KEY": server.secret_key,
    }
    assert server.warehouse == "s3://lakewh/"  # the guide's -tableBucket=lakewh
    exec(compile(write, "docs/iceberg.md", "exec"), dict(names))
    guide = GUIDE.read_text()
    env = federation_env(server, "analytics")
    for variable in env:  # the guide's command line sets what the test sets
        assert variable in guide, variable
    meta = start_meta(tmp_path / "data", tmp_path)
    try:
        lake = start_query(meta.addr, tmp_path, env=env)
        try:
            code = query.replace("grpc://127.0.0.1:50051", lake.url)
            exec(compile(code, "docs/iceberg.md", "exec"), {})
        finally:
            lake.stop()
    finally:
        meta.stop()
    printed = capsys.readouterr().out
    assert PRINTED in printed
    assert PRINTED in guide
