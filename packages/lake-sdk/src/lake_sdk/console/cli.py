"""``lake console``: serve the console on ``--addr`` for the Query at ``--query``."""

from __future__ import annotations

from pathlib import Path

import click

from lake_core.config import is_loopback_address
from lake_sdk.console.settings import DEFAULT_ADDR, DEFAULT_QUERY_URL

__all__ = ["console"]


def _url(addr: str) -> str:
    return addr if "://" in addr else f"grpc://{addr}"


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"expected HOST:PORT, got {addr!r}", param_hint="--addr")
    return host.strip("[]"), int(port)


@click.command()
@click.option("--addr", default=DEFAULT_ADDR, show_default=True, help="Where the console listens.")
@click.option(
    "--query", "query_url", default=DEFAULT_QUERY_URL, show_default=True, help="Lake Query's URL."
)
@click.option(
    "--ca-pem",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Verify Query's TLS certificate against this CA bundle (https:// or grpc+tls://).",
)
@click.option("--server-name", default=None, help="The name Query's certificate carries.")
@click.option(
    "--replica",
    "replicas",
    multiple=True,
    help="Another Query replica the Cluster page reports on (repeatable; same TLS options).",
)
@click.option(
    "--tls-cert",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Serve the console over HTTPS with this certificate (PEM) ...",
)
@click.option(
    "--tls-key",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="... and this private key. Without them, --addr must be a loopback address.",
)
def console(
    addr: str,
    query_url: str,
    ca_pem: Path | None,
    server_name: str | None,
    replicas: tuple[str, ...],
    tls_cert: Path | None,
    tls_key: Path | None,
) -> None:
    """Look at Lake's data in a browser: tables, versions, SQL, plots, episodes' videos.

    Each person signs in with their own Lake token; every page and byte is
    fetched from Query with it. Needs the ``lake-sdk[console]`` extra.
    """
    from lake_core.install import extra_hint
    from lake_sdk.errors import MissingExtra

    try:
        import uvicorn

        from lake_sdk.console.app import create_app
        from lake_sdk.console.settings import ConsoleSettings
    except ModuleNotFoundError as exc:
        raise MissingExtra(
            f"lake console needs {exc.name}: {extra_hint('lake-sdk', 'console')}"
        ) from None
    host, port = _split(addr)
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("give both --tls-cert and --tls-key, or neither")
    https = tls_cert is not None
    if not https and not is_loopback_address(addr):
        raise click.UsageError(
            f"--addr {addr} is not a loopback address: serve the console over TLS "
            "(--tls-cert and --tls-key) to listen there"
        )
    settings = ConsoleSettings(
        query_url=_url(query_url),
        replicas=tuple(_url(r) for r in replicas),
        ca_pem=ca_pem.read_bytes() if ca_pem is not None else None,
        server_name=server_name,
        https=https,
    )
    scheme = "https" if https else "http"
    click.echo(f"lake console on {scheme}://{addr} for Query {settings.query_url}", err=True)
    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        ssl_certfile=str(tls_cert) if tls_cert else None,
        ssl_keyfile=str(tls_key) if tls_key else None,
        log_level="info",
        access_log=True,
        server_header=False,
    )
