"""docs/iceberg.md and docs/registrar.md run as written, twice, against one local SeaweedFS.

SeaweedFS (S3 plus its Iceberg REST catalog) is the server both pages tell the
reader to start with ``weed mini``; the module's fixture runs it (on free ports)
and the pages' ``weed mini`` line is checked against it. Everything else, the
pyiceberg table, ``lake meta``/``lake query`` with federation on, the shipper
and the registrar, runs from the pages themselves (tools/lake_testing/docs.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.lake_testing.docs import DocRun
from tools.lake_testing.iceberg import SeaweedIceberg, federation_env

pytestmark = [pytest.mark.iceberg, pytest.mark.s3]

DOCS = Path(__file__).resolve().parents[2] / "docs"
GUIDE = DOCS / "iceberg.md"
PRINTED = "[{'episode_id': 1, 'reward': 0.5}, {'episode_id': 3, 'reward': 0.75}]"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedIceberg]:
    # Its own server: the guide creates analytics.episodes, as other tests do.
    weed = SeaweedIceberg(tmp_path_factory.mktemp("weed")).start()
    try:
        yield weed
    finally:
        weed.stop()


def _page(name: str, server: SeaweedIceberg, workdir: Path) -> DocRun:
    def same_server(words: list[str]) -> None:
        # The page's flags that matter to what follows: its warehouse bucket, loopback only.
        assert words[:2] == ["weed", "mini"], words
        assert f"-tableBucket={server.warehouse_bucket}" in words, words
        assert "-ip.bind=127.0.0.1" in words, words

    return DocRun(
        DOCS / name,
        workdir,
        # What the pages say the reader has: their server's endpoints and key pair.
        env={
            "CATALOG_URL": server.iceberg_endpoint,
            "S3_URL": server.endpoint,
            "ACCESS_KEY": server.access_key,
            "SECRET_KEY": server.secret_key,
        },
        given={"weed": same_server},
    )


def test_the_guide_runs_twice(
    server: SeaweedIceberg,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    assert server.warehouse == "s3://lakewh/"  # the guide's -tableBucket=lakewh
    guide = GUIDE.read_text()
    for variable in federation_env(server, "analytics"):  # the guide sets what tests set
        assert variable in guide, variable
    page = _page("iceberg.md", server, tmp_path)
    for _ in (1, 2):  # the second run overwrites the same rows and queries a fresh replica
        page.run_pass()
        printed = capsys.readouterr().out
        assert PRINTED in printed
    assert PRINTED in guide
    assert any(c.startswith("weed mini") for c in page.ran)
    assert not page.servers
    table = server.catalog().load_table(("analytics", "episodes"))
    assert table.scan().to_arrow().num_rows == 3


def test_the_registrar_page_runs_twice(
    server: SeaweedIceberg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    server.create_bucket("segments")  # the page's bucket for shipped files
    page = _page("registrar.md", server, tmp_path)
    page.run_pass()
    shipped, registered = page.printed
    assert "shipped 1" in shipped, shipped
    assert "registered 1, skipped 0, pending 0" in registered, registered
    page.run_pass()
    shipped, registered = page.printed[2:]
    assert "shipped 0" in shipped, shipped
    assert "registered 0, skipped 1" in registered, registered
    pose = server.catalog().load_table(("robotics", "fleet", "pose"))
    [task] = pose.scan().plan_files()
    assert task.file.file_path == "s3://segments/fleet/lake/v1/edge-capture/pose/000001.parquet"
    assert pose.scan().to_arrow().column("robot").to_pylist() == ["r1", "r2"]
