"""The console in headless Chromium: browse, query, page, error, plot, download, play a video.

Screenshots are taken as the tests go: into docs/console/ (docs/console.md shows them)
with ``UPDATE_SCREENSHOTS=1``, else into the test's temporary directory, so a test run
leaves the checkout as it was (a video frame renders differently each time).
"""

from __future__ import annotations

import io
import os
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.console.conftest import DOCS, FPS, SCRIPT, TOKENS, Console
from tools.lake_testing.console import Session

WAIT_S = 90
SHOTS = Path(tempfile.gettempdir()) / "lake-console-screenshots"
SQL = "SELECT episode_id, reward, note, video FROM robots.episodes ORDER BY episode_id"


def by_id(name: str) -> tuple[str, str]:
    return (By.CSS_SELECTOR, f'[data-testid="{name}"]')


def wait(driver: Any) -> WebDriverWait:
    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1)


def shot(driver: Any, name: str) -> None:
    folder = DOCS if os.environ.get("UPDATE_SCREENSHOTS") == "1" else SHOTS
    folder.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(folder / f"{name}.png"))


def sign_in(driver: Any, console: Console) -> None:
    driver.get(console.url + "/signin")
    driver.find_element(*by_id("token-input")).send_keys(TOKENS["acme"])
    driver.find_element(*by_id("sign-in")).click()
    wait(driver).until(lambda d: d.find_elements(*by_id("table-list")))
    cookie = driver.get_cookie("lake_session")
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert driver.execute_script("return document.cookie") == ""  # invisible to scripts


def test_browse_query_page_plot_and_download(
    browser: Any, console: Console, tmp_path: Path
) -> None:
    sign_in(browser, console)
    items = {i.text.split()[0]: i.text for i in browser.find_elements(*by_id("table-item"))}
    assert set(items) == {"robots.episodes", "robots.runs"}
    assert "120 rows" in items["robots.episodes"]
    assert "version 2" in items["robots.episodes"]
    assert "video file FILE" in items["robots.episodes"]  # the FILE column is marked
    assert "episode_id int64" in items["robots.episodes"]
    shot(browser, "tables")

    # Versions: pick version 1 and browse the table as of it (3 rows then).
    browser.get(console.url + "/versions/robots.episodes")
    versions = browser.find_elements(By.CSS_SELECTOR, '[data-testid="version-list"] tbody tr')
    assert [v.text.split()[0] for v in versions] == ["2", "1", "0"]
    versions[1].find_element(*by_id("version-browse")).click()
    wait(browser).until(lambda d: d.find_elements(*by_id("result-grid")))
    assert len(browser.find_elements(*by_id("result-row"))) == 3

    # Query: type SQL, run it, page the grid.
    browser.get(console.url + "/query")
    box = browser.find_element(*by_id("sql-input"))
    box.send_keys(SQL)
    browser.find_element(*by_id("sql-run")).click()
    wait(browser).until(lambda d: len(d.find_elements(*by_id("result-row"))) == 50)
    assert "sql=" in browser.current_url  # the URL holds the statement
    rows = browser.find_elements(*by_id("result-row"))
    assert rows[1].find_elements(By.TAG_NAME, "td")[2].text == SCRIPT  # shown as text
    assert browser.execute_script("return window.pwned === undefined")
    assert rows[3].find_elements(By.TAG_NAME, "td")[2].text == "NULL"
    shot(browser, "query")
    browser.find_element(*by_id("page-next")).click()
    wait(browser).until(lambda d: "rows 51–100" in d.page_source)
    first = browser.find_elements(*by_id("result-row"))[0]
    assert first.find_elements(By.TAG_NAME, "td")[0].text == "50"
    browser.find_element(*by_id("page-next")).click()
    wait(browser).until(lambda d: len(d.find_elements(*by_id("result-row"))) == 20)
    assert not browser.find_elements(*by_id("page-next"))

    # A typed error: the Lake error class and its message.
    browser.get(
        console.url + "/query?" + urllib.parse.urlencode({"sql": "SELECT * FROM robots.nope"})
    )
    error = wait(browser).until(lambda d: d.find_elements(*by_id("error")))[0]
    assert error.text.split(":")[0] in {"TableNotFound", "NotFound", "PermissionDenied"}
    shot(browser, "error")

    # Plot: reward per episode as a scatter chart, drawn server-side.
    params = {"sql": SQL, "kind": "scatter", "x": "episode_id", "y": "reward"}
    browser.get(console.url + "/plot?" + urllib.parse.urlencode(params))
    chart = wait(browser).until(lambda d: d.find_elements(*by_id("chart")))[0]
    assert len(chart.find_elements(By.CSS_SELECTOR, "circle")) == 120
    shot(browser, "plot")

    # Download the result: Parquet through the browser itself (a click, a file on
    # disk), CSV and Arrow with the browser's session cookie; read back with pyarrow.
    browser.get(console.url + "/query?" + urllib.parse.urlencode({"sql": SQL}))
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    browser.execute_cdp_cmd(
        "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)}
    )
    browser.find_element(*by_id("download-parquet")).click()
    saved = downloads / "result.parquet"
    wait(browser).until(lambda d: saved.exists() and not list(downloads.glob("*.crdownload")))
    tables = {"parquet": pq.read_table(saved)}
    session = Session(console.url)
    for cookie in browser.get_cookies():
        session.jar.set_cookie(_cookie(cookie))
    for kind in ("csv", "arrow"):
        href = browser.find_element(*by_id(f"download-{kind}")).get_attribute("href")
        reply = session.request(href.removeprefix(console.url))
        assert reply.status == 200, reply.text[:300]
        tables[kind] = _read(kind, reply.body)
    for table in tables.values():
        assert table.num_rows == 120
        assert table.column("episode_id").to_pylist() == list(range(120))
        assert table.column("note")[1].as_py() == SCRIPT
    # The token was never in a URL the browser visited or in the console's log.
    assert TOKENS["acme"] not in browser.current_url
    assert TOKENS["acme"] not in console.log()


