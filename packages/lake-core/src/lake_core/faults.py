"""Test-only fault points: the one place where a Lake process crashes, stops or shrinks on purpose.

Fault-injection tests arm named points through one environment variable,
:data:`FAULTS` (``LAKE_FAULTS``), read once when the process starts (the
first call of :func:`active`, or :func:`configure`). Unset or empty,
nothing is armed and every hook is a no-op call::

    LAKE_FAULTS = entry ("," entry)*
    entry       = point                    crash or stop there
                | setting "=" integer      a test-only size

    LAKE_FAULTS=meta.before_lance_commit
    LAKE_FAULTS=meta.stop_before_head_update,meta.lease_ttl_ms=2000

Crash points exit the process at once with :data:`CRASH_EXIT_CODE` (137,
as SIGKILL would), from whichever thread reaches them; no ``finally``
block, ``atexit`` hook or event-loop callback runs, exactly like a kill.
Stop points send the process SIGSTOP the first time they are reached (a
paused node, for fencing tests). Settings replace a size that is too big
for a test. An unknown name or an out-of-range value is a
:class:`~lake_core.errors.ConfigError` naming ``LAKE_FAULTS``, so a typo
fails at startup instead of silently testing nothing. A server started with
anything armed logs a warning naming every armed point and setting before it
listens (:mod:`lake_core.startup`), so an armed process is never mistaken
for a production one.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from lake_core.config import FAULTS
from lake_core.errors import ConfigError

__all__ = [
    "AFTER_APPEND_COMMIT",
    "AFTER_LANCE_COMMIT",
    "AFTER_LANCE_WRITE",
    "AFTER_PENDING_WRITE",
    "AFTER_REGISTRY_COMMIT",
    "ASYNC_AFTER_PART",
    "ASYNC_FAIL_PART",
    "ASYNC_LEASE_MS",
    "ASYNC_PART_BYTES",
    "ASYNC_RESULT_BYTES",
    "BEFORE_LANCE_COMMIT",
    "COMMIT_GROUP_GATHER",
    "CRASH_EXIT_CODE",
    "CRASH_POINTS",
    "FAULTS",
    "GC_AFTER_APPLY_PAGE",
    "LEASE_TTL_MS",
    "LEROBOT_AFTER_VIDEO_UPLOAD",
    "QUERY_PLAN_DELAY_MS",
    "SETTINGS",
    "STOP_BEFORE_HEAD_UPDATE",
    "STOP_POINTS",
    "UPLOAD_PART_SIZE",
    "Faults",
    "active",
    "configure",
    "crash",
    "setting",
    "stop",
]

#: What a crash point exits with: the code a SIGKILL'd process reports (128 + 9).
CRASH_EXIT_CODE = 137

# -- crash points ----------------------------------------------------------------
#: Metasrv: a group of appends is staged, its sidecars and Lance commits not started.
BEFORE_LANCE_COMMIT = "meta.before_lance_commit"
#: Metasrv: the Lance versions are committed, the registry has not moved.
AFTER_LANCE_COMMIT = "meta.after_lance_commit"
#: Metasrv: the registry moved (visible), the client has no reply yet.
AFTER_REGISTRY_COMMIT = "meta.after_registry_commit"
#: Metasrv maintenance: Lance wrote a compacted or indexed version, the registry has not moved.
AFTER_LANCE_WRITE = "meta.maintenance_after_lance_write"
#: SDK: the pending-append file is durable, the append RPC not sent.
AFTER_PENDING_WRITE = "sdk.after_pending_write"
#: SDK: the append committed, its pending file not yet removed.
AFTER_APPEND_COMMIT = "sdk.after_append_commit"
#: SDK import_lerobot: an MP4 is uploaded and recorded in the import journal.
LEROBOT_AFTER_VIDEO_UPLOAD = "sdk.lerobot_after_video_upload"
#: GC apply: a page of candidates is deleted and its checkpoint fsync'd.
GC_AFTER_APPLY_PAGE = "gc.after_apply_page"
#: Query async worker: one result part is stored, the manifest not written.
ASYNC_AFTER_PART = "query.async_after_part"
CRASH_POINTS = frozenset(
    {
        ASYNC_AFTER_PART,
        BEFORE_LANCE_COMMIT,
        AFTER_LANCE_COMMIT,
        AFTER_REGISTRY_COMMIT,
        AFTER_LANCE_WRITE,
        AFTER_PENDING_WRITE,
        AFTER_APPEND_COMMIT,
        GC_AFTER_APPLY_PAGE,
        LEROBOT_AFTER_VIDEO_UPLOAD,
    }
)

# -- stop points -----------------------------------------------------------------
#: Cloud registry: the lease was checked, the head update (visibility point) not sent.
STOP_BEFORE_HEAD_UPDATE = "meta.stop_before_head_update"
STOP_POINTS = frozenset({STOP_BEFORE_HEAD_UPDATE})

# -- settings --------------------------------------------------------------------
#: Metasrv's leader lease in ms, so fencing tests need not wait out 10 s.
LEASE_TTL_MS = "meta.lease_ttl_ms"
#: S3 multipart part size of new uploads; only 5 MiB (S3's minimum) is accepted.
UPLOAD_PART_SIZE = "objects.upload_part_size"
#: Query async jobs: the lease a worker renews, in ms (reclaim tests need not wait long).
ASYNC_LEASE_MS = "query.async_lease_ms"
#: Query async jobs: the part ceiling in bytes (64 MiB in production), for multi-part tests.
ASYNC_PART_BYTES = "query.async_part_bytes"
#: Query async jobs: the byte ceiling new jobs persist, below LAKE_ASYNC_MAX_RESULT_BYTES' floor.
ASYNC_RESULT_BYTES = "query.async_result_bytes"
#: Query async jobs: the Nth result part this process starts storing fails midway, once,
#: as object storage refusing it would (UNAVAILABLE, retryable).
ASYNC_FAIL_PART = "query.async_fail_part"
#: Query: every statement's planning first sleeps this many ms (a stuck planner, for
#: the planning deadline and health tests).
QUERY_PLAN_DELAY_MS = "query.plan_delay_ms"
#: Metasrv: a table's committer waits (up to 10 s) until this many appends are
#: queued before it takes a group, so crash tests know the group a crash hits.
COMMIT_GROUP_GATHER = "meta.commit_group_gather"
#: Each setting's inclusive range.
SETTINGS: Mapping[str, tuple[int, int]] = {
    COMMIT_GROUP_GATHER: (2, 1024),
    ASYNC_LEASE_MS: (300, 600_000),
    ASYNC_PART_BYTES: (4096, 64 * 1024 * 1024),
    ASYNC_RESULT_BYTES: (1024, 64 * 1024 * 1024),
    ASYNC_FAIL_PART: (1, 10_000),
    LEASE_TTL_MS: (500, 600_000),
    QUERY_PLAN_DELAY_MS: (1, 600_000),
    UPLOAD_PART_SIZE: (5 * 1024 * 1024, 5 * 1024 * 1024),
}


@dataclass(frozen=True)
class Faults:
    """The armed points and settings of one process (nothing armed by default)."""

    points: frozenset[str] = frozenset()
    settings: Mapping[str, int] = field(default_factory=dict)
    #: Stop points already reached (each stops the process once).
    _stopped: set[str] = field(default_factory=set, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    @classmethod
    def parse(cls, text: str) -> Faults:
        """Parse a :data:`FAULTS` value; raise ConfigError naming it."""
        points: set[str] = set()
        settings: dict[str, int] = {}
        for raw in text.split(","):
            entry = raw.strip()
            if not entry:
                continue
            name, sep, value = (part.strip() for part in entry.partition("="))
            if not sep:
                if name not in CRASH_POINTS | STOP_POINTS:
                    known = ", ".join(sorted(CRASH_POINTS | STOP_POINTS))
                    raise ConfigError(f"{FAULTS}: unknown fault point {name[:80]!r} ({known})")
                points.add(name)
                continue
            if name not in SETTINGS:
                known = ", ".join(sorted(SETTINGS))
                raise ConfigError(f"{FAULTS}: unknown setting {name[:80]!r} ({known})")
            low, high = SETTINGS[name]
            if not value.isdigit() or not low <= int(value) <= high:
                raise ConfigError(
                    f"{FAULTS}: {name} must be an integer in {low}..={high}, got {value[:40]!r}"
                )
            settings[name] = int(value)
        return cls(frozenset(points), settings)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Faults:
        return cls.parse(env.get(FAULTS, ""))

    @property
    def armed(self) -> bool:
        return bool(self.points or self.settings)

    def crash(self, point: str) -> None:
        """Exit the process now (code 137) if ``point`` is armed; otherwise nothing."""
        if point not in self.points:
            return
        # Straight to stderr: a logger may buffer or hand off to a thread that never runs.
        print(f"lake fault point reached: {point} (exit {CRASH_EXIT_CODE})", file=sys.stderr)
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)

    def stop(self, point: str) -> None:
        """SIGSTOP this process the first time ``point`` is reached, if it is armed."""
        if point not in self.points:
            return
        with self._lock:
            if point in self._stopped:
                return
            self._stopped.add(point)
        print(f"lake fault point reached: {point} (SIGSTOP)", file=sys.stderr)
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSTOP)

    def setting(self, name: str) -> int | None:
        """The armed test value of setting ``name``, or None (use the real default)."""
        return self.settings.get(name)


class _Process:
    """This process's faults, read from the environment once (tests may re-read)."""

    faults: Faults | None = None


_process = _Process()


def configure(env: Mapping[str, str] | None = None) -> Faults:
    """Read :data:`FAULTS` (from ``env``, default ``os.environ``) as this process's faults.

    Servers call this once at startup so a bad value fails before they listen;
    in-process tests call it again after changing the environment.
    """
    faults = Faults.from_env(os.environ if env is None else env)
    _process.faults = faults
    return faults


def active() -> Faults:
    """This process's faults (read from the environment on first use)."""
    faults = _process.faults
    return faults if faults is not None else configure()


def crash(point: str) -> None:
    """:meth:`Faults.crash` on this process's faults."""
    active().crash(point)


def stop(point: str) -> None:
    """:meth:`Faults.stop` on this process's faults."""
    active().stop(point)


def setting(name: str) -> int | None:
    """:meth:`Faults.setting` on this process's faults."""
    return active().setting(name)
