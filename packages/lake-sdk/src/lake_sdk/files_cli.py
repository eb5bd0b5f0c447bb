"""``lake files put PATH`` and ``lake files get LOCATION|SQL OUT``: FILE bytes from a terminal.

Both talk to Query only (``--addr``, as ``lake sql``): the client learns the
managed stage from Query and moves the bytes directly to or from storage.
``put`` prints the new object's DataLocation (``-o json``: the JSON a FILE
cell holds); ``get`` takes such a JSON document, or a statement selecting
exactly one FILE cell, and writes the object to OUT only once its size and
SHA-256 are proven (a temporary file beside OUT, renamed at the end). Both
draw a progress bar on an interactive terminal (not with ``LAKE_NO_PROGRESS=1``
or ``--no-progress``).
"""

from __future__ import annotations

import contextlib
import mimetypes
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import click
import pyarrow as pa
from pydantic import ValidationError

from lake_core.errors import InvalidArgument, ObjectIntegrityError
from lake_core.filetype import is_file_field, row_to_location
from lake_core.models import DataLocation
from lake_core.output import Output, emit, output_option
from lake_objects.progress import TaskBars
from lake_objects.source import FileUpload
from lake_sdk._cli_connect import connect_timeout_option, open_client
from lake_sdk._progress import upload_progress
from lake_sdk._sync import Client
from lake_sdk.sql_cli import DEFAULT_QUERY_URL, query_url

__all__ = ["files", "location_of", "media_type_of"]

#: What ``put`` records when the file's extension names no media type.
FALLBACK_MEDIA_TYPE = "application/octet-stream"

addr_option = click.option(
    "--addr", default=DEFAULT_QUERY_URL, show_default=True, help="Lake Query's URL (not Metasrv's)."
)
progress_option = click.option(
    "--progress/--no-progress",
    "progress",
    default=None,
    help="Draw a progress bar (default: on an interactive terminal only).",
)


def media_type_of(path: str, given: str | None) -> str:
    if given:
        return given
    guessed, _ = mimetypes.guess_type(path)
    return guessed or FALLBACK_MEDIA_TYPE


def _location_json(location: DataLocation) -> dict[str, Any]:
    return location.model_dump(mode="json")


@click.group()
def files() -> None:
    """Upload and download FILE objects through Lake Query (bytes go straight to storage)."""


@files.command("put")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, readable=True))
@click.option(
    "--media-type",
    default=None,
    metavar="TYPE/SUBTYPE",
    help="The object's media type (default: guessed from the file name).",
)
@addr_option
@connect_timeout_option
@progress_option
@output_option("text")
def put(
    path: str,
    media_type: str | None,
    addr: str,
    connect_timeout: float | None,
    progress: bool | None,
    output: Output,
) -> None:
    """Upload PATH to the managed stage and print its DataLocation.

    Put it in a FILE column with ``INSERT ... VALUES`` through the SDK, or
    hand the JSON (``-o json``) to ``lake files get``.
    """
    upload = FileUpload.from_path(path, media_type_of(path, media_type))
    with open_client(query_url(addr), connect_timeout) as client:
        store = client.object_store()
        with upload_progress(progress) as bar:
            location = store.upload(upload, progress=bar)
    emit(_location_json(location), output)


def location_of(client: Client, source: str) -> DataLocation:
    """A DataLocation's JSON, or the one FILE cell a statement selects."""
    if source.lstrip().startswith("{"):
        try:
            return DataLocation.model_validate_json(source)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "the document"
            raise InvalidArgument(f"not a DataLocation: {where}: {first['msg']}") from None
    table = client.query_table(source)
    columns = [f.name for f in table.schema if is_file_field(f)]
    if len(columns) != 1:
        raise InvalidArgument(
            f"the statement must select exactly one FILE column, it selected {len(columns)}"
        )
    if table.num_rows != 1:
        raise InvalidArgument(
            f"the statement must select exactly one row, it selected {table.num_rows}"
        )
    cell = table.column(columns[0])[0]
    if not cell.is_valid:
        raise InvalidArgument(f"the selected {columns[0]} is null")
    value = cell.as_py() if isinstance(cell, pa.Scalar) else cell
    return row_to_location(value)


@files.command("get")
@click.argument("source", metavar="LOCATION|SQL")
@click.argument("out", type=click.Path(dir_okay=False, writable=True, allow_dash=True))
@addr_option
@connect_timeout_option
@progress_option
def get(
    source: str, out: str, addr: str, connect_timeout: float | None, progress: bool | None
) -> None:
    """Download one object to OUT (- for standard output), verified.

    LOCATION|SQL is a DataLocation's JSON (what ``lake files put -o json``
    prints, or a FILE cell of ``lake sql -o json``), or a statement that
    selects exactly one row with exactly one FILE column. OUT is written only
    once the object's size and SHA-256 are proven.
    """
    if out != "-":
        _check_out(out)
    with open_client(query_url(addr), connect_timeout) as client:
        location = location_of(client, source)
        with client.open(location) as reader, TaskBars(enabled=progress) as bars:
            name = f"get {location.uri.rsplit('/', 1)[-1]}"
            if out == "-":
                done = 0
                for chunk in reader:
                    sys.stdout.buffer.write(chunk)
                    done += len(chunk)
                    bars.update(name, done, location.size_bytes)
                sys.stdout.buffer.flush()
                return
            _download(
                reader,
                Path(out),
                location,
                lambda done: bars.update(name, done, location.size_bytes),
            )
    click.echo(f"{out}: {location.size_bytes} bytes, sha256 {location.sha256}", err=True)


def _check_out(out: str) -> None:
    """Refuse an OUT that cannot be written before any byte is fetched.

    The download goes to a temporary file beside OUT, so OUT must name a file
    in an existing directory; otherwise the error is the caller's, on one line.
    """
    path = Path(out)
    if not out or not path.name or path.name in (".", ".."):
        raise click.BadParameter(f"{out!r} names no file", param_hint="'OUT'")
    if not path.parent.is_dir():
        raise click.BadParameter(f"directory '{path.parent}' does not exist", param_hint="'OUT'")


def _create(temporary: Path, path: Path) -> Any:
    """Open the temporary file; a directory that refuses it is a one-line error about OUT."""
    try:
        return open(temporary, "xb")
    except OSError as exc:
        raise click.FileError(str(path), hint=exc.strerror or str(exc)) from None


def _download(reader: Any, path: Path, location: DataLocation, moved: Any) -> None:
    """Write ``reader`` beside ``path``, then rename it over ``path`` once EOF verified it."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.partial")
    try:
        with _create(temporary, path) as sink:
            done = 0
            for chunk in reader:  # EOF raises if size or SHA-256 differ
                sink.write(chunk)
                done += len(chunk)
                moved(done)
            if not reader.verified:
                raise ObjectIntegrityError(
                    f"{path.name}: the download ended unverified", uri=location.uri
                )
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
