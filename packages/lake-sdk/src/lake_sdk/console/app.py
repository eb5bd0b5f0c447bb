"""The console's routes (Starlette): sign-in, the pages, downloads and FILE bytes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from lake_core import errors as core_errors
from lake_core.errors import InvalidArgument, LakeError
from lake_core.proto import flight_sql_pb2
from lake_objects import errors as object_errors
from lake_sdk._client import AsyncClient
from lake_sdk.console import cluster_page, data_pages, file_pages, plot
from lake_sdk.console.render import e, error_box, page
from lake_sdk.console.session import (
    PRESESSION_COOKIE,
    SESSION_COOKIE,
    Clients,
    clear_cookie,
    csrf_ok,
    csrf_token,
    new_presession,
    presession_value,
    session_for,
    session_value,
    set_cookie,
    set_session_cookie,
    token_of,
)
from lake_sdk.console.settings import ConsoleSettings

__all__ = ["create_app"]

_STATIC = Path(__file__).parent / "static"
_MAX_FORM_BYTES = 64 * 1024
#: Content-Security-Policy of every response: this origin only, no inline script.
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "media-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)


def http_status(error: BaseException) -> int:
    """The HTTP status a Lake error becomes on a byte or download response."""
    if isinstance(error, core_errors.Unauthenticated):
        return 401
    if isinstance(error, core_errors.PermissionDenied | object_errors.LocationOutsideStage):
        return 403
    if isinstance(error, object_errors.InvalidRange):
        return 416
    if isinstance(error, core_errors.NotFound):
        return 404
    if isinstance(error, InvalidArgument):
        return 400
    return 502


class _Headers:
    """Security headers on every response (a plain ASGI middleware: streams pass through)."""

    _ADD = (
        (b"content-security-policy", _CSP.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
    )

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in self._ADD if k not in names]
                if b"cache-control" not in names:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def create_app(settings: ConsoleSettings) -> Starlette:
    """The console as an ASGI app (``lake console`` serves it with uvicorn)."""
    clients = Clients(settings)

    def html(title: str, body: str, session: str, status: int = 200) -> HTMLResponse:
        return HTMLResponse(
            page(title, body, csrf=csrf_token(settings, session)), status_code=status
        )

    def signed_in(
        handler: Callable[[Request, str, AsyncClient], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        """Pages need a session: without one, to the sign-in form (401 for bytes)."""

        async def wrapped(request: Request) -> Response:
            session = session_value(request)
            if session is None:
                if request.url.path in ("/file", "/download"):
                    return Response("sign in first", status_code=401, media_type="text/plain")
                return RedirectResponse("/signin", status_code=303)
            try:
                client = await clients.get(session)
                return await handler(request, session, client)
            except core_errors.Unauthenticated:
                await clients.forget(session)
                response = RedirectResponse("/signin", status_code=303)
                clear_cookie(response, settings, SESSION_COOKIE)
                return response
            except LakeError as exc:
                if request.url.path in ("/file", "/download"):
                    return Response(
                        f"{type(exc).__name__}: {exc}",
                        status_code=http_status(exc),
                        media_type="text/plain",
                    )
                return html("Error", error_box(exc), session, http_status(exc))

        return wrapped

    async def form(request: Request) -> dict[str, str]:
        """The posted form, read no further than ``_MAX_FORM_BYTES`` (anyone may post one)."""
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > _MAX_FORM_BYTES:
                raise InvalidArgument(f"the form is larger than {_MAX_FORM_BYTES} bytes")
        fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        return {k: v[0] for k, v in fields.items()}

    def posted(
        handler: Callable[[Request, dict[str, str]], Awaitable[Response]],
        basis: Callable[[Request], str | None],
    ) -> Callable[[Request], Awaitable[Response]]:
        """A state-changing POST: its form read (bounded) and its CSRF token checked first.

        Both refusals are plain typed answers (413, 403): these routes take
        requests from anyone, signed in or not.
        """

        async def wrapped(request: Request) -> Response:
            try:
                fields = await form(request)
            except InvalidArgument as exc:
                return Response(f"InvalidArgument: {exc}", status_code=413, media_type="text/plain")
            if not csrf_ok(settings, basis(request), fields.get("csrf")):
                return Response(
                    "CSRF token missing or wrong", status_code=403, media_type="text/plain"
                )
            return await handler(request, fields)

        return wrapped

    def signin_page(
        presession: str, error: BaseException | None = None, status: int = 200
    ) -> Response:
        body = (
            (error_box(error) if error is not None else "")
            + '<form method="post" action="/signin" class="signin">'
            f'<input type="hidden" name="csrf" value="{e(csrf_token(settings, presession))}">'
            '<label>Token <input type="password" name="token" data-testid="token-input" '
            'autocomplete="off"></label> '
            '<button type="submit" data-testid="sign-in">Sign in</button></form>'
            f"<p>Query: <code>{e(settings.query_url)}</code></p>"
        )
        response = HTMLResponse(page("Sign in", body, signed_in=False), status_code=status)
        set_cookie(response, settings, PRESESSION_COOKIE, presession)
        return response

    async def signin_get(request: Request) -> Response:
        return signin_page(presession_value(request) or new_presession())

    async def signin_post(request: Request, fields: dict[str, str]) -> Response:
        session = session_for(fields.get("token", "").strip())
        try:
            client = await clients.get(session)
            await data_pages.listing(client, flight_sql_pb2.CommandGetDbSchemas())
        except LakeError as exc:
            await clients.forget(session)
            return signin_page(new_presession(), exc, http_status(exc))
        response = RedirectResponse("/tables", status_code=303)
        set_session_cookie(response, settings, session)
        clear_cookie(response, settings, PRESESSION_COOKIE)
        return response

    async def signout(request: Request, fields: dict[str, str]) -> Response:
        session = session_value(request)
        assert session is not None  # posted() checked the CSRF token against it
        await clients.forget(session)
        response = RedirectResponse("/signin", status_code=303)
        clear_cookie(response, settings, SESSION_COOKIE)
        return response

    async def home(request: Request) -> Response:
        return RedirectResponse("/tables" if session_value(request) else "/signin", 303)

    async def tables(request: Request, session: str, client: AsyncClient) -> Response:
        return html("Tables", await data_pages.tables_body(client), session)

    async def versions(request: Request, session: str, client: AsyncClient) -> Response:
        table = request.path_params["table"]
        body = await data_pages.versions_body(client, table)
        return html(f"Versions of {table}", body, session)

    async def query(request: Request, session: str, client: AsyncClient) -> Response:
        state = data_pages.QueryState.from_params(request.query_params)
        body = await data_pages.query_body(client, state, settings.page_rows)
        status = 400 if 'data-testid="error"' in body else 200
        return html("Query", body, session, status)

    async def download(request: Request, session: str, client: AsyncClient) -> Response:
        state = data_pages.QueryState.from_params(request.query_params)
        kind = request.query_params.get("format", "")
        if kind not in data_pages.DOWNLOADS:
            raise InvalidArgument(f"format must be one of {', '.join(data_pages.DOWNLOADS)}")
        media, suffix = data_pages.DOWNLOADS[kind]
        result = await state.run(client)  # errors before the first byte: a typed status
        first = await data_pages.first_batch(result)  # and so are errors running it
        return StreamingResponse(
            data_pages.download_stream(result, kind, first),
            media_type=media,
            headers={"Content-Disposition": f'attachment; filename="result.{suffix}"'},
        )

    async def episode(request: Request, session: str, client: AsyncClient) -> Response:
        state = data_pages.QueryState.from_params(request.query_params)
        row_text = request.query_params.get("row", "0")
        if not row_text.isdigit() or len(row_text) > 9:
            raise InvalidArgument("row must be a whole number >= 0")
        body = await file_pages.episode_body(client, state, int(row_text), settings.page_rows)
        return html(f"Episode (row {int(row_text)})", body, session)

    async def file_bytes(request: Request, session: str, client: AsyncClient) -> Response:
        location = file_pages.decode_location(request.query_params.get("loc", ""))
        download = bool(request.query_params.get("download"))
        headers = file_pages.byte_headers(location.media_type, download)
        header = request.headers.get("range")
        size = location.size_bytes
        if header is None:
            reader = await client.open(location)  # the whole object, verified at its end
            headers["Content-Length"] = str(size)
            return StreamingResponse(
                file_pages.stream(reader), media_type=location.media_type, headers=headers
            )
        wanted = file_pages.parse_range(header, size, settings.range_chunk_bytes)
        if wanted is None:
            headers["Content-Range"] = f"bytes */{size}"
            return Response(status_code=416, headers=headers)
        headers["Content-Range"] = wanted.header
        headers["Content-Length"] = str(wanted.end - wanted.start)
        store = await client.object_store()
        view = await store.map_range(location, wanted.start, wanted.end)
        if view is not None:  # a local stage: no copy
            return file_pages.MappedRangeResponse(view, headers, location.media_type)
        reader = await client.open_range(location, wanted.start, wanted.end)
        return file_pages.RangeResponse(reader, headers, location.media_type)

    async def plot_page(request: Request, session: str, client: AsyncClient) -> Response:
        state = data_pages.QueryState.from_params(request.query_params)
        params = request.query_params
        kind, x, y = params.get("kind", "line"), params.get("x", ""), params.get("y", "")
        body = plot.plot_form(state, kind, x, y)
        if state.sql.strip():
            try:
                table, more = await data_pages.read_page(
                    client, data_pages.QueryState(state.sql, state.as_of, 0), plot.MAX_POINTS
                )
                body += plot.plot_result(table, more, kind, x, y)
            except LakeError as exc:
                body += error_box(exc)
        return html("Plot", body, session)

    @contextlib.asynccontextmanager
    async def replica_client(url: str, session: str) -> AsyncIterator[AsyncClient]:
        """A short-lived client of another replica, as the signed-in principal."""
        other = AsyncClient(
            url,
            token=token_of(session),
            ca_pem=settings.ca_pem,
            server_name=settings.server_name,
            connect_timeout=cluster_page.STATUS_TIMEOUT_S,
            progress=False,
        )
        await other.__aenter__()
        try:
            yield other
        finally:
            await other.close()

    async def cluster(request: Request, session: str, client: AsyncClient) -> Response:
        body = await cluster_page.cluster_body(
            client,
            settings.query_url,
            settings.replicas,
            lambda url: replica_client(url, session),
        )
        return html("Cluster", body, session)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await clients.close()

    routes: list[Any] = [
        Route("/", home),
        Route("/signin", signin_get, methods=["GET"]),
        Route("/signin", posted(signin_post, presession_value), methods=["POST"]),
        Route("/signout", posted(signout, session_value), methods=["POST"]),
        Route("/tables", signed_in(tables)),
        Route("/versions/{table}", signed_in(versions)),
        Route("/query", signed_in(query)),
        Route("/download", signed_in(download)),
        Route("/episode", signed_in(episode)),
        Route("/file", signed_in(file_bytes)),
        Route("/plot", signed_in(plot_page)),
        Route("/cluster", signed_in(cluster)),
        Mount("/static", StaticFiles(directory=_STATIC), name="static"),
    ]
    return Starlette(routes=routes, middleware=[Middleware(_Headers)], lifespan=lifespan)
