"""The public surface: frozen exports, async/sync twins, every error class, deprecations."""

from __future__ import annotations

import inspect
import warnings

import pytest

import lake_core.errors
import lake_sdk
import lake_sdk.errors
from lake_sdk._deprecation import is_deprecated

FROZEN_ALL = [
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
    "MissingExtra",
    "ManagedObjectStore",
    "NotFound",
    "NotLeader",
    "ObjectIntegrityError",
    "ObjectFile",
    "ObjectNotFound",
    "ObjectOverlong",
    "ObjectReader",
    "ObjectStoreUnavailable",
    "OperationExpired",
    "PayloadTooLarge",
    "QueryCancelled",
    "QueryTooLarge",
    "PendingAppendDamaged",
    "PendingAppendUncertain",
    "PermissionDenied",
    "PrematureEof",
    "PresignUnsupported",
    "ProgressCallback",
    "QueryResult",
    "RangeMismatch",
    "ReadCapability",
    "ReadOnlySql",
    "ResourceExhausted",
    "ResultTooLarge",
    "SchemaCache",
    "SchemaMismatch",
    "IntegerOverflow",
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


def test_all_is_frozen() -> None:
    # Adding or removing a public name is an API change: update this list on purpose.
    assert sorted(lake_sdk.__all__) == sorted(FROZEN_ALL)
    for name in lake_sdk.__all__:
        assert hasattr(lake_sdk, name), name


def test_every_lake_error_class_is_importable_from_the_sdk() -> None:
    tree = {
        name
        for name, value in vars(lake_core.errors).items()
        if inspect.isclass(value) and issubclass(value, lake_core.errors.LakeError)
    }
    assert tree <= set(lake_sdk.errors.__all__), tree - set(lake_sdk.errors.__all__)
    for name in lake_sdk.errors.__all__:
        value = getattr(lake_sdk, name)
        assert value is getattr(lake_sdk.errors, name)
        assert issubclass(value, lake_core.errors.LakeError)
        if name in tree:
            assert value is getattr(lake_core.errors, name)


def _public_methods(cls: type) -> dict[str, object]:
    return {
        name: value
        for name, value in inspect.getmembers(cls)
        if not name.startswith("_") and callable(value) and not is_deprecated(value)
    }


def _parameters(fn: object) -> list[tuple[str, object, object]]:
    signature = inspect.signature(fn)  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def test_every_async_method_has_a_sync_twin() -> None:
    async_methods = _public_methods(lake_sdk.AsyncClient)
    sync_methods = _public_methods(lake_sdk.Client)
    assert set(async_methods) == set(sync_methods), (
        f"only async: {sorted(set(async_methods) - set(sync_methods))}, "
        f"only sync: {sorted(set(sync_methods) - set(async_methods))}"
    )
    for name, method in async_methods.items():
        assert _parameters(method) == _parameters(sync_methods[name]), name
        assert not inspect.iscoroutinefunction(sync_methods[name]), name
    # The same constructor: same keyword-only options, same defaults.
    assert _parameters(lake_sdk.AsyncClient.__init__) == _parameters(lake_sdk.Client.__init__)
    init = inspect.signature(lake_sdk.AsyncClient.__init__).parameters.values()
    assert [p.name for p in init if p.kind is not inspect.Parameter.KEYWORD_ONLY] == [
        "self",
        "url",
    ]


def test_the_twin_check_can_fail() -> None:
    class Async:
        async def query(self, sql: str) -> None: ...

        async def clone(self) -> None: ...

    class Sync:
        def query(self, sql: str) -> None: ...

    assert set(_public_methods(Async)) - set(_public_methods(Sync)) == {"clone"}


def test_constructing_validates_options_before_any_io() -> None:
    with pytest.raises(lake_sdk.InvalidArgument, match="https://"):
        lake_sdk.AsyncClient("grpc://127.0.0.1:1", ca_pem=b"-----BEGIN CERTIFICATE-----\n")
    with pytest.raises(lake_sdk.InvalidArgument, match="bearer token"):
        lake_sdk.Client("https://q:1", token="has space")
    with pytest.raises(lake_sdk.InvalidArgument, match="retries"):
        lake_sdk.AsyncClient("grpc://127.0.0.1:1", retries=10)
    with pytest.raises(lake_sdk.InvalidUpload, match="upload_concurrency"):
        lake_sdk.Client("grpc://127.0.0.1:1", upload_concurrency=0)
    with pytest.raises(lake_sdk.InvalidUpload, match="progress"):
        lake_sdk.Client("grpc://127.0.0.1:1", progress="yes")  # type: ignore[arg-type]
    with pytest.raises(lake_sdk.InvalidArgument, match="must start with"):
        lake_sdk.AsyncClient("ftp://q:1")
    client = lake_sdk.AsyncClient("https://q:1", token="lk_secret-token", server_name="q")
    assert "lk_secret-token" not in repr(client) + repr(client._state.connection)


def test_entering_an_unreachable_client_raises_unavailable() -> None:
    client = lake_sdk.Client("grpc://127.0.0.1:1", connect_timeout=0.5)
    with pytest.raises(lake_sdk.Unavailable, match="not reachable"):
        client.__enter__()


def test_old_names_warn_and_still_work() -> None:
    for name in ("LakeClient", "connect", "LakeClientBuilder", "ClientBuilder"):
        assert name not in lake_sdk.__all__
        with pytest.warns(DeprecationWarning, match=f"lake_sdk.{name}"):
            getattr(lake_sdk, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = lake_sdk.LakeClient
    assert issubclass(old, lake_sdk.AsyncClient)
    with pytest.warns(DeprecationWarning, match="Client.builder"):
        lake_sdk.Client.builder("https://q:1")
    with pytest.raises(AttributeError):
        lake_sdk.no_such_name  # noqa: B018