def _read(kind: str, body: bytes) -> pa.Table:
    if kind == "csv":
        return pacsv.read_csv(io.BytesIO(body))
    if kind == "parquet":
        return pq.read_table(io.BytesIO(body))
    return pa.ipc.open_stream(body).read_all()


def _cookie(c: dict[str, Any]) -> Any:
    import http.cookiejar

    return http.cookiejar.Cookie(
        0,
        c["name"],
        c["value"],
        None,
        False,
        "127.0.0.1",
        False,
        False,
        "/",
        True,
        False,
        None,
        False,
        None,
        None,
        {},
    )


def seek(driver: Any, video: Any, target: float) -> float:
    """Seek ``video`` to ``target`` seconds; the time it landed on once a frame is ready."""
    driver.execute_script(
        "var v = arguments[0]; v.dataset.seeked = '';"
        "v.addEventListener('seeked', function () { v.dataset.seeked = '1'; }, {once: true});"
        "v.currentTime = arguments[1];",
        video,
        target,
    )
    wait(driver).until(
        lambda d: d.execute_script(
            "return arguments[0].dataset.seeked === '1' && arguments[0].readyState >= 2", video
        )
    )
    return float(driver.execute_script("return arguments[0].currentTime", video))


def test_episode_video_plays_and_seeks(browser: Any, console: Console) -> None:
    sign_in(browser, console)
    browser.get(console.url + "/query?" + urllib.parse.urlencode({"sql": SQL}))
    links = wait(browser).until(lambda d: d.find_elements(*by_id("file-link")))
    assert len(links) == 3
    links[0].click()
    video = wait(browser).until(lambda d: d.find_elements(*by_id("video-player")))[0]
    wait(browser).until(lambda d: d.execute_script("return arguments[0].readyState >= 2", video))
    shot(browser, "episode")  # the first frame: the same picture every run
    duration = browser.execute_script("return arguments[0].duration", video)
    assert abs(duration - console.duration) < 1.0
    browser.execute_script("arguments[0].play()", video)
    wait(browser).until(lambda d: d.execute_script("return arguments[0].currentTime", video) > 0.3)
    browser.execute_script("arguments[0].pause()", video)
    target = console.duration * 0.75
    landed = seek(browser, video, target)
    assert abs(landed - target) <= 1 / FPS
    assert TOKENS["acme"] not in console.log()
