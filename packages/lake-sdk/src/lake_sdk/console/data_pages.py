"""Tables, Versions and Query pages, and result downloads (CSV, Parquet, Arrow).

Each page's state is in its URL: ``/tables``, ``/versions/ns.table``,
``/query?sql=...&as_of=...&page=N``. A query page re-runs its statement and
streams it, keeping only the rows of the page asked for; ``as_of`` pins
every ``lake.<namespace>.<table>`` the SQL names to a version or instant.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.flight as flight
import pyarrow.parquet as pq

from lake_core.errors import InvalidArgument, LakeError
from lake_core.filetype import is_file_field
from lake_core.names import TableRef
from lake_core.output import type_name
from lake_core.proto import flight_sql_pb2
from lake_sdk._client import AsyncClient, _any
from lake_sdk.console.render import e, error_box, grid

__all__ = [
    "DOWNLOADS",
    "QueryState",
    "download_stream",
    "first_batch",
    "listing",
    "query_body",
    "read_page",
    "tables_body",
    "versions_body",
]

#: Download formats: media type and file name suffix.
DOWNLOADS = {
    "csv": ("text/csv; charset=utf-8", "csv"),
    "parquet": ("application/vnd.apache.parquet", "parquet"),
    "arrow": ("application/vnd.apache.arrow.stream", "arrows"),
}
#: Longest statement the console accepts in a URL or form (characters).
MAX_SQL_CHARS = 100_000


@dataclass(frozen=True)
class QueryState:
    """What a query page's URL holds."""

    sql: str = ""
    as_of: str = ""
    page: int = 0

    @classmethod
    def from_params(cls, params: Any) -> QueryState:
        sql = str(params.get("sql", ""))
        if len(sql) > MAX_SQL_CHARS:
            raise InvalidArgument(f"the statement is longer than {MAX_SQL_CHARS} characters")
        page_text = str(params.get("page", "0") or "0")
        if not page_text.isdigit() or len(page_text) > 9:
            raise InvalidArgument("page must be a whole number >= 0")
        return cls(sql=sql, as_of=str(params.get("as_of", "")).strip(), page=int(page_text))

    def url(self, path: str = "/query", **changes: Any) -> str:
        values = {"sql": self.sql, "as_of": self.as_of, "page": self.page, **changes}
        kept = {k: v for k, v in values.items() if v not in ("", 0, None)}
        return f"{path}?{urlencode(kept)}" if kept else path

    async def run(self, client: AsyncClient) -> Any:
        return await client.query(self.sql, as_of=self.as_of or None)


async def read_page(client: AsyncClient, state: QueryState, rows: int) -> tuple[pa.Table, bool]:
    """Rows ``page*rows`` .. ``+rows`` of the result and whether more follow (streamed)."""
    result = await state.run(client)
    skip = state.page * rows
    kept: list[pa.RecordBatch] = []
    have = 0
    more = False
    try:
        async for batch in result:
            if skip >= batch.num_rows:
                skip -= batch.num_rows
                continue
            batch = batch.slice(skip)
            skip = 0
            take = min(batch.num_rows, rows - have)
            kept.append(batch.slice(0, take))
            have += take
            if have >= rows:
                more = batch.num_rows > take or await _has_more(result)
                break
    finally:
        result.cancel()
    return pa.Table.from_batches(kept, schema=result.schema), more


async def _has_more(result: Any) -> bool:
    while (batch := await result.next_batch()) is not None:
        if batch.num_rows:
            return True
    return False


async def listing(client: AsyncClient, message: Any) -> pa.Table:
    """A Flight SQL catalog listing (GetTables ...) with the principal's token."""
    state = client._state
    info = await state.connection.flight_info(flight.FlightDescriptor.for_command(_any(message)))
    return await (await client._read(info, info.endpoints)).to_table()


