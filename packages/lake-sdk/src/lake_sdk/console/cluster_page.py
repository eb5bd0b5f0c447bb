"""The Cluster page: each Query replica's health, catalog view, admission and memory.

The console asks every replica it knows (``--query`` and each ``--replica``)
for ``lake.status`` with the signed-in principal's own token, as
``lake client status --query`` does; a replica that does not answer, or
refuses a principal who is not an administrator, shows its typed error in
its row instead of figures.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager

from lake_core import protocol
from lake_core.errors import DeadlineExceeded, LakeError
from lake_core.status import STATUS, QueryStatus, StatusRequest
from lake_sdk._client import AsyncClient
from lake_sdk.console.render import e

__all__ = ["STATUS_TIMEOUT_S", "cluster_body"]

#: How long the page waits for one replica's status.
STATUS_TIMEOUT_S = 5.0

COLUMNS = ("replica", "health", "version", "catalog", "running", "queued", "refused", "memory")

#: Opens a short-lived client of another replica as the signed-in principal.
Connect = Callable[[str], AbstractAsyncContextManager[AsyncClient]]


async def replica_status(client: AsyncClient) -> QueryStatus:
    raw = await client._state.connection.action(STATUS, protocol.encode(StatusRequest()))
    return protocol.decode(QueryStatus, raw)


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):,.0f} MiB"


def _row(url: str, status: QueryStatus | LakeError) -> str:
    if isinstance(status, LakeError):
        return (
            f'<tr data-testid="replica"><td>{e(url)}</td>'
            f'<td colspan="{len(COLUMNS) - 1}" class="error" data-testid="error">'
            f'<strong class="error-class">{e(type(status).__name__)}</strong>: {e(status)}'
            "</td></tr>"
        )
    a = status.admission
    health = "SERVING" if status.serving else "NOT_SERVING: " + ", ".join(status.not_serving)
    catalog = (
        f"{status.catalog_tables if status.catalog_tables is not None else '?'} tables, "
        f"generation {status.catalog_generation or 'none yet'}"
    )
    if status.catalog_age_ms is not None:
        catalog += f", {status.catalog_age_ms / 1000:.1f} s old"
    memory = (
        "?"
        if status.memory is None
        else f"{_mib(status.memory.reserved_bytes)} of {_mib(status.memory.limit_bytes)}"
    )
    cells = (
        url,
        health,
        status.version,
        catalog,
        f"{a.running} of {a.max_concurrent}",
        a.queued,
        a.refused_total,
        memory,
    )
    return '<tr data-testid="replica">' + "".join(f"<td>{e(c)}</td>" for c in cells) + "</tr>"


async def _ask(client: AsyncClient) -> QueryStatus | LakeError:
    try:
        return await asyncio.wait_for(replica_status(client), STATUS_TIMEOUT_S)
    except LakeError as exc:
        return exc
    except TimeoutError:
        return DeadlineExceeded(f"no status within {STATUS_TIMEOUT_S:.0f} s")


async def _ask_other(url: str, connect: Connect) -> QueryStatus | LakeError:
    try:
        async with connect(url) as client:
            return await _ask(client)
    except LakeError as exc:
        return exc


async def cluster_body(
    client: AsyncClient, query_url: str, replicas: Sequence[str], connect: Connect
) -> str:
    """The Cluster page's table: the console's own Query first, then each other replica."""
    answers = await asyncio.gather(_ask(client), *(_ask_other(url, connect) for url in replicas))
    head = "".join(f"<th>{e(c)}</th>" for c in COLUMNS)
    rows = "".join(
        _row(url, answer) for url, answer in zip([query_url, *replicas], answers, strict=True)
    )
    return (
        f'<table class="grid" data-testid="cluster"><thead><tr>{head}</tr></thead>'
        f"<tbody>{rows}</tbody></table>"
    )
