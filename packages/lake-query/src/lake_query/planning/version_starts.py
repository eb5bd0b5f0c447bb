"""Where a time-travel walk starts: at the version selected, not at the head.

A selector (``t@v3``, ``t@<instant>``) is resolved by walking the table's
Lance history back from a version (:func:`lake_query.planning.versions.history`),
one manifest and one transaction file a step. From the head, a version
thousands of versions back costs thousands of reads, and a fleet's table
retains tens of thousands (docs/time-travel.md). Metasrv's registry records
every committed version with its Lance version and commit time, so in about
log2(versions) point reads it names a version at, or just after, the one
wanted, and the walk starts there:

- ``@v<N>``: version N itself (its newest Lance version): the walk's first step.
- ``@<instant>``: the oldest version the registry records as committed more
  than :data:`MARGIN_MS` after the instant. Metasrv takes that time just
  after Lance's commit, on the clock Lance stamps its commit with, and the
  next version commits after it: every Lance version committed at or before
  the instant lies at or below that start. The walk then compares Lance's own
  commit times as it does from the head. The margin covers a step of the
  clock, or a new Metasrv leader's clock a little behind the last one's.

The walk decides; the registry only shortens it. When it cannot help (a
Metasrv older than this replica, Metasrv unavailable, a record not written
yet), the walk starts at the head as before: slower, never different.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import structlog

from lake_core import protocol
from lake_core.errors import InvalidArgument, LakeError, Unimplemented
from lake_core.models import TableDescriptor
from lake_core.names import TableRef
from lake_query.planning.meta_calls import on_loop, result_within
from lake_query.planning.versions import TableName

__all__ = ["MARGIN_MS", "NEAR_HEAD", "MetaVersionStarts"]

log = structlog.get_logger("lake_query.planning")

#: How far after an instant a walk starts (see the module's docstring).
MARGIN_MS: Final = 2_000
#: A version this close to the head is walked to directly (a few reads cost less than a call).
NEAR_HEAD: Final = 4
#: The longest a plan waits for Metasrv before walking from the head.
TIMEOUT_S: Final = 5.0


class MetaVersionStarts:
    """Asks Metasrv where to start a walk, from a planning thread, through the replica's client."""

    def __init__(
        self, meta: Any, loop: asyncio.AbstractEventLoop, timeout_s: float = TIMEOUT_S
    ) -> None:
        self._meta = meta
        self._loop = loop
        self._timeout_s = timeout_s
        #: False once Metasrv said it does not know the action (a rolling upgrade).
        self._known = True

    def __call__(
        self, table: TableRef, head: TableDescriptor, wanted: TableName
    ) -> TableDescriptor | None:
        """A version at or after the one ``wanted`` selects, older than ``head``; None: the head."""
        request = self._request(table, head, wanted)
        if request is None or not self._known:
            return None
        found = self._ask(request)
        if found is None or found.version is None or found.engine_version is None:
            return None
        if found.version >= head.version or found.engine_version > head.engine_version:
            return None  # no shorter than from the head (or newer than the pin)
        return head.model_copy(
            update={"version": found.version, "engine_version": found.engine_version}
        )

    @staticmethod
    def _request(
        table: TableRef, head: TableDescriptor, wanted: TableName
    ) -> protocol.TableVersionRequest | None:
        common = {"table": table, "incarnation": head.incarnation, "newest": head.version}
        if wanted.version is not None:
            if head.version - wanted.version <= NEAR_HEAD or wanted.version > head.version:
                return None
            return protocol.TableVersionRequest(**common, version=wanted.version)
        if wanted.instant is None:
            return None
        after_ms = int(wanted.instant.timestamp() * 1000) + MARGIN_MS
        if after_ms < 0:
            return None  # before 1970: the walk says the table did not exist then
        return protocol.TableVersionRequest(**common, after_ms=after_ms)

    def _ask(self, request: protocol.TableVersionRequest) -> protocol.TableVersionResult | None:
        if on_loop(self._loop):
            return None  # waiting here would deadlock the loop the call needs
        call = self._meta.action(protocol.TABLE_VERSION, request, protocol.TableVersionResult)
        try:
            result: protocol.TableVersionResult = result_within(self._loop, call, self._timeout_s)
        except (Unimplemented, InvalidArgument):
            log.info("Metasrv names no version to start a walk from; walking from heads")
            self._known = False
            return None
        except (LakeError, TimeoutError) as exc:
            log.info("no start for a time-travel walk; walking from the head", error=repr(exc))
            return None
        return result