async def _table_facts(client: AsyncClient, ref: TableRef) -> dict[str, Any]:
    async def count() -> Any:
        return (await client.query_table(f"SELECT count(*) AS n FROM {ref}")).column(0)[0].as_py()

    async def version() -> Any:
        versions = await client.versions(ref)
        return versions.column("version")[-1].as_py() if versions.num_rows else None

    try:
        # One after another: Query fails concurrent reads of one table today
        # ("Already mutably borrowed" from Lance, an Internal error).
        schema = await client.table_schema(ref)
        rows = await count()
        current = await version()
    except LakeError as exc:
        return {"error": exc}
    return {"schema": schema, "rows": rows, "version": current}


def _schema_html(schema: pa.Schema) -> str:
    items = "".join(
        f'<li class="{"file" if is_file_field(f) else ""}"><code>{e(f.name)}</code> '
        f"{e(type_name(f))}{' <span class=badge>FILE</span>' if is_file_field(f) else ''}</li>"
        for f in schema
    )
    return f'<ul class="schema">{items}</ul>'


async def tables_body(client: AsyncClient) -> str:
    found = await listing(client, flight_sql_pb2.CommandGetTables())
    refs = [
        TableRef(ns, name)
        for ns, name in zip(
            found.column("db_schema_name").to_pylist(),
            found.column("table_name").to_pylist(),
            strict=True,
        )
    ]
    facts = [await _table_facts(client, r) for r in refs]
    items = []
    for ref, fact in zip(refs, facts, strict=True):
        query = QueryState(sql=f"SELECT * FROM {ref}").url()
        head = (
            f'<a class="name" href="{e(query)}">{e(ref)}</a> '
            f'<a href="/versions/{e(ref)}">versions</a>'
        )
        if "error" in fact:
            items.append(f'<li data-testid="table-item">{head} {error_box(fact["error"])}</li>')
            continue
        items.append(
            f'<li data-testid="table-item">{head} '
            f'<span class="rows">{fact["rows"]:,} rows</span> '
            f'<span class="version">version {e(fact["version"])}</span>'
            f"{_schema_html(fact['schema'])}</li>"
        )
    namespaces = sorted({r.namespace for r in refs})
    summary = (
        f"<p>{len(refs)} tables in {len(namespaces)} namespaces: {e(', '.join(namespaces))}</p>"
    )
    return f'{summary}<ul class="tables" data-testid="table-list">{"".join(items)}</ul>'


