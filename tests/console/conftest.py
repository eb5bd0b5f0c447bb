"""A real Lake (``lake meta`` + ``lake query`` with two tenants), a real ``lake console``, Chromium.

Query maps three tokens: ``acme`` (tenant acme, admin), ``globex`` (tenant
globex, namespace robots) and ``odd`` (tenant acme, namespace robots; a token
holding ``; , " \\``). ``robots.episodes`` holds 120 rows in two
versions; rows 0..2 carry a playable H.264 video (uploaded by acme, so it
lives in tenant acme's stage) and row 1's note is a ``<script>`` tag.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import lake_sdk
from lake_core.filetype import file_field
from lake_core.names import TableRef
from tools.lake_testing.console import start_console
from tools.lake_testing.data import create_table
from tools.lake_testing.plugin import write_ticket_keys
from tools.lake_testing.recordings import write_recording
from tools.lake_testing.servers import LakeProcess, start_meta, start_query
from tools.lake_testing.video import encode_noise_video

TOKENS = {
    "acme": "lk_console_acme_0001",
    "globex": "lk_console_globex_01",
    # Valid (visible ASCII), and no cookie value as it stands.
    "odd": 'lk;console,"odd\\01',
}
EPISODES = TableRef("robots", "episodes")
SCHEMA = pa.schema(
    [
        pa.field("episode_id", pa.int64()),
        pa.field("reward", pa.float64()),
        pa.field("note", pa.utf8()),
        file_field("video"),
    ]
)
RUNS = TableRef("robots", "runs")
RUNS_SCHEMA = pa.schema([pa.field("run_id", pa.int64()), file_field("recording")])
INSERT = "INSERT INTO robots.episodes (episode_id, reward, note, video) VALUES (?, ?, ?, ?)"
SCRIPT = "<script>window.pwned=1</script>"
FPS = 10
DOCS = Path(__file__).resolve().parents[2] / "docs" / "console"


def _principals(path: Path) -> Path:
    bindings = [
        {"token": TOKENS["acme"], "principal_id": "ann", "tenant_id": "acme", "role": "admin"},
        {
            "token": TOKENS["globex"],
            "principal_id": "gus",
            "tenant_id": "globex",
            "role": "user",
            "namespaces": ["robots"],
        },
        {
            "token": TOKENS["odd"],
            "principal_id": "olly",
            "tenant_id": "acme",
            "role": "user",
            "namespaces": ["robots"],
        },
    ]
    path.write_text(json.dumps({"bindings": bindings}))
    path.chmod(0o600)
    return path


@dataclass
class Console:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    video: Path
    duration: float

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="package")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LakeProcess]:
    root = tmp_path_factory.mktemp("console-lake")
    objects = str(root / "data" / "objects")
    keys = str(write_ticket_keys(root / "ticket-keys.json"))
    meta = start_meta(
        root / "data",
        root,
        env={"LAKE_QUERY_TICKET_KEYS_FILE": keys, "LAKE_MANAGED_OBJECT_ROOT": objects},
    )
    query: LakeProcess | None = None
    try:
        env = {
            "LAKE_QUERY_TICKET_KEYS_FILE": keys,
            "LAKE_MANAGED_OBJECT_ROOT": objects,
            "LAKE_QUERY_CATALOG_REFRESH_MS": "200",
            "LAKE_AUTH_PRINCIPALS_FILE": str(_principals(root / "principals.json")),
        }
        query = start_query(meta.addr, root, env=env, probe_token=TOKENS["acme"])
        create_table(meta.addr, EPISODES, SCHEMA)
        create_table(meta.addr, RUNS, RUNS_SCHEMA)
        yield query
    finally:
        if query is not None:
            query.stop()
        meta.stop()


@pytest.fixture(scope="package")
def console(lake: LakeProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    root = tmp_path_factory.mktemp("console")
    video = root / "episode.mp4"
    duration = encode_noise_video(video, 6 * 1024 * 1024, fps=FPS)
    with lake_sdk.Client(lake.url, token=TOKENS["acme"], connect_timeout=60, progress=False) as c:
        rows: list[list[Any]] = [
            [
                i,
                i / 10,
                SCRIPT if i == 1 else f"episode {i}",
                lake_sdk.FileUpload.from_path(video, "video/mp4"),
            ]
            for i in range(3)
        ]
        c.insert_many(INSERT, rows)
        c.insert_many(
            INSERT, [[i, i / 10, "x" * 300 if i == 7 else None, None] for i in range(3, 120)]
        )
        recording = write_recording(root / "run.mcap")
        c.insert(
            "INSERT INTO robots.runs (run_id, recording) VALUES (?, ?)",
            [1, lake_sdk.FileUpload.from_path(recording, "application/x-mcap")],
        )
    process = start_console(lake.url, root)
    try:
        yield Console(process.url, process.proc, process.log_path, video, duration)
    finally:
        process.stop()


@pytest.fixture(scope="package")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if shutil.which("chromium") is None or not Path("/usr/bin/chromedriver").exists():
        pytest.fail(
            "Chromium is not installed: .ci/run installs Debian's chromium and chromium-driver"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--autoplay-policy=no-user-gesture-required",
        "--window-size=1200,900",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    driver.set_page_load_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()
