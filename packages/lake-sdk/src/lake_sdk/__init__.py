"""Lake's Python SDK: SQL, appends and FILE values through one Query endpoint.

Connect one way, with the client as a context manager (entering it waits until
Query answers and raises ``Unavailable`` or ``Unauthenticated`` if it does not;
leaving it closes the connection)::

    import lake_sdk

    with lake_sdk.Client("grpc://127.0.0.1:50051") as client:
        table = client.query_table("SELECT * FROM robots.episodes")

    async with lake_sdk.AsyncClient("grpc://127.0.0.1:50051") as client:
        table = await client.query_table("SELECT * FROM robots.episodes")

Both take the same keyword-only options and have the same methods (the
asyncio ones are coroutines). Blocking types carry no prefix and their
asyncio twins carry ``Async``: ``Client``/``AsyncClient``,
``QueryResult``/``AsyncQueryResult``, ``JobResult``/``AsyncJobResult``,
``ObjectReader``/``AsyncObjectReader``, ``ObjectStore``/``AsyncObjectStore``,
``Jobs``/``AsyncJobs``. Every blocking client shares one background event
loop; Ctrl-C during a blocking call cancels what the call started.

Durable server-side query jobs (``LAKE_ASYNC_QUERIES``) live under
``client.jobs``: ``submit`` returns a :class:`JobHandle` to checkpoint,
``poll``, ``resume`` and ``cancel`` take one, and ``query`` does it all.

With TLS and a bearer token::

    client = lake_sdk.Client(
        "https://query.internal:50051",
        token=token,                      # sent as ``authorization: Bearer ...``
        ca_pem=ca_pem,                    # verify Query against this CA bundle
        server_name="query.internal",     # when the certificate names another host
    )

Other options: ``connect_timeout``, ``retries`` (appends with an unknown
outcome), ``schema_cache`` (a :class:`SchemaCache`), ``upload_checkpoint_dir``,
``upload_concurrency``, ``progress``, ``query_only``, ``store`` and
``transport`` (a :class:`Transport`, such as the in-memory
:class:`MockTransport` for unit tests); see :class:`AsyncClient`. Every error class is importable from here and from
:mod:`lake_sdk.errors`, whose docstring draws the tree.

Old versions: ``client.versions("ns.table")`` lists a table's retained
versions, and ``client.query(sql, as_of=3)`` (or an aware datetime) reads
every ``lake.<namespace>.<table>`` the SQL names at that version, as
:func:`as_of_sql` rewrites it (``lake.ns."t@v3"``).

The 0.1 names ``LakeClient``, ``connect``, ``LakeClientBuilder`` and
``ClientBuilder``, the 0.2 names ``SyncQueryResult``, ``SyncObjectReader``,
``SyncObjectStore``, ``AsyncQueryHandle`` and the ``*_async`` job methods,
and the module paths that became private (``lake_sdk.client``,
``lake_sdk.sync``, ``lake_sdk.jobs``, ...) still work for one release and warn
(DeprecationWarning). In 0.2 ``AsyncQueryResult`` was a job's result; that is
now :class:`AsyncJobResult`, a subclass of :class:`AsyncQueryResult`, and
``ObjectReader`` (0.2: the asyncio reader) is now the blocking one.
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
from lake_objects.reader import ObjectReader as AsyncObjectReader
from lake_objects.source import FileUpload
from lake_objects.store import ManagedObjectStore
from lake_sdk import errors
from lake_sdk._client import AsyncClient
from lake_sdk._deprecation import warn
from lake_sdk._jobs import AsyncJobResult, AsyncJobs, JobHandle
from lake_sdk._locations import data_location
from lake_sdk._mock_transport import MockTransport
from lake_sdk._object_file import ObjectFile
from lake_sdk._progress import UploadProgressBar
from lake_sdk._results import AsyncQueryResult
from lake_sdk._schema_cache import SchemaCache
from lake_sdk._sync import Client, JobResult, Jobs, ObjectReader, ObjectStore, QueryResult
from lake_sdk._tables import TableInfo
from lake_sdk._time_travel import as_of_sql
from lake_sdk._transport import Transport
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

#: The asyncio managed stage (``AsyncClient.object_store()``); blocking: :class:`ObjectStore`.
AsyncObjectStore = ManagedObjectStore

__all__ = [
    "EPISODE_ARTIFACT_SCHEMA_V1",
    "Aborted",
    "AlreadyExists",
    "AsyncClient",
    "AsyncJobResult",
    "AsyncJobs",
    "AsyncObjectReader",
    "AsyncObjectStore",
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
    "JobHandle",
    "JobResult",
    "Jobs",
    "LakeError",
    "LocationOutsideStage",
    "ManagedObjectStore",
    "MissingExtra",
    "MockTransport",
    "NotFound",
    "NotLeader",
    "ObjectFile",
    "ObjectIntegrityError",
    "ObjectNotFound",
    "ObjectOverlong",
    "ObjectReader",
    "ObjectStore",
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
    "TableExists",
    "TableInfo",
    "TableNotFound",
    "TableRef",
    "TooManyParts",
    "Transport",
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
    "LakeClient": ("lake_sdk._client", "LakeClient", "lake_sdk.AsyncClient"),
    "connect": ("lake_sdk._sync", "connect", "with lake_sdk.Client(url, ...) as client"),
    "LakeClientBuilder": (
        "lake_sdk._builder",
        "LakeClientBuilder",
        "lake_sdk.AsyncClient(url, ...)",
    ),
    "ClientBuilder": ("lake_sdk._builder", "ClientBuilder", "lake_sdk.Client(url, ...)"),
    # 0.2: blocking types lose ``Sync``; durable jobs are jobs, not "async".
    "SyncQueryResult": ("lake_sdk._sync", "QueryResult", "lake_sdk.QueryResult"),
    "SyncObjectReader": ("lake_sdk._sync", "ObjectReader", "lake_sdk.ObjectReader"),
    "SyncObjectStore": ("lake_sdk._sync", "ObjectStore", "lake_sdk.ObjectStore"),
    "AsyncQueryHandle": ("lake_sdk._jobs", "JobHandle", "lake_sdk.JobHandle"),
}


def __getattr__(name: str) -> Any:
    if name not in _DEPRECATED:
        raise AttributeError(f"module 'lake_sdk' has no attribute {name!r}")
    import importlib

    module, attribute, instead = _DEPRECATED[name]
    warn(f"lake_sdk.{name}", instead)
    return getattr(importlib.import_module(module), attribute)