async def versions_body(client: AsyncClient, table: str) -> str:
    ref = TableRef.parse(table)
    versions = await client.versions(ref)
    rows = []
    for v in reversed(versions.to_pylist()):
        browse = QueryState(sql=f"SELECT * FROM lake.{ref}", as_of=str(v["version"])).url()
        committed = v["committed_at"]
        rows.append(
            f'<tr data-testid="version-item"><td class="num">{e(v["version"])}</td>'
            f"<td>{e(committed.strftime('%Y-%m-%d %H:%M:%S UTC') if committed else 'NULL')}</td>"
            f"<td>{e(v['operation'])}</td><td class=num>{e(v['rows_added'])}</td>"
            f'<td><a data-testid="version-browse" href="{e(browse)}">browse as of v'
            f"{e(v['version'])}</a></td></tr>"
        )
    return (
        '<table class="grid" data-testid="version-list"><thead><tr><th>version</th>'
        "<th>committed</th><th>operation</th><th>rows added</th><th></th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def query_form(state: QueryState) -> str:
    return (
        '<form method="get" action="/query" class="sql">'
        f'<textarea name="sql" data-testid="sql-input" rows="5" spellcheck="false">'
        f"{e(state.sql)}</textarea>"
        '<label>as of <input name="as_of" data-testid="as-of" placeholder="version or '
        f'2026-11-30T12:00:00Z" value="{e(state.as_of)}"></label>'
        '<button type="submit" data-testid="sql-run">Run</button></form>'
    )


async def query_body(client: AsyncClient, state: QueryState, rows: int) -> str:
    form = query_form(state)
    if not state.sql.strip():
        return form
    try:
        table, more = await read_page(client, state, rows)
    except LakeError as exc:
        return form + error_box(exc)
    first = state.page * rows

    episode = state.url("/episode", page=0) + ("&" if state.sql else "?")

    def link(row: int) -> str:
        return f"{episode}row={row}"

    nav = [
        f'<span class="range">rows {first + 1 if table.num_rows else 0}–{first + table.num_rows}</span>'
    ]
    if state.page > 0:
        nav.append(
            f'<a data-testid="page-prev" href="{e(state.url(page=state.page - 1))}">previous</a>'
        )
    if more:
        nav.append(
            f'<a data-testid="page-next" href="{e(state.url(page=state.page + 1))}">next</a>'
        )
    downloads = " ".join(
        f'<a data-testid="download-{kind}" href="{e(state.url("/download", page=0, format=kind))}">'
        f"{kind.upper()}</a>"
        for kind in DOWNLOADS
    )
    plot = f'<a href="{e(state.url("/plot", page=0))}">plot</a>'
    return (
        f'{form}<div class="pager">{" ".join(nav)} · download {downloads} · {plot}</div>'
        f"{grid(table, first_row=first, file_link=link)}"
    )


class _Sink(io.RawIOBase):
    """A write-only file whose bytes are taken out after each batch."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self.parts)
        self.parts.clear()
        return out


async def _from(first: pa.RecordBatch | None, result: Any) -> AsyncIterator[pa.RecordBatch]:
    if first is None:
        return
    yield first
    async for batch in result:
        yield batch


async def first_batch(result: Any) -> pa.RecordBatch | None:
    """The result's first batch (None: no rows), read before a download's response starts.

    A statement that fails as it runs (``1/0``, a timeout, a lost table)
    fails at its first batch: read here, the failure is the response's typed
    status rather than a 200 cut off after its headers.
    """
    try:
        batch: pa.RecordBatch | None = await result.next_batch()
    except BaseException:
        result.cancel()
        raise
    return batch


async def download_stream(
    result: Any, kind: str, first: pa.RecordBatch | None
) -> AsyncIterator[bytes]:
    """The result in ``kind`` from its ``first`` batch on, one batch at a time (never held whole)."""
    sink = _Sink()
    schema = result.schema
    writer: Any
    if kind == "csv":
        writer = pacsv.CSVWriter(sink, _csv_schema(schema))
    elif kind == "parquet":
        schema = _parquet_schema(schema)
        writer = pq.ParquetWriter(sink, schema)
    else:
        writer = pa.ipc.new_stream(sink, schema)
    try:
        async for batch in _from(first, result):
            if kind == "csv":
                batch = _csv_batch(batch)
            elif kind == "parquet":
                batch = batch.cast(schema)
            writer.write_batch(batch)
            if chunk := sink.take():
                yield chunk
        writer.close()
        if chunk := sink.take():
            yield chunk
    finally:
        result.cancel()


def _parquet_schema(schema: pa.Schema) -> pa.Schema:
    """Struct children nullable: Parquet refuses a null FILE cell's non-nullable ``uri``."""

    def relax(field: pa.Field) -> pa.Field:
        if not pa.types.is_struct(field.type):
            return field
        children = [
            relax(field.type.field(i)).with_nullable(True) for i in range(field.type.num_fields)
        ]
        return field.with_type(pa.struct(children))

    return pa.schema([relax(f) for f in schema], metadata=schema.metadata)


def _csv_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema(
        [pa.field(f.name, pa.utf8()) if _nested(f.type) else f for f in schema],
    )


def _nested(kind: pa.DataType) -> bool:
    return bool(pa.types.is_nested(kind))


def _csv_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Nested values (a FILE column, lists) as JSON text, as ``lake sql -o csv`` writes them."""
    import json

    from lake_sdk.sql_cli import json_value

    columns = []
    for field, column in zip(batch.schema, batch.columns, strict=True):
        if _nested(field.type):
            texts = [None if v is None else json.dumps(json_value(v)) for v in column.to_pylist()]
            columns.append(pa.array(texts, pa.utf8()))
        else:
            columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=_csv_schema(batch.schema))
