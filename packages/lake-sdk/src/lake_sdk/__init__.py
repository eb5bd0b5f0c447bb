"""Lake's Python SDK: SQL, appends and FILE values through one Query endpoint.

Connect one way, with the client as a context manager (entering it waits until
Query answers and raises ``Unavailable`` or ``Unauthenticated`` if it does not;
leaving it closes the connection)::

    import lake_sdk

    with lake_sdk.Client("grpc://127.0.0.1:50051") as client:
        table = client.query_table("SELECT * FROM robots.episodes")

    async with lake_sdk.AsyncClient("grpc://127.0.0.1:50051") as client:
        table = await client.query_table("SELECT * FROM robots.episodes")

Both take the same keyword-only options and have the same methods (the async
ones are coroutines). With TLS and a bearer token::

    client = lake_sdk.Client(
        "https://query.internal:50051",
        token=token,                      # sent as ``authorization: Bearer ...``
        ca_pem=ca_pem,                    # verify Query against this CA bundle
        server_name="query.internal",     # when the certificate names another host
    )

Other options: ``connect_timeout``, ``retries`` (appends with an unknown
outcome), ``schema_cache`` (a :class:`SchemaCache`), ``upload_checkpoint_dir``,
``upload_concurrency``, ``progress``, ``query_only`` and ``store``; see
:class:`AsyncClient`. Every error class is importable from here and from
:mod:`lake_sdk.errors`, whose docstring draws the tree.

Old versions: ``client.versions("ns.table")`` lists a table's retained
versions, and ``client.query(sql, as_of=3)`` (or an aware datetime) reads
every ``lake.<namespace>.<table>`` the SQL names at that version, as
:func:`as_of_sql` rewrites it (``lake.ns."t@v3"``).

The 0.1 names ``LakeClient``, ``connect``, ``LakeClientBuilder`` and
``ClientBuilder`` still work for one release and warn (DeprecationWarning).
"""

from typing import Any

from lake_core.models import DataLocation
from lake_core.names import TableRef
from lake_objects.capability import ReadCapability
from lake_objects.episode import (
    EPISODE_ARTIFACT_SCHEMA_V1,
    EpisodeBundle,
    episode_artifact_table_v1,
)
from lake_objects.progress import ProgressCallback, UploadProgress
from lake_objects.reader import ObjectReader
from lake_objects.source import FileUpload
from lake_objects.store import ManagedObjectStore
from lake_sdk import errors
from lake_sdk._deprecation import warn
from lake_sdk.client import AsyncClient
from lake_sdk.errors import (
    Aborted,
    AlreadyExists,
    CapabilityRejected,
    CommitStateUnknown,
    ConfigError,
    DataCorrupted,
    DeadlineExceeded,
    FailedPrecondition,
    HashMismatch,
    IntegerOverflow,
    Internal,
    InvalidAppend,
    InvalidArgument,
    InvalidFlightData,
    InvalidName,
    InvalidRange,
    InvalidSchema,
    InvalidUpload,
    LakeError,
    LocationOutsideStage,
    MissingExtra,
    NotFound,
    NotLeader,
    ObjectIntegrityError,
    ObjectNotFound,
    ObjectOverlong,
    ObjectStoreUnavailable,
    OperationExpired,
    PayloadTooLarge,
    PendingAppendDamaged,
    PendingAppendUncertain,
    PermissionDenied,
    PrematureEof,
    PresignUnsupported,
    QueryCancelled,
    QueryTooLarge,
    RangeMismatch,
    ReadOnlySql,
    ResourceExhausted,
    ResultTooLarge,
    SchemaMismatch,
    SqlError,
    StageUnavailable,
    StaleReadVersion,
    TableExists,
    TableNotFound,
    TooManyParts,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    UploadCheckpointMismatch,
    UploadInProgress,
    VersionReclaimed,
)
from lake_sdk.jobs import AsyncQueryHandle, AsyncQueryResult
from lake_sdk.locations import data_location
from lake_sdk.object_file import ObjectFile
from lake_sdk.progress import UploadProgressBar
from lake_sdk.results import QueryResult
from lake_sdk.schema_cache import SchemaCache
from lake_sdk.sync import Client, SyncObjectReader, SyncObjectStore, SyncQueryResult
from lake_sdk.tables import TableInfo
from lake_sdk.time_travel import as_of_sql

__all__ = [
    "EPISODE_ARTIFACT_SCHEMA_V1",
    "Aborted",
    "AlreadyExists",
    "AsyncClient",
    "AsyncQueryHandle",
    "AsyncQueryResult",
    "CapabilityRejected",
    "Client",
    "CommitStateUnknown",
    "ConfigError",
    "DataCorrupted",
    "DataLocation",
    "DeadlineExceeded",
    "EpisodeBundle",
    "FailedPrecondition",
    "FileUpload",
    "HashMismatch",
    "IntegerOverflow",
    "Internal",
    "InvalidAppend",
    "InvalidArgument",
    "InvalidFlightData",
    "InvalidName",
    "InvalidRange",
    "InvalidSchema",
    "InvalidUpload",
    "LakeError",
    "LocationOutsideStage",
    "ManagedObjectStore",
    "MissingExtra",
    "NotFound",
    "NotLeader",
    "ObjectFile",
    "ObjectIntegrityError",
    "ObjectNotFound",
    "ObjectOverlong",
    "ObjectReader",
    "ObjectStoreUnavailable",
    "OperationExpired",
    "PayloadTooLarge",
    "PendingAppendDamaged",
    "PendingAppendUncertain",
    "PermissionDenied",
    "PrematureEof",
    "PresignUnsupported",
    "ProgressCallback",
    "QueryCancelled",
    "QueryResult",
    "QueryTooLarge",
    "RangeMismatch",
    "ReadCapability",
    "ReadOnlySql",
    "ResourceExhausted",
    "ResultTooLarge",
    "SchemaCache",
    "SchemaMismatch",
    "SqlError",
    "StageUnavailable",
    "StaleReadVersion",
    "SyncObjectReader",
    "SyncObjectStore",
    "SyncQueryResult",
    "TableExists",
    "TableInfo",
    "TableNotFound",
    "TableRef",
    "TooManyParts",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "UploadCheckpointMismatch",
    "UploadInProgress",
    "UploadProgress",
    "UploadProgressBar",
    "VersionReclaimed",
    "as_of_sql",
    "data_location",
    "episode_artifact_table_v1",
    "errors",
]

#: Deprecated 0.1 name -> (module, attribute, what to use instead).
_DEPRECATED = {
    "LakeClient": ("lake_sdk.client", "LakeClient", "lake_sdk.AsyncClient"),
    "connect": ("lake_sdk.sync", "connect", "with lake_sdk.Client(url, ...) as client"),
    "LakeClientBuilder": (
        "lake_sdk.builder",
        "LakeClientBuilder",
        "lake_sdk.AsyncClient(url, ...)",
    ),
    "ClientBuilder": ("lake_sdk.builder", "ClientBuilder", "lake_sdk.Client(url, ...)"),
}


def __getattr__(name: str) -> Any:
    if name not in _DEPRECATED:
        raise AttributeError(f"module 'lake_sdk' has no attribute {name!r}")
    import importlib

    module, attribute, instead = _DEPRECATED[name]
    warn(f"lake_sdk.{name}", instead)
    return getattr(importlib.import_module(module), attribute)
