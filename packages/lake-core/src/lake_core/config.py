"""Every ``LAKE_*`` environment variable Lake reads: one documented constant each.

Each constant is an :class:`EnvVar`, a ``str`` (its name, so
``env.get(QUERY_TICKET_TTL_SECS)`` reads it) that also carries its default,
range, owner and meaning. The modules that parse a variable import its name
from here; no other module spells a ``LAKE_*`` name. ``docs/configuration.md``
is generated from this module (``python -m tools.codegen.configuration``) and a
test keeps the two, and the code, in sync.

Processes parse their whole configuration before opening storage or binding
a listener, so a bad value fails startup without side effects.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator, Mapping

from lake_core.errors import ConfigError

__all__ = [
    "ALLOW_INSECURE",
    "APPEND_OPERATION_RETENTION_SECS",
    "ASYNC_DYNAMODB_TABLE",
    "ASYNC_EXECUTION_TIMEOUT_MS",
    "ASYNC_GLOBAL_WORKER_CONCURRENCY",
    "ASYNC_GLOBAL_WORKER_CONCURRENCY_PER_TENANT",
    "ASYNC_MAX_OUTSTANDING_PER_TENANT",
    "ASYNC_MAX_RESULT_BYTES",
    "ASYNC_QUERIES",
    "ASYNC_RESULT_PREFIX",
    "ASYNC_WORKER_CONCURRENCY",
    "ASYNC_WORKER_CONCURRENCY_PER_TENANT",
    "AUTH_PRINCIPALS_FILE",
    "AUTH_TOKEN_FILE",
    "CLOUD_MODE",
    "COMMIT_GROUP_MAX_APPENDS",
    "COMMIT_GROUP_MAX_ROWS",
    "COMPACTION",
    "DEFAULT_OPERATION_RETENTION_SECS",
    "DYNAMODB_TABLE",
    "FAULTS",
    "ICEBERG_LOCATION",
    "ICEBERG_NAMESPACES",
    "ICEBERG_REST_CREDENTIAL",
    "ICEBERG_REST_ENDPOINT",
    "ICEBERG_REST_OAUTH2_SERVER_URI",
    "ICEBERG_REST_OAUTH_AUDIENCE",
    "ICEBERG_REST_OAUTH_RESOURCE",
    "ICEBERG_REST_OAUTH_SCOPE",
    "ICEBERG_REST_TIMEOUT_MS",
    "ICEBERG_REST_TOKEN",
    "ICEBERG_S3_ANONYMOUS",
    "ICEBERG_S3_ENDPOINT",
    "ICEBERG_S3_PATH_STYLE",
    "ICEBERG_S3_REGION",
    "ICEBERG_S3_TIMEOUT_MS",
    "ICEBERG_WAREHOUSE",
    "INGEST_MAX_BYTES",
    "INGEST_MAX_ROWS",
    "LANCE_RETAIN_MIN_AGE_SECS",
    "LANCE_RETAIN_VERSIONS",
    "LOG_FORMAT",
    "LOG_LEVEL",
    "MANAGED_OBJECT_PREFIX",
    "MANAGED_OBJECT_ROOT",
    "MANIFEST_DYNAMODB_TABLE",
    "MAX_OPERATION_RETENTION_SECS",
    "METADATA_AUTH_TOKEN_FILE",
    "METADATA_CA_FILE",
    "METADATA_SERVER_NAME",
    "METRICS_ADDR",
    "NO_PROGRESS",
    "PEER_ADVERTISE_URL",
    "PEER_AUTH_TOKEN_FILE",
    "PEER_CA_FILE",
    "PEER_SERVER_NAME",
    "QUERY_CATALOG_REFRESH_MS",
    "QUERY_DATA_ADDR",
    "QUERY_DATA_ADVERTISE",
    "QUERY_EXECUTION_TIMEOUT_MS",
    "QUERY_MAX_CONCURRENT",
    "QUERY_MAX_CONCURRENT_PER_TENANT",
    "QUERY_MAX_ENDPOINTS",
    "QUERY_MAX_EXPRESSION_TERMS",
    "QUERY_MAX_FUNCTION_OUTPUT_BYTES",
    "QUERY_MAX_NESTING_DEPTH",
    "QUERY_MAX_PLAN_DEPTH",
    "QUERY_MAX_QUERY_BLOCKS",
    "QUERY_MAX_SQL_BYTES",
    "QUERY_MAX_TRACKED_TENANTS",
    "QUERY_MEMORY_LIMIT_BYTES",
    "QUERY_MEMORY_POOLS_PER_TENANT",
    "QUERY_MIN_ENDPOINT_ROWS",
    "QUERY_PLANNING_THREADS",
    "QUERY_PLANNING_THREADS_PER_TENANT",
    "QUERY_PLANNING_TIMEOUT_MS",
    "QUERY_QUEUE_TIMEOUT_MS",
    "QUERY_SCAN_CACHE_BYTES",
    "QUERY_STALL_TIMEOUT_MS",
    "QUERY_TICKET_AUDIENCE",
    "QUERY_TICKET_KEYS_FILE",
    "QUERY_TICKET_TTL_SECS",
    "QUERY_VERIFY_ON_OPEN",
    "S3_BUCKET",
    "SHUTDOWN_GRACE_MS",
    "STORAGE_TIMEOUT_MS",
    "TABLE_PREFIX",
    "TLS_CERT_FILE",
    "TLS_KEY_FILE",
    "EnvVar",
    "all_variables",
    "env_int",
    "is_loopback_address",
    "operation_retention_secs",
]

#: Who reads a variable (the column "owner" of docs/configuration.md).
QUERY = "lake query"
METASRV = "lake meta"
SERVERS = "lake query, lake meta"
TESTS = "tests only"


class EnvVar(str):
    """The name of one ``LAKE_*`` variable, with what the docs say of it."""

    default: str
    range: str
    owner: str
    doc: str

    def __new__(
        cls, name: str, *, doc: str, owner: str, default: str = "unset", range: str = ""
    ) -> EnvVar:
        if not name.startswith("LAKE_") or not name.replace("_", "").isalnum():
            raise ValueError(f"not a LAKE_* variable name: {name!r}")
        var = super().__new__(cls, name)
        var.default = default
        var.range = range
        var.owner = owner
        var.doc = doc
        return var

    @property
    def name(self) -> str:
        return str.__str__(self)


# -- listeners and security -------------------------------------------------

SHUTDOWN_GRACE_MS = EnvVar(
    "LAKE_SHUTDOWN_GRACE_MS",
    doc="Drain window after SIGINT/SIGTERM before in-flight RPCs are cut off.",
    owner=SERVERS,
    default="30000",
    range="positive integer, milliseconds",
)
AUTH_PRINCIPALS_FILE = EnvVar(
    "LAKE_AUTH_PRINCIPALS_FILE",
    doc="JSON map of bearer tokens to principals (0600 regular file); exclusive with "
    "LAKE_AUTH_TOKEN_FILE. Required, or the token file, on a non-loopback listener.",
    owner=SERVERS,
    range="path",
)
AUTH_TOKEN_FILE = EnvVar(
    "LAKE_AUTH_TOKEN_FILE",
    doc="One deployment-admin bearer token (0600 file); exclusive with the principals map.",
    owner=SERVERS,
    range="path",
)
TLS_CERT_FILE = EnvVar(
    "LAKE_TLS_CERT_FILE",
    doc="The server's certificate chain (PEM); set together with LAKE_TLS_KEY_FILE. "
    "Required on a non-loopback listener unless LAKE_ALLOW_INSECURE=true.",
    owner=SERVERS,
    range="path",
)
TLS_KEY_FILE = EnvVar(
    "LAKE_TLS_KEY_FILE",
    doc="The server's private key (PEM, 0600 file); set together with LAKE_TLS_CERT_FILE.",
    owner=SERVERS,
    range="path",
)
ALLOW_INSECURE = EnvVar(
    "LAKE_ALLOW_INSECURE",
    doc="Allows a plaintext non-loopback listener (and internal plaintext clients) behind "
    "a trusted TLS-terminating mesh.",
    owner=SERVERS,
    default="false",
    range="true/false",
)
METADATA_AUTH_TOKEN_FILE = EnvVar(
    "LAKE_METADATA_AUTH_TOKEN_FILE",
    doc="Query's client token for Metasrv (its query_service binding there); also the "
    "token of `lake client` admin commands.",
    owner="lake query, lake client",
    range="path",
)
METADATA_CA_FILE = EnvVar(
    "LAKE_METADATA_CA_FILE",
    doc="CA bundle (PEM) that Query and `lake client` use to verify Metasrv.",
    owner="lake query, lake client",
    range="path",
)
METADATA_SERVER_NAME = EnvVar(
    "LAKE_METADATA_SERVER_NAME",
    doc="The name Metasrv's certificate must carry, when not the dialled host.",
    owner="lake query, lake client",
    range="DNS name",
)
PEER_AUTH_TOKEN_FILE = EnvVar(
    "LAKE_PEER_AUTH_TOKEN_FILE",
    doc="A Metasrv follower's client token for its leader (a metadata_peer principal).",
    owner=METASRV,
    range="path",
)
PEER_CA_FILE = EnvVar(
    "LAKE_PEER_CA_FILE",
    doc="CA bundle (PEM) a Metasrv follower uses to verify its leader.",
    owner=METASRV,
    range="path",
)
PEER_SERVER_NAME = EnvVar(
    "LAKE_PEER_SERVER_NAME",
    doc="The name the leader's certificate must carry, when not the dialled host.",
    owner=METASRV,
    range="DNS name",
)
PEER_ADVERTISE_URL = EnvVar(
    "LAKE_PEER_ADVERTISE_URL",
    doc="The URL other Metasrv nodes forward writes to (cloud mode); required when "
    "--addr listens on every interface.",
    owner=METASRV,
    default="http(s)://<--addr>",
    range="http:// or https:// URL",
)

# -- tables, registry and storage ----------------------------------------------

LANCE_RETAIN_VERSIONS = EnvVar(
    "LAKE_LANCE_RETAIN_VERSIONS",
    doc="Table versions kept per table besides tagged ones; older ones are reclaimed once "
    "also past LAKE_LANCE_RETAIN_MIN_AGE_SECS.",
    owner=METASRV,
    default="10",
    range="1..=10000",
)
LANCE_RETAIN_MIN_AGE_SECS = EnvVar(
    "LAKE_LANCE_RETAIN_MIN_AGE_SECS",
    doc="How long a table version stays readable after a newer one replaced it, besides "
    "the LAKE_LANCE_RETAIN_VERSIONS window: a version is reclaimed only when it is outside "
    "both. Keep it above LAKE_QUERY_TICKET_TTL_SECS plus the catalog refresh "
    "(LAKE_QUERY_CATALOG_REFRESH_MS), so an old ticket still reads; 0 (tests) keeps "
    "only the count window.",
    owner=METASRV,
    default="900 (15 minutes)",
    range="0..=2592000, seconds",
)
APPEND_OPERATION_RETENTION_SECS = EnvVar(
    "LAKE_APPEND_OPERATION_RETENTION_SECS",
    doc="How long Metasrv remembers an append's operation id (a retry within it returns "
    "the original version; after it, OperationExpired).",
    owner=METASRV,
    default="604800 (7 days)",
    range="1..=315360000, seconds",
)
#: LAKE_APPEND_OPERATION_RETENTION_SECS: its default and its largest value.
DEFAULT_OPERATION_RETENTION_SECS = 7 * 24 * 3600
# Ten years: long enough for any deployment, short enough to stay a sane integer.
MAX_OPERATION_RETENTION_SECS = 10 * 365 * 24 * 3600


def operation_retention_secs(env: Mapping[str, str] | None = None) -> int:
    """How long an append's operation id may be replayed (Metasrv's setting; GC checks
    its safety age against it, since a resumed pending append references old uploads)."""
    return env_int(
        APPEND_OPERATION_RETENTION_SECS,
        DEFAULT_OPERATION_RETENTION_SECS,
        1,
        MAX_OPERATION_RETENTION_SECS,
        env,
    )


COMMIT_GROUP_MAX_APPENDS = EnvVar(
    "LAKE_COMMIT_GROUP_MAX_APPENDS",
    doc="Most concurrent appends to one table Metasrv commits together as one table "
    "version (a group is whatever queued while the previous commit ran; a lone append "
    "never waits).",
    owner=METASRV,
    default="64",
    range="1..=1024",
)
COMMIT_GROUP_MAX_ROWS = EnvVar(
    "LAKE_COMMIT_GROUP_MAX_ROWS",
    doc="Most rows one commit group holds (its small appends are written as one data "
    "file); an append larger than this is committed in a group of its own.",
    owner=METASRV,
    default="100000",
    range="1..=1048576",
)
INGEST_MAX_ROWS = EnvVar(
    "LAKE_INGEST_MAX_ROWS",
    doc="Rows one bulk ingest (Flight SQL CommandStatementIngest, client.ingest) may carry; "
    "a larger stream is refused before it commits (PayloadTooLarge) and leaves no version.",
    owner=METASRV,
    default="100000000",
    range="1..=10000000000",
)
INGEST_MAX_BYTES = EnvVar(
    "LAKE_INGEST_MAX_BYTES",
    doc="Encoded Arrow bytes one bulk ingest may carry; a larger stream is refused before "
    "it commits (PayloadTooLarge) and leaves no version.",
    owner=METASRV,
    default="68719476736 (64 GiB)",
    range="1048576..=17592186044416 (16 TiB)",
)
COMPACTION = EnvVar(
    "LAKE_COMPACTION",
    doc="Background compaction of tables with many small fragments.",
    owner=METASRV,
    default="on",
    range="on/off",
)
CLOUD_MODE = EnvVar(
    "LAKE_CLOUD_MODE",
    doc="Runs Metasrv on S3 + DynamoDB (leader-elected) instead of a local data directory.",
    owner=METASRV,
    default="false",
    range="true/false",
)
S3_BUCKET = EnvVar(
    "LAKE_S3_BUCKET",
    doc="The bucket of cloud tables and of the S3 managed object stage; exclusive with "
    "LAKE_MANAGED_OBJECT_ROOT.",
    owner="lake query, lake meta, lake gc",
    range="S3 bucket name",
)
TABLE_PREFIX = EnvVar(
    "LAKE_TABLE_PREFIX",
    doc="Key prefix of cloud tables inside the bucket: "
    "s3://$LAKE_S3_BUCKET/$LAKE_TABLE_PREFIX/<ns>/<table>.lance.",
    owner=METASRV,
    default="bucket root",
    range="/-separated segments, at most 512 characters",
)
DYNAMODB_TABLE = EnvVar(
    "LAKE_DYNAMODB_TABLE",
    doc="Metasrv's registry table (cloud mode).",
    owner="lake meta, lake gc",
    default="lake_registry",
    range="DynamoDB table name",
)
MANIFEST_DYNAMODB_TABLE = EnvVar(
    "LAKE_MANIFEST_DYNAMODB_TABLE",
    doc="Lance's manifest pointer table for s3:// tables; must differ from the registry table.",
    owner=SERVERS,
    default="lake_manifests",
    range="DynamoDB table name",
)
STORAGE_TIMEOUT_MS = EnvVar(
    "LAKE_STORAGE_TIMEOUT_MS",
    doc="Bound of one S3 request made through Lance.",
    owner=SERVERS,
    default="10000",
    range="100..=600000, milliseconds",
)
MANAGED_OBJECT_PREFIX = EnvVar(
    "LAKE_MANAGED_OBJECT_PREFIX",
    doc="Key prefix of the managed object stage inside LAKE_S3_BUCKET (/ means the bucket "
    "root); tenants get tenants/<tenant-id> below it.",
    owner=SERVERS,
    default="managed-objects",
    range="key prefix",
)
MANAGED_OBJECT_ROOT = EnvVar(
    "LAKE_MANAGED_OBJECT_ROOT",
    doc="A local directory holding the managed object stage.",
    owner=SERVERS,
    default="<data-dir>/objects",
    range="path",
)

# -- Query ---------------------------------------------------------------------

QUERY_TICKET_KEYS_FILE = EnvVar(
    "LAKE_QUERY_TICKET_KEYS_FILE",
    doc="Key ring (0600 JSON file) every Query replica shares to seal tickets; without it "
    "an ephemeral key is used, allowed only on a loopback listener.",
    owner=QUERY,
    range="path",
)
QUERY_TICKET_TTL_SECS = EnvVar(
    "LAKE_QUERY_TICKET_TTL_SECS",
    doc="Ticket lifetime.",
    owner=QUERY,
    default="300",
    range="1..=3600, seconds",
)
QUERY_TICKET_AUDIENCE = EnvVar(
    "LAKE_QUERY_TICKET_AUDIENCE",
    doc="The audience tickets are bound to: one value per Query fleet.",
    owner=QUERY,
    default="lake-query",
    range="1-128 characters of letters, digits and _.:/-",
)
QUERY_CATALOG_REFRESH_MS = EnvVar(
    "LAKE_QUERY_CATALOG_REFRESH_MS",
    doc=(
        "How often a Query replica asks Metasrv whether its catalog changed, and the "
        "freshness bound of planning: a view older than this is refreshed before a "
        "statement is planned, so other clients see a committed version within this "
        "interval plus one refresh round trip (docs/consistency.md)."
    ),
    owner=QUERY,
    default="1000",
    range="1..=3600000, milliseconds",
)
QUERY_MAX_CONCURRENT = EnvVar(
    "LAKE_QUERY_MAX_CONCURRENT",
    doc="Queries running at once on one replica.",
    owner=QUERY,
    default="64",
    range="1..=100000",
)
QUERY_MAX_CONCURRENT_PER_TENANT = EnvVar(
    "LAKE_QUERY_MAX_CONCURRENT_PER_TENANT",
    doc="Queries of one tenant running or queued at once on one replica.",
    owner=QUERY,
    default="8",
    range="1..=100000",
)
QUERY_MAX_TRACKED_TENANTS = EnvVar(
    "LAKE_QUERY_MAX_TRACKED_TENANTS",
    doc="Tenant admission gates tracked at once; queries of further tenants are refused.",
    owner=QUERY,
    default="4096",
    range="1..=1000000",
)
QUERY_QUEUE_TIMEOUT_MS = EnvVar(
    "LAKE_QUERY_QUEUE_TIMEOUT_MS",
    doc="Total time a query may wait for admission before RESOURCE_EXHAUSTED.",
    owner=QUERY,
    default="100",
    range="0..=86400000, milliseconds",
)
QUERY_EXECUTION_TIMEOUT_MS = EnvVar(
    "LAKE_QUERY_EXECUTION_TIMEOUT_MS",
    doc="Longest a query may run (its whole DoGet stream) before DEADLINE_EXCEEDED.",
    owner=QUERY,
    default="1800000 (30 min)",
    range="1..=604800000, milliseconds",
)
QUERY_MAX_SQL_BYTES = EnvVar(
    "LAKE_QUERY_MAX_SQL_BYTES",
    doc="Longest SQL text (and ticket or handle) accepted.",
    owner=QUERY,
    default="1048576 (1 MiB)",
    range="1024..=67108864, bytes",
)


QUERY_STALL_TIMEOUT_MS = EnvVar(
    "LAKE_QUERY_STALL_TIMEOUT_MS",
    doc="A DoGet whose client has taken no message for this long is ended; its admission "
    "permit and its query memory pool are released at once.",
    owner=QUERY,
    default="60000",
    range="1..=86400000, milliseconds",
)
QUERY_VERIFY_ON_OPEN = EnvVar(
    "LAKE_QUERY_VERIFY_ON_OPEN",
    doc="Check size and SHA-256 of every data file once per replica, the first time a "
    "query reads it, before serving rows from it (a mismatch is DATA_LOSS); false turns "
    "the check off.",
    owner=QUERY,
    default="true",
    range="true/false",
)
QUERY_MAX_EXPRESSION_TERMS = EnvVar(
    "LAKE_QUERY_MAX_EXPRESSION_TERMS",
    doc="Binary operators (arithmetic, comparison, AND/OR, ||) in one statement, checked "
    "before DataFusion parses it.",
    owner=QUERY,
    default="512",
    range="1..=100000",
)
QUERY_MAX_NESTING_DEPTH = EnvVar(
    "LAKE_QUERY_MAX_NESTING_DEPTH",
    doc="Deepest nesting in one statement (brackets, function calls, CAST, CASE, "
    "subqueries, NOT and unary minus, each operator still open), checked on its tokens "
    "before DataFusion parses it. Above 40 DataFusion's parser can take minutes.",
    owner=QUERY,
    default="32",
    range="4..=40",
)
QUERY_PLANNING_TIMEOUT_MS = EnvVar(
    "LAKE_QUERY_PLANNING_TIMEOUT_MS",
    doc="Longest a statement may wait for and take planning (GetFlightInfo, prepare) "
    "before DEADLINE_EXCEEDED. A planning thread still busy then is counted as lost "
    "until it ends; when every one is lost the replica reports NOT_SERVING.",
    owner=QUERY,
    default="15000",
    range="10..=3600000, milliseconds",
)
QUERY_PLANNING_THREADS = EnvVar(
    "LAKE_QUERY_PLANNING_THREADS",
    doc="Threads of one replica that plan statements.",
    owner=QUERY,
    default="max(8, 4 x CPU cores)",
    range="1..=1024",
)
QUERY_PLANNING_THREADS_PER_TENANT = EnvVar(
    "LAKE_QUERY_PLANNING_THREADS_PER_TENANT",
    doc="Planning threads one tenant may hold at once, stuck ones included (always at "
    "least one fewer than LAKE_QUERY_PLANNING_THREADS when there are two or more); its "
    "further statements wait within the planning timeout.",
    owner=QUERY,
    default="4",
    range="1..=1024",
)
QUERY_MAX_QUERY_BLOCKS = EnvVar(
    "LAKE_QUERY_MAX_QUERY_BLOCKS",
    doc="SELECT blocks (subqueries, CTEs, UNION arms) in one statement.",
    owner=QUERY,
    default="256",
    range="1..=100000",
)
QUERY_MAX_PLAN_DEPTH = EnvVar(
    "LAKE_QUERY_MAX_PLAN_DEPTH",
    doc="Depth of a statement's logical plan.",
    owner=QUERY,
    default="96",
    range="4..=10000",
)
QUERY_MEMORY_LIMIT_BYTES = EnvVar(
    "LAKE_QUERY_MEMORY_LIMIT_BYTES",
    doc="DataFusion memory of one replica's queries; each query's pool is a quarter of it "
    "while the replica has room, and smaller (never below a floor that every query admission "
    "admits can have at once) while other queries hold it (sorts, joins and aggregates spill "
    "past their pool).",
    owner=QUERY,
    default="2147483648 (2 GiB, for a 4 GiB replica)",
    range="16777216..=17592186044416, bytes",
)
QUERY_MEMORY_POOLS_PER_TENANT = EnvVar(
    "LAKE_QUERY_MEMORY_POOLS_PER_TENANT",
    doc="How many full query memory pools' worth (a quarter of LAKE_QUERY_MEMORY_LIMIT_BYTES "
    "each) one tenant's queries may hold at once, so that no tenant keeps the others out; a "
    "single-tenant replica may set 4.",
    owner=QUERY,
    default="2",
    range="1..=4, pools",
)
QUERY_MAX_FUNCTION_OUTPUT_BYTES = EnvVar(
    "LAKE_QUERY_MAX_FUNCTION_OUTPUT_BYTES",
    doc="Largest output of one size-amplifying function call (repeat, lpad, array_repeat, "
    "range, ...) over one batch.",
    owner=QUERY,
    default="67108864 (64 MiB)",
    range="1024..=17179869184, bytes",
)

# -- partitioned results -------------------------------------------------------

QUERY_MAX_ENDPOINTS = EnvVar(
    "LAKE_QUERY_MAX_ENDPOINTS",
    doc="Most endpoints (fragment-range partitions) GetFlightInfo returns for a plain scan "
    "of one table; 1 turns partitioning off. Every replica of a fleet must agree.",
    owner=QUERY,
    default="8",
    range="1..=256",
)
QUERY_MIN_ENDPOINT_ROWS = EnvVar(
    "LAKE_QUERY_MIN_ENDPOINT_ROWS",
    doc="Fewest stored rows one partition of a partitioned scan covers, so small tables "
    "keep one endpoint. Every replica of a fleet must agree.",
    owner=QUERY,
    default="262144",
    range="1..=1099511627776, rows",
)

# -- repeated scans from memory -------------------------------------------------

QUERY_SCAN_CACHE_BYTES = EnvVar(
    "LAKE_QUERY_SCAN_CACHE_BYTES",
    doc="Memory a replica keeps decoded batches of recent plain scans of pinned table versions "
    "in, so a repeated scan is served without reading Lance again; a scan larger than this is "
    "never kept. 0 turns the cache off. Budget it beside LAKE_QUERY_MEMORY_LIMIT_BYTES.",
    owner=QUERY,
    default="1073741824 (1 GiB, for a 4 GiB replica)",
    range="0..=1099511627776, bytes",
)

# -- Iceberg federation ---------------------------------------------------------

ICEBERG_REST_ENDPOINT = EnvVar(
    "LAKE_ICEBERG_REST_ENDPOINT",
    doc="The external Iceberg REST catalog Query federates as the read-only `iceberg` catalog "
    "(with LAKE_ICEBERG_WAREHOUSE and LAKE_ICEBERG_NAMESPACES: all three or none). "
    "Credential-free https://, or http:// on a numeric loopback IP only.",
    owner=QUERY,
    range="URL",
)
ICEBERG_WAREHOUSE = EnvVar(
    "LAKE_ICEBERG_WAREHOUSE",
    doc="The warehouse identifier sent to the Iceberg REST catalog (never logged or shown).",
    owner=QUERY,
)
ICEBERG_LOCATION = EnvVar(
    "LAKE_ICEBERG_LOCATION",
    doc="The location (s3://bucket/prefix, or file:///path) every file of a federated Iceberg "
    "table must lie under; a file the catalog names elsewhere is refused unread. Defaults to "
    "LAKE_ICEBERG_WAREHOUSE, which must then be such a location (never logged or shown).",
    owner=QUERY,
    default="LAKE_ICEBERG_WAREHOUSE",
    range="URL",
)
ICEBERG_NAMESPACES = EnvVar(
    "LAKE_ICEBERG_NAMESPACES",
    doc="Iceberg namespaces Query may read (the ceiling; a principal also needs the "
    "namespace in its grants). Each is checked to exist at startup.",
    owner=QUERY,
    range="comma-separated namespace names",
)
ICEBERG_REST_TOKEN = EnvVar(
    "LAKE_ICEBERG_REST_TOKEN",
    doc="A static bearer token for the Iceberg catalog (never refreshed). Exclusive with "
    "LAKE_ICEBERG_REST_CREDENTIAL.",
    owner=QUERY,
    range="secret",
)
ICEBERG_REST_CREDENTIAL = EnvVar(
    "LAKE_ICEBERG_REST_CREDENTIAL",
    doc="OAuth2 client credentials for the Iceberg catalog; one shared renewal when a token "
    "is refused. Exclusive with LAKE_ICEBERG_REST_TOKEN.",
    owner=QUERY,
    range="client-id:client-secret (secret)",
)
ICEBERG_REST_OAUTH2_SERVER_URI = EnvVar(
    "LAKE_ICEBERG_REST_OAUTH2_SERVER_URI",
    doc="The OAuth2 token endpoint (default: the catalog's /v1/oauth/tokens). "
    "Requires LAKE_ICEBERG_REST_CREDENTIAL; same transport rule as the catalog.",
    owner=QUERY,
    range="URL",
)
ICEBERG_REST_OAUTH_SCOPE = EnvVar(
    "LAKE_ICEBERG_REST_OAUTH_SCOPE",
    doc="OAuth2 scope of the token request. Requires LAKE_ICEBERG_REST_CREDENTIAL.",
    owner=QUERY,
    default="catalog",
)
ICEBERG_REST_OAUTH_AUDIENCE = EnvVar(
    "LAKE_ICEBERG_REST_OAUTH_AUDIENCE",
    doc="OAuth2 audience of the token request. Requires LAKE_ICEBERG_REST_CREDENTIAL.",
    owner=QUERY,
)
ICEBERG_REST_OAUTH_RESOURCE = EnvVar(
    "LAKE_ICEBERG_REST_OAUTH_RESOURCE",
    doc="OAuth2 resource of the token request. Requires LAKE_ICEBERG_REST_CREDENTIAL.",
    owner=QUERY,
)
ICEBERG_REST_TIMEOUT_MS = EnvVar(
    "LAKE_ICEBERG_REST_TIMEOUT_MS",
    doc="One bound on every Iceberg catalog exchange: the config handshake, namespace checks, "
    "table loads and OAuth token requests.",
    owner=QUERY,
    default="10000",
    range="100..=300000",
)
ICEBERG_S3_ENDPOINT = EnvVar(
    "LAKE_ICEBERG_S3_ENDPOINT",
    doc="S3 endpoint for Iceberg table files when the catalog does not give one; must be "
    "paired with LAKE_ICEBERG_S3_REGION. Same transport rule as the catalog; no credentials.",
    owner=QUERY,
    range="URL",
)
ICEBERG_S3_REGION = EnvVar(
    "LAKE_ICEBERG_S3_REGION",
    doc="Region for LAKE_ICEBERG_S3_ENDPOINT (both or neither).",
    owner=QUERY,
)
ICEBERG_S3_PATH_STYLE = EnvVar(
    "LAKE_ICEBERG_S3_PATH_STYLE",
    doc="Path-style S3 addressing for Iceberg table files.",
    owner=QUERY,
    default="unset (the catalog's setting)",
    range="true | false",
)
ICEBERG_S3_ANONYMOUS = EnvVar(
    "LAKE_ICEBERG_S3_ANONYMOUS",
    doc="Read Iceberg table files unsigned: only for an intentionally public bucket.",
    owner=QUERY,
    default="false",
    range="true | false",
)

# -- telemetry -------------------------------------------------------------------

METRICS_ADDR = EnvVar(
    "LAKE_METRICS_ADDR",
    doc="Adds a Prometheus /metrics endpoint on this loopback IP socket (collect it with a "
    "localhost sidecar or node agent); any other address is a startup error.",
    owner="lake query, lake meta, lake iceberg registrar",
    range="loopback IP:port, e.g. 127.0.0.1:9090",
)
LOG_FORMAT = EnvVar(
    "LAKE_LOG_FORMAT",
    doc="json: every stdout/stderr line is one JSON object (the readiness banner too); "
    "console: human-readable lines. Unset: human-readable lines when stderr is a terminal, "
    "JSON log records elsewhere, plus the plain readiness banner. --log-format overrides it.",
    owner="lake query, lake meta, lake iceberg registrar",
    range="json, console",
)
LOG_LEVEL = EnvVar(
    "LAKE_LOG_LEVEL",
    doc="Minimum log level; SQL text is only ever logged at debug. Overrides --log-level.",
    owner="lake query, lake meta, lake iceberg registrar",
    default="info",
    range="debug, info, warning, error",
)

# -- progress bars and the terminal ------------------------------------------

NO_PROGRESS = EnvVar(
    "LAKE_NO_PROGRESS",
    doc="Any non-empty value turns off the progress bars the SDK and the lake commands "
    "draw on an interactive terminal (uploads, verify, GC), as HF_HUB_DISABLE_PROGRESS_BARS "
    "does for Hugging Face.",
    owner="lake-sdk, lake commands",
    range="unset or empty: bars on a terminal; anything else: no bars",
)

# -- durable async queries -------------------------------------------------------

ASYNC_QUERIES = EnvVar(
    "LAKE_ASYNC_QUERIES",
    doc="Serve durable async queries: PollFlightInfo jobs that survive the client, its "
    "connection and the accepting Query replica, plus CancelFlightInfo. Local mode keeps "
    "async-query-state/ and async-query-results/ beside the catalog (--data-dir); with "
    "LAKE_S3_BUCKET set, jobs live in DynamoDB and results on S3.",
    owner=QUERY,
    default="false",
    range="true/false",
)
ASYNC_DYNAMODB_TABLE = EnvVar(
    "LAKE_ASYNC_DYNAMODB_TABLE",
    doc="DynamoDB table of async job state in S3 mode; must differ from the registry and "
    "manifest tables.",
    owner=QUERY,
    default="lake_async_queries",
    range="DynamoDB table name",
)
ASYNC_RESULT_PREFIX = EnvVar(
    "LAKE_ASYNC_RESULT_PREFIX",
    doc="Key prefix in LAKE_S3_BUCKET of async result parts and manifests (S3 mode).",
    owner=QUERY,
    default="async-query-results",
    range="'/'-separated segments",
)
ASYNC_WORKER_CONCURRENCY = EnvVar(
    "LAKE_ASYNC_WORKER_CONCURRENCY",
    doc="Async jobs this replica runs at once (process-local).",
    owner=QUERY,
    default="4",
    range="1..=64",
)
ASYNC_WORKER_CONCURRENCY_PER_TENANT = EnvVar(
    "LAKE_ASYNC_WORKER_CONCURRENCY_PER_TENANT",
    doc="Async jobs of one tenant this replica runs at once; at most "
    "LAKE_ASYNC_WORKER_CONCURRENCY.",
    owner=QUERY,
    default="1",
    range="1..=64",
)
ASYNC_EXECUTION_TIMEOUT_MS = EnvVar(
    "LAKE_ASYNC_EXECUTION_TIMEOUT_MS",
    doc="Absolute execution deadline of one async job; at the deadline both execution and "
    "lease renewal stop and the job fails.",
    owner=QUERY,
    default="1800000 (30 min)",
    range="1000..=86400000, milliseconds",
)
ASYNC_GLOBAL_WORKER_CONCURRENCY = EnvVar(
    "LAKE_ASYNC_GLOBAL_WORKER_CONCURRENCY",
    doc="Async jobs running at once across every replica sharing the async state store "
    "(a shared execution lease); set together with the per-tenant value, or neither. "
    "Drain and recreate the fleet to change it.",
    owner=QUERY,
    range="1..=64",
)
ASYNC_GLOBAL_WORKER_CONCURRENCY_PER_TENANT = EnvVar(
    "LAKE_ASYNC_GLOBAL_WORKER_CONCURRENCY_PER_TENANT",
    doc="Async jobs of one tenant running at once across the fleet; at most "
    "LAKE_ASYNC_GLOBAL_WORKER_CONCURRENCY.",
    owner=QUERY,
    range="1..=64",
)
ASYNC_MAX_OUTSTANDING_PER_TENANT = EnvVar(
    "LAKE_ASYNC_MAX_OUTSTANDING_PER_TENANT",
    doc="Retained async jobs (pending, running or done and not yet released) of one tenant; "
    "a slot is reserved in the shared state store before the job is written.",
    owner=QUERY,
    default="8",
    range="1..=128",
)
ASYNC_MAX_RESULT_BYTES = EnvVar(
    "LAKE_ASYNC_MAX_RESULT_BYTES",
    doc="Encoded bytes one async result may hold; persisted in each job at submission so a "
    "restart with a looser value cannot enlarge an existing job.",
    owner=QUERY,
    default="17179869184 (16 GiB)",
    range="67108864..=274877906944, bytes",
)

# -- Iceberg object-store bounds ------------------------------------------------

ICEBERG_S3_TIMEOUT_MS = EnvVar(
    "LAKE_ICEBERG_S3_TIMEOUT_MS",
    doc="Bound on Iceberg object reads by Query: the connect and request timeout of each S3 "
    "request (manifests, data files, failure probes), and the longest the direct Parquet "
    "reader waits for the next batch. A silent store fails the scan with Unavailable.",
    owner=QUERY,
    default="10000",
    range="100..=300000, milliseconds",
)

# -- native DoGet data plane ---------------------------------------------------

QUERY_DATA_ADDR = EnvVar(
    "LAKE_QUERY_DATA_ADDR",
    doc="Listen address (host:port) of Query's native DoGet data plane: pyarrow's C++ Flight "
    "server in the same process, under the same bearer auth, TLS, tickets and admission. "
    "GetFlightInfo then points each query endpoint's location at it. Off when unset.",
    owner=QUERY,
    range="host:port, same rules as --addr",
)
QUERY_DATA_ADVERTISE = EnvVar(
    "LAKE_QUERY_DATA_ADVERTISE",
    doc="host:port clients dial for the data plane (endpoint locations); required when "
    "LAKE_QUERY_DATA_ADDR binds a wildcard (0.0.0.0 or [::]). Defaults to the bind address.",
    owner=QUERY,
    default="LAKE_QUERY_DATA_ADDR",
    range="host:port",
)

# -- tests ---------------------------------------------------------------------

FAULTS = EnvVar(
    "LAKE_FAULTS",
    doc="Arms named crash, stop and test-size points (lake_core.faults); inert when unset. "
    "Never set it in production.",
    owner=TESTS,
    range="comma-separated points and setting=integer",
)


def all_variables() -> Iterator[EnvVar]:
    """Every variable declared here, in declaration order."""
    for value in globals().values():
        if isinstance(value, EnvVar):
            yield value


def env_int(
    name: str,
    default: int,
    low: int,
    high: int,
    env: Mapping[str, str] | None = None,
) -> int:
    """Parse an integer variable within ``low..=high``, or raise ConfigError naming it."""
    source = os.environ if env is None else env
    raw = source.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip(), 10)
    except ValueError:
        raise ConfigError(f"{name} must be an integer in {low}..={high}, got {raw!r}") from None
    if not low <= value <= high:
        raise ConfigError(f"{name} must be in {low}..={high}, got {value}")
    return value


def is_loopback_address(addr: str) -> bool:
    """True when a ``host:port`` listen address binds only the loopback interface."""
    host = addr.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
