"""The series Lake's own components record (docs/operations.md lists them all).

Each is a module-level object built with :mod:`lake_core.telemetry.metrics`;
a component imports the ones it records. Labels are closed sets only.
"""

from __future__ import annotations

import functools

from lake_core.telemetry.metrics import STATUS_CODES, counter, gauge, histogram

__all__ = [
    "ADMISSION_QUEUED",
    "ADMISSION_REFUSED",
    "ADMISSION_RUNNING",
    "ADMISSION_STALLED",
    "ADMISSION_TIMED_OUT",
    "ADMITTED",
    "CATALOG_LOOKUPS",
    "CATALOG_REFRESHES",
    "COMMITS",
    "COMMIT_GROUP_SIZE",
    "COMMIT_SECONDS",
    "ICEBERG_FEDERATION",
    "LEADER",
    "LEADER_CHANGES",
    "LEASE_EPOCH",
    "MAINTENANCE_RUNS",
    "QUERY_MEMORY_RESERVED",
    "QUERY_VERIFIED_AHEAD",
    "QUERY_VERIFIED_BYTES",
    "QUERY_VERIFIED_FILES",
    "REGISTRAR_PASSES",
    "REGISTRAR_SEGMENTS",
    "RPC_IN_FLIGHT",
    "RPC_METHODS",
    "RPC_SECONDS",
    "RPC_SERVICES",
    "SCAN_CACHE_BYTES",
    "SCAN_CACHE_ENTRIES",
    "SCAN_CACHE_EVICTIONS",
    "SCAN_CACHE_FILLS",
    "SCAN_CACHE_LOOKUPS",
    "STAGE_MINTS",
    "STREAMED_BYTES",
    "STREAMED_ROWS",
    "VERIFY_RUNS",
    "rpc_labels",
]

# -- every RPC (lake_core.flight.server) ----------------------------------------------

RPC_SERVICES = ("flight", "health", "other")
RPC_METHODS = (
    "Handshake",
    "ListFlights",
    "GetFlightInfo",
    "PollFlightInfo",
    "GetSchema",
    "DoGet",
    "DoPut",
    "DoExchange",
    "DoAction",
    "ListActions",
    "Check",
    "Watch",
    "other",
)
RPC_SECONDS = histogram(
    "lake_rpc_duration_seconds",
    "Server RPCs by service, method and final gRPC status code; _count is the RPC count.",
    {"service": RPC_SERVICES, "method": RPC_METHODS, "code": STATUS_CODES},
)
RPC_IN_FLIGHT = gauge("lake_rpc_in_flight", "Counted RPCs running now (Health excluded).")

_SERVICES = {
    "arrow.flight.protocol.FlightService": "flight",
    "grpc.health.v1.Health": "health",
}
_METHODS = frozenset(RPC_METHODS)


@functools.lru_cache(maxsize=256)  # grpc routes only registered methods: a bounded set
def rpc_labels(full_method: str) -> tuple[str, str]:
    """``(service, method)`` labels of ``/package.Service/Method``, unknowns as ``other``."""
    _, _, rest = full_method.partition("/")
    service, _, method = rest.partition("/")
    return _SERVICES.get(service, "other"), method if method in _METHODS else "other"


# -- Query: admission and results (lake_query) ------------------------------------------

ADMISSION_RUNNING = gauge("lake_query_admission_running", "Queries holding an admission permit.")
ADMISSION_QUEUED = gauge("lake_query_admission_queued", "Queries waiting in the global FIFO.")
ADMITTED = counter("lake_query_admitted_total", "Queries admitted.")
QUERY_MEMORY_RESERVED = gauge(
    "lake_query_memory_reserved_bytes",
    "Query memory (LAKE_QUERY_MEMORY_LIMIT_BYTES) the replica's running queries hold.",
)
ADMISSION_REFUSED = counter(
    "lake_query_admission_refused_total",
    "Queries refused at admission, by the gate that refused them (memory: the replica's "
    "query memory; tenant_memory: the tenant's share of it).",
    {"gate": ("tracker", "tenant", "global", "memory", "tenant_memory")},
)
ADMISSION_STALLED = counter(
    "lake_query_admission_stalled_total", "Queries ended because the client stopped reading."
)
ADMISSION_TIMED_OUT = counter(
    "lake_query_admission_timed_out_total", "Queries ended by the execution timeout."
)
STREAMED_ROWS = counter("lake_query_rows_streamed_total", "Result rows sent by DoGet.")
STREAMED_BYTES = counter("lake_query_bytes_streamed_total", "Encoded result bytes sent by DoGet.")

