"""Every ``lake`` command's ``--output json`` parses; ``lake sql``; wrong addresses explained."""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner

import lake_sdk
from lake_core.cli import lake, main
from lake_core.config import MANAGED_OBJECT_ROOT, NO_PROGRESS, QUERY_TICKET_KEYS_FILE
from lake_core.errors import TableExists
from lake_core.filetype import file_field
from lake_core.names import TableRef
from lake_sdk._cli_connect import LISTEN_WAIT_S
from tools.lake_testing.data import create_table
from tools.lake_testing.plugin import LakeCluster, write_ticket_keys
from tools.lake_testing.servers import free_port, query_process

SHOTS = TableRef("robots", "shots")
LAKE = [sys.executable, "-c", "from lake_core.cli import main; main()"]


def _lake(*args: str) -> str:
    result = CliRunner().invoke(lake, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _json(*args: str) -> Any:
    return json.loads(_lake(*args, "--output", "json"))


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LakeCluster]:
    """One cluster for this module (the commands only read, or clean up after themselves)."""
    root = tmp_path_factory.mktemp("cli")
    env = {
        QUERY_TICKET_KEYS_FILE: str(write_ticket_keys(root / "ticket-keys.json")),
        MANAGED_OBJECT_ROOT: str(root / "data" / "objects"),
    }
    cluster = LakeCluster.start(root, env)
    try:
        schema = pa.schema(
            [pa.field("shot_id", pa.utf8()), pa.field("reward", pa.float64()), file_field("video")]
        )
        create_table(cluster.meta.addr, SHOTS, schema)
        clip = root / "a.mp4"
        clip.write_bytes(b"clip" * 100)
        with lake_sdk.Client(cluster.query.url, progress=False) as client:
            client.insert_many(
                "INSERT INTO robots.shots (shot_id, reward, video) VALUES (?, ?, ?)",
                [
                    ["a", 1.5, lake_sdk.FileUpload.from_path(clip, "video/mp4")],
                    ["b", float("nan"), None],
                ],
            )
        yield cluster
    finally:
        cluster.stop()


def test_every_client_command_prints_json(shots: LakeCluster) -> None:
    meta = ["client", "--addr", shots.meta.addr]
    created = _json(*meta, "create-table", "robots.extra", "--column", "v:file")
    assert created["columns"] == ["v: file"]  # FILE shown as `file`, as lake table does
    again = [*meta, "create-table", "robots.extra", "--column", "w:int64"]
    refused = CliRunner().invoke(lake, again)
    assert refused.exit_code != 0
    assert isinstance(refused.exception, TableExists)  # the class, rebuilt from the wire code
    assert _json(*again, "--if-not-exists") == created  # shown as it is, columns untouched
    described = _json(*meta, "describe-table", "robots.shots")
    assert described["columns"] == ["shot_id: string", "reward: double", "video: file"]
    listed = _json(*meta, "list-tables")
    assert [t["table"] for t in listed] == ["robots.extra", "robots.shots"]
    assert listed[1]["version"] == 1
    assert isinstance(_json(*meta, "optimize-table", "robots.shots"), dict)
    assert isinstance(_json(*meta, "create-index", "robots.shots", "shot_id"), dict)
    assert _json(*meta, "verify-table", "robots.shots")["problems"] == []
    assert _json(*meta, "drop-table", "robots.extra") == {
        "table": "robots.extra",
        "dropped_version": 0,
    }
    text = _lake(*meta, "describe-table", "robots.shots", "--output", "text")
    assert "  video: file" in text
    assert text.startswith("table: robots.shots\n")


def test_every_table_command_prints_json(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path / "lake-data")]
    created = _json(
        "table", "create", "robots.t", "--column", "a:string", "--column", "f:file", *data
    )
    assert created["columns"] == ["a: string", "f: file"]
    again = ("table", "create", "robots.t", "--column", "b:int64", "--if-not-exists", *data)
    assert _json(*again) == created
    assert [t["table"] for t in _json("table", "list", *data)] == ["robots.t"]
    assert _json("table", "describe", "robots.t", *data)["versions"][0]["version"] == 0
    assert isinstance(_json("table", "optimize", "robots.t", *data), dict)
    assert isinstance(_json("table", "index", "robots.t", "a", "--kind", "bitmap", *data), dict)
    assert _json("table", "verify", "robots.t", *data)["problems"] == []
    assert _json("table", "drop", "robots.t", *data)["dropped_version"] == 0
    text = _lake("table", "list", *data, "--output", "text")
    assert text.strip() == "(none)"


