"""How fresh the catalog view a statement is planned on must be.

Before GetFlightInfo, PollFlightInfo, GetSchema or CreatePreparedStatement
plans a statement, the replica's view must be

- no older than its freshness bound, ``LAKE_QUERY_CATALOG_REFRESH_MS``
  (the background refresh normally keeps it so; a refresh that fell behind
  under load is caught up here), and
- at or past every version the client says it committed
  (:mod:`lake_core.min_versions`), so a client reads its own appends on a
  replica that did not forward them.

Either way it costs one conditional ``catalog_snapshot`` RPC, shared by
every request waiting at the same moment. A stale view whose refresh fails
is still planned on (retention keeps versions for a while, and a reclaimed
head is refreshed again at planning). A client's committed version is worth
waiting for: a failed refresh is tried again, backing off, until the
caller's timeout (Metasrv's leader takeover takes a few seconds, and a read
that waits it out beats a refusal every client must retry); only then is it
Unavailable: retry, rather than a silent stale read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import structlog

from lake_core.errors import Unavailable
from lake_core.min_versions import MIN_VERSIONS_HEADER, parse_min_versions
from lake_core.names import TableRef
from lake_core.principal import Principal
from lake_query.planning.catalog_cache import CatalogCache

__all__ = ["MAX_REPLANS", "behind", "catch_up", "min_versions"]

log = structlog.get_logger("lake_query.freshness")

#: First and longest pause between refreshes tried again for a client's committed version.
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 1.0
#: Plans after the first when planning meets a head version retention reclaimed:
#: each follows one catalog refresh that moved the view (else the error stands).
MAX_REPLANS = 2


def min_versions(context: Any) -> dict[TableRef, int]:
    """The ``lake-min-versions`` a call sent (InvalidArgument if malformed)."""
    metadata = context.invocation_metadata() if context is not None else None
    values = [str(v) for k, v in metadata or () if k == MIN_VERSIONS_HEADER]
    return parse_min_versions(",".join(values) if values else None)


def behind(cache: CatalogCache, wanted: Mapping[TableRef, int], principal: Principal) -> list[str]:
    """The tables of ``wanted`` (that ``principal`` may see) this view has older than asked."""
    late = []
    for table, version in wanted.items():
        if not principal.may_see(table.namespace):
            continue
        entry = cache.entry(table)
        if entry is None or entry.descriptor.version < version:
            late.append(str(table))
    return late


async def catch_up(
    cache: CatalogCache,
    wanted: Mapping[TableRef, int],
    principal: Principal,
    timeout_s: float,
) -> None:
    """Refresh ``cache`` if it is staler than its bound or behind ``wanted``.

    Behind ``wanted``: refreshes are tried until one succeeds or
    ``timeout_s`` has passed (then Unavailable). Only stale: one try, and a
    failure is logged and planned past.
    """
    late = behind(cache, wanted, principal)
    if not late and not cache.stale(cache.interval_s):
        return
    if not late:
        try:
            await asyncio.wait_for(cache.refresh(), timeout_s)
        except Exception as exc:
            log.warning("catalog refresh before planning failed", error=str(exc))
        return
    await _refresh_until(cache, late, timeout_s)
    still = behind(cache, wanted, principal)
    if still:
        # The table was dropped and recreated (its versions restarted), or Metasrv
        # answered from a snapshot older than the commit: plan on what it has.
        log.info("planning below a client's committed version", tables=still[:4])


async def _refresh_until(cache: CatalogCache, late: list[str], timeout_s: float) -> None:
    """One successful refresh within ``timeout_s``, backing off between failures."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    pause = RETRY_FIRST_S
    tries = 0
    while True:
        tries += 1
        try:
            await asyncio.wait_for(cache.refresh(), max(deadline - loop.time(), 0.0))
        except Exception as exc:
            remaining = deadline - loop.time()
            if remaining <= RETRY_FIRST_S:  # no time left for another try
                raise Unavailable(
                    f"this Query replica could not confirm the versions you committed "
                    f"({', '.join(late[:4])}): the catalog could not be refreshed "
                    f"({tries} tries in {timeout_s:g} s); retry"
                ) from None
            log.info("catalog refresh for committed versions failed; trying again", error=str(exc))
            await asyncio.sleep(min(pause, remaining - RETRY_FIRST_S))
            pause = min(pause * 2, RETRY_MAX_S)
        else:
            if tries > 1:
                log.info("catalog refreshed for committed versions", tries=tries)
            return