ICEBERG_FEDERATION = counter(
    "lake_query_iceberg_federation_events_total",
    "Iceberg federation: snapshot cache hits and misses, failed catalog loads, OAuth "
    "token renewals (no namespace, table, endpoint or principal label).",
    {"event": ("cache_hit", "cache_miss", "load_failure", "oauth_renewal")},
)
CATALOG_LOOKUPS = counter(
    "lake_query_catalog_cache_lookups_total",
    "Catalog cache lookups of a table by result.",
    {"result": ("hit", "miss")},
)
CATALOG_REFRESHES = counter(
    "lake_query_catalog_snapshot_refreshes_total",
    "Catalog snapshot fetches from Metasrv by outcome.",
    {"outcome": ("changed", "not_modified", "failed")},
)
SCAN_CACHE_LOOKUPS = counter(
    "lake_query_scan_cache_lookups_total",
    "Plain scans of a pinned version looked up in the scan cache, by result.",
    {"result": ("hit", "miss")},
)
SCAN_CACHE_FILLS = counter(
    "lake_query_scan_cache_fills_total",
    "Scans the cache tried to keep, by outcome (too_large: larger than the cache; no_room: "
    "the room was held by other scans; abandoned: the stream ended early or failed).",
    {"outcome": ("admitted", "too_large", "no_room", "abandoned")},
)
SCAN_CACHE_EVICTIONS = counter(
    "lake_query_scan_cache_evictions_total", "Scans evicted from the scan cache for room."
)
SCAN_CACHE_BYTES = gauge(
    "lake_query_scan_cache_bytes",
    "Bytes the scan cache holds: kept scans and scans being kept while they stream.",
)
SCAN_CACHE_ENTRIES = gauge("lake_query_scan_cache_entries", "Scans kept in the scan cache.")
STAGE_MINTS = counter(
    "lake_query_stage_mints_total",
    "Object-stage answers: stage discoveries and read-capability mints.",
    {"kind": ("discovery", "read_capability"), "outcome": ("ok", "failed")},
)
VERIFY_RUNS = counter(
    "lake_verify_runs_total",
    "Data-file verification runs (verify-on-open checks and verify-table).",
    {"outcome": ("ok", "mismatch", "failed")},
)
QUERY_VERIFIED_FILES = counter(
    "lake_query_verified_files_total",
    "Data files this Query replica read and hashed before serving rows from them "
    "(verify-on-open), by outcome.",
    {"outcome": ("ok", "mismatch", "unrecorded")},
)
QUERY_VERIFIED_BYTES = counter(
    "lake_query_verified_bytes_total",
    "Bytes of data files this Query replica read and hashed for verify-on-open.",
)
QUERY_VERIFIED_AHEAD = counter(
    "lake_query_verified_ahead_total",
    "New versions of recently read tables this Query replica opened and verified "
    "before a query asked for them, by outcome (failed: left for the query to report).",
    {"outcome": ("ok", "failed")},
)

# -- Metasrv: commits, leadership, maintenance (lake_metasrv) -----------------------------

COMMIT_OUTCOMES = ("committed", "replayed", "conflicted", "fenced", "failed")
COMMITS = counter("lake_metasrv_commits_total", "Appends by outcome.", {"outcome": COMMIT_OUTCOMES})
COMMIT_SECONDS = histogram(
    "lake_metasrv_commit_duration_seconds",
    "Append latency inside Metasrv, arrival to outcome.",
    {"outcome": COMMIT_OUTCOMES},
)
COMMIT_GROUP_SIZE = histogram(
    "lake_metasrv_commit_group_size",
    "Appends committed together as one table version (a commit group).",
    buckets=(1, 2, 4, 8, 16, 32, 64),
)
LEADER = gauge("lake_metasrv_leader", "1 while this node leads (cloud mode; 1 in local mode).")
LEASE_EPOCH = gauge("lake_metasrv_lease_epoch", "The highest lease epoch this node has seen.")
LEADER_CHANGES = counter(
    "lake_metasrv_leadership_changes_total",
    "Leadership events of this node.",
    {"event": ("acquired", "ready", "lost", "resigned")},
)
MAINTENANCE_RUNS = counter(
    "lake_metasrv_maintenance_runs_total",
    "Compaction and index runs by kind and outcome.",
    {"kind": ("compact", "index"), "outcome": ("ok", "failed")},
)

# -- the Iceberg registrar (lake_iceberg) ------------------------------------------------

REGISTRAR_SEGMENTS = counter(
    "lake_registrar_segments_total",
    "Shipped segments the registrar looked at, by outcome.",
    {"outcome": ("registered", "skipped", "refused")},
)
REGISTRAR_PASSES = counter(
    "lake_registrar_passes_total",
    "Registrar passes over the pending segments, by outcome.",
    {"outcome": ("ok", "failed")},
)