@pytest.mark.parametrize("command", ["list", "describe robots.t", "verify robots.t"])
def test_read_only_commands_refuse_a_missing_data_dir(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "no-such-dir"
    result = CliRunner().invoke(lake, ["table", *command.split(), "--data-dir", str(missing)])
    assert result.exit_code == 2
    assert f"no Lake data directory at {missing}" in result.output
    assert not missing.exists()


def test_the_root_data_dir_reaches_the_table_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lake --data-dir D table ...`` reads D, as ``lake table ... --data-dir D`` does.

    The table commands kept their own default: they read and created ./lake-data.
    """
    monkeypatch.chdir(tmp_path)  # where the default ./lake-data would appear
    root = ["--data-dir", str(tmp_path / "elsewhere")]
    _json(*root, "table", "create", "robots.t", "--column", "a:string")
    assert [t["table"] for t in _json(*root, "table", "list")] == ["robots.t"]
    assert _json("table", "list", *root)[0]["table"] == "robots.t"
    assert not (tmp_path / "lake-data").exists()


@pytest.mark.parametrize(
    ("args", "name"),
    [("sql SELECT 1", "sql"), ("files put x.mp4", "files put"), ("table load a.b x", "table load")],
)
def test_the_root_data_dir_is_refused_where_it_cannot_apply(
    tmp_path: Path, args: str, name: str
) -> None:
    """A command that reads no data directory says so instead of ignoring the option."""
    result = CliRunner().invoke(lake, ["--data-dir", str(tmp_path), *args.split()])
    assert result.exit_code == 2
    assert f"does not apply to `lake {name}`" in result.output


def test_lake_sql_streams_json_csv_and_tables(shots: LakeCluster) -> None:
    sql = "SELECT shot_id, reward, video FROM robots.shots ORDER BY shot_id"
    done = subprocess.run(
        [*LAKE, "sql", sql, "--addr", shots.query.addr, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [r["shot_id"] for r in rows] == ["a", "b"]
    assert rows[0]["reward"] == 1.5
    assert rows[1]["reward"] == "NaN"  # still valid JSON
    assert rows[0]["video"]["size_bytes"] == 400
    assert rows[1]["video"] is None

    url = ["--addr", shots.query.url]
    table = list(csv.reader(io.StringIO(_lake("sql", sql, *url, "--output", "csv"))))
    assert table[0] == ["shot_id", "reward", "video"]
    assert json.loads(table[1][2])["media_type"] == "video/mp4"

    drawn = _lake("sql", sql, *url)
    assert "file" in drawn  # the header names each column's type
    assert "double" in drawn
    assert "(2 rows)" in drawn
    assert json.loads(_lake("sql", "SELECT 1 AS one WHERE false", *url, "-o", "json")) == []


def test_lake_sql_reads_files_stdin_and_leading_comments(
    shots: LakeCluster, tmp_path: Path
) -> None:
    url = ["--addr", shots.query.url, "-o", "json"]
    commented = "-- how many shots?\nSELECT count(*) AS n FROM robots.shots"
    assert json.loads(_lake("sql", commented, *url)) == [{"n": 2}]
    assert json.loads(_lake("sql", *url, "--  spaced\nSELECT 2 AS n")) == [{"n": 2}]
    script = tmp_path / "shots.sql"
    script.write_text("-- from a file\nSELECT shot_id FROM robots.shots ORDER BY shot_id\n")
    assert json.loads(_lake("sql", "-f", str(script), *url)) == [
        {"shot_id": "a"},
        {"shot_id": "b"},
    ]
    piped = subprocess.run(
        [*LAKE, "sql", "-f", "-", *url],
        input="SELECT 3 AS n -- trailing\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout) == [{"n": 3}]
    both = CliRunner().invoke(lake, ["sql", "SELECT 1", "-f", str(script), *url])
    assert both.exit_code == 2
    assert "either as STATEMENT or with -f FILE" in both.output
    neither = CliRunner().invoke(lake, ["sql", *url])
    assert neither.exit_code == 2
    assert "either as STATEMENT or with -f FILE" in neither.output
    typo = CliRunner().invoke(lake, ["sql", "SELECT 1", "--outptu", "json"])
    assert typo.exit_code == 2
    assert "No such option '--outptu'" in typo.output


def test_lake_sql_refuses_a_file_that_is_not_utf8_on_one_line(tmp_path: Path) -> None:
    """-f with a binary file was a UnicodeDecodeError traceback (exit 1)."""
    binary = tmp_path / "clip.bin"
    binary.write_bytes(b"SEL\xdf\xff\x00ECT")
    done = subprocess.run(
        [*LAKE, "sql", "-f", str(binary), "--addr", "grpc://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "is not UTF-8 text" in done.stderr, done.stderr


def test_lake_sql_as_of_reads_an_older_version(shots: LakeCluster) -> None:
    sql = "SELECT count(*) AS n FROM lake.robots.shots"
    url = ["--addr", shots.query.url, "-o", "json"]
    assert json.loads(_lake("sql", sql, *url, "--as-of", "0")) == [{"n": 0}]  # created empty
    assert json.loads(_lake("sql", sql, *url, "--as-of", "v1")) == [{"n": 2}]
    future = subprocess.run(
        [*LAKE, "sql", sql, *url, "--as-of", "99"], capture_output=True, text=True, timeout=120
    )
    assert future.returncode == 2
    assert future.stderr.startswith("error: ")
    assert "Traceback" not in future.stderr


def test_lake_sql_errors_are_typed_and_short(shots: LakeCluster) -> None:
    done = subprocess.run(
        [*LAKE, "sql", "DROP TABLE robots.shots", "--addr", shots.query.url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: ")
    assert "Traceback" not in done.stderr


def test_the_sdk_pointed_at_metasrv_names_the_mistake(shots: LakeCluster) -> None:
    wrong = lake_sdk.Client(f"grpc://{shots.meta.addr}")
    with wrong as client, pytest.raises(lake_sdk.Unimplemented) as raised:
        client.query("SELECT 1")
    message = str(raised.value)
    assert f"grpc://{shots.meta.addr} is Lake Metasrv" in message
    assert "Query's address" in message
    with lake_sdk.Client(shots.query.url) as client:
        connection = client._inner._state.connection
        with pytest.raises(lake_sdk.Unimplemented) as raised:
            client._runner.run(connection.action("lake.no_such_action", b""))
    assert "Metasrv" not in str(raised.value)  # Query itself is never mistaken for Metasrv


def _on_a_terminal(args: list[str], env: dict[str, str]) -> tuple[str, str]:
    """``lake ARGS`` with stderr on a real pseudo-terminal: its stdout, and what the terminal got."""
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [*LAKE, *args],
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
            timeout=120,
            env={**{k: v for k, v in os.environ.items() if k != NO_PROGRESS}, **env},
        )
    finally:
        os.close(follower)
    chunks = []
    try:
        while chunk := os.read(leader, 65536):
            chunks.append(chunk)
    except OSError:  # EIO: nothing left to read and no writer
        pass
    finally:
        os.close(leader)
    assert done.returncode == 0, done.stdout
    return done.stdout, b"".join(chunks).decode(errors="replace")


def test_verify_draws_a_bar_on_a_terminal_only(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path / "lake-data")]
    _lake("table", "create", "robots.t", "--column", "a:int64", *data)
    report, terminal = _on_a_terminal(["table", "verify", "robots.t", *data], {})
    assert "verify robots.t" in terminal
    assert "checked: OK" in report  # the report itself stays on stdout
    report, terminal = _on_a_terminal(["table", "verify", "robots.t", *data], {NO_PROGRESS: "1"})
    assert terminal == ""
    assert "checked: OK" in report


def test_lake_client_pointed_at_query_names_the_mistake(shots: LakeCluster) -> None:
    result = CliRunner().invoke(lake, ["client", "--addr", shots.query.addr, "list-tables"])
    assert isinstance(result.exception, lake_sdk.Unimplemented)
    assert "Lake Query" in str(result.exception)
    assert "takes Metasrv's address" in str(result.exception)


def _query_commands(tmp_path: Path) -> dict[str, list[str]]:
    """Every SDK command that talks to Query, with arguments it would accept."""
    rows = tmp_path / "rows.csv"
    rows.write_text("a\n1\n")
    return {
        "sql": ["sql", "SELECT 1"],
        "files put": ["files", "put", str(rows)],
        "files get": ["files", "get", "SELECT 1", str(tmp_path / "out")],
        "table load": ["table", "load", "robots.shots", str(rows)],
        "recordings add": ["recordings", "add", "robots.runs", str(rows)],
        "recordings extract": [
            "recordings",
            "extract",
            "robots.runs",
            "--topic",
            "/t",
            "--into",
            "robots.t",
        ],
        "import lerobot": ["import", "lerobot", str(tmp_path), "--namespace", "robots"],
        "export lerobot": ["export", "lerobot", "SELECT 1", str(tmp_path / "out")],
    }


QUERY_COMMANDS = [
    "sql",
    "files put",
    "files get",
    "table load",
    "recordings add",
    "recordings extract",
    "import lerobot",
    "export lerobot",
]


@pytest.mark.parametrize("command", QUERY_COMMANDS)
def test_query_commands_fail_fast_when_nothing_listens(
    tmp_path: Path,
    command: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A closed port (a typo, Query not started) is exit 75 within seconds, naming the address.

    Each command waited a fixed 30 s (the SDK's wait for Query) before saying so.
    """
    addr = f"127.0.0.1:{free_port()}"
    monkeypatch.setattr(sys, "argv", ["lake", *_query_commands(tmp_path)[command], "--addr", addr])
    started = time.monotonic()
    with pytest.raises(SystemExit) as exited:
        main()  # an exception other than SystemExit would be a traceback
    took = time.monotonic() - started
    stderr = capsys.readouterr().err
    assert exited.value.code == 75, stderr
    assert took < 10, f"{command} took {took:.1f}s to notice nothing listens at {addr}"
    assert stderr.startswith(f"error: nothing is listening at grpc://{addr}"), stderr
    assert "--connect-timeout" in stderr  # how to wait for a Query still starting
    assert not (tmp_path / "out").exists()


def test_lake_sql_gives_up_at_its_connect_timeout(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--connect-timeout bounds the wait for a Query that never comes, and says how long it was."""
    addr = f"127.0.0.1:{free_port()}"
    args = ["sql", "SELECT 1", "--addr", addr, "--connect-timeout", "3.5"]
    monkeypatch.setattr(sys, "argv", ["lake", *args])
    started = time.monotonic()
    with pytest.raises(SystemExit) as exited:
        main()
    took = time.monotonic() - started
    stderr = capsys.readouterr().err
    assert exited.value.code == 75, stderr
    assert 3 < took < 10
    assert f"nothing is listening at grpc://{addr}" in stderr
    assert "waited 3.5 s" in stderr
    assert "give --connect-timeout" not in stderr  # the user gave one


@pytest.mark.parametrize("command", QUERY_COMMANDS)
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "3601", "soon"])
def test_query_commands_refuse_a_bad_connect_timeout(
    tmp_path: Path, command: str, value: str
) -> None:
    args = [*_query_commands(tmp_path)[command], "--connect-timeout", value]
    result = CliRunner().invoke(lake, [*args, "--addr", f"127.0.0.1:{free_port()}"])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--connect-timeout'" in result.output
    assert f"got {value!r}" in result.output


def test_lake_sql_waits_connect_timeout_for_a_query_still_starting(
    shots: LakeCluster, tmp_path: Path
) -> None:
    """With --connect-timeout, a Query that starts after the command (`lake query &`) is reached.

    Query is launched once the command has been refused for longer than the
    default wait for something to listen, and binds seconds later.
    """
    late = query_process(shots.meta.addr, tmp_path, port=free_port(), env=shots.env)
    launch = threading.Timer(LISTEN_WAIT_S + 1, late.launch)
    args = ["sql", "SELECT 1 AS one", "--addr", late.addr, "-o", "json"]
    launch.start()
    try:
        result = CliRunner().invoke(lake, [*args, "--connect-timeout", "120"])
    finally:
        launch.join()
        late.stop()
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == [{"one": 1}]
