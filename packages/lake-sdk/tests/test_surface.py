"""The public surface: frozen exports, blocking/asyncio twins, every error class, deprecations."""

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
    "MissingExtra",
    "MockTransport",
    "ManagedObjectStore",
    "NotFound",
    "NotLeader",
    "ObjectIntegrityError",
    "ObjectFile",
    "ObjectNotFound",
    "ObjectOverlong",
    "ObjectReader",
    "ObjectStore",
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


#: Every public blocking type and its asyncio twin (``lake_sdk.X`` / ``lake_sdk.AsyncX``).
TWINS = [
    ("Client", "AsyncClient"),
    ("Jobs", "AsyncJobs"),
    ("QueryResult", "AsyncQueryResult"),
    ("JobResult", "AsyncJobResult"),
    ("ObjectReader", "AsyncObjectReader"),
    ("ObjectStore", "AsyncObjectStore"),
]
#: asyncio spells a few methods differently (``aclose``: PEP 525's name for it).
ASYNC_SPELLING = {"aclose": "close"}


def _public_methods(cls: type) -> dict[str, object]:
    return {
        ASYNC_SPELLING.get(name, name): value
        for name, value in inspect.getmembers(cls)
        if not name.startswith("_") and callable(value) and not is_deprecated(value)
    }


def _public_properties(cls: type) -> set[str]:
    return {
        name
        for name, value in inspect.getmembers(cls)
        if not name.startswith("_") and isinstance(value, property)
    }


def _parameters(fn: object) -> list[tuple[str, object, object]]:
    signature = inspect.signature(fn)  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def test_every_public_name_pairs_blocking_with_async() -> None:
    # A public ``AsyncX`` has a blocking ``X`` and both are in TWINS.
    paired = {name for pair in TWINS for name in pair}
    for name in lake_sdk.__all__:
        if name.startswith("Async"):
            assert name in paired, name
            assert name.removeprefix("Async") in lake_sdk.__all__, name


@pytest.mark.parametrize(("blocking", "asyncio"), TWINS)
def test_every_async_method_has_a_blocking_twin(blocking: str, asyncio: str) -> None:
    blocking_cls, async_cls = getattr(lake_sdk, blocking), getattr(lake_sdk, asyncio)
    async_methods = _public_methods(async_cls)
    blocking_methods = _public_methods(blocking_cls)
    assert set(async_methods) == set(blocking_methods), (
        f"only {asyncio}: {sorted(set(async_methods) - set(blocking_methods))}, "
        f"only {blocking}: {sorted(set(blocking_methods) - set(async_methods))}"
    )
    for name, method in async_methods.items():
        assert _parameters(method) == _parameters(blocking_methods[name]), name
        assert not inspect.iscoroutinefunction(blocking_methods[name]), name
    assert _public_properties(async_cls) <= _public_properties(blocking_cls) | set(
        vars(blocking_cls).get("__annotations__", {})
    ), f"{blocking} lacks properties of {asyncio}"


def test_both_clients_take_the_same_options() -> None:
    # The same constructor: same keyword-only options, same defaults.
    assert _parameters(lake_sdk.AsyncClient.__init__) == _parameters(lake_sdk.Client.__init__)
    init = inspect.signature(lake_sdk.AsyncClient.__init__).parameters.values()
    assert [p.name for p in init if p.kind is not inspect.Parameter.KEYWORD_ONLY] == [
        "self",
        "url",
    ]


@pytest.mark.parametrize("cls", [lake_sdk.Client, lake_sdk.AsyncClient, lake_sdk.Jobs])
def test_every_public_client_method_has_a_docstring(cls: type) -> None:
    undocumented = [
        name
        for name, value in inspect.getmembers(cls)
        if not name.startswith("_")
        and (callable(value) or isinstance(value, property))
        and not is_deprecated(value)
        and not (inspect.getdoc(value) or "").strip()
    ]
    assert undocumented == [], f"{cls.__name__} methods without a docstring: {undocumented}"


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


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("SyncQueryResult", "QueryResult"),
        ("SyncObjectReader", "ObjectReader"),
        ("SyncObjectStore", "ObjectStore"),
        ("AsyncQueryHandle", "JobHandle"),
    ],
)
def test_02_type_names_warn_and_are_the_new_types(old: str, new: str) -> None:
    assert old not in lake_sdk.__all__
    with pytest.warns(DeprecationWarning, match=f"lake_sdk.{old} is deprecated.*lake_sdk.{new}"):
        value = getattr(lake_sdk, old)
    assert value is getattr(lake_sdk, new)


def test_a_jobs_result_is_still_an_async_query_result() -> None:
    # 0.2's AsyncQueryResult (a job's result) is AsyncJobResult now; code that
    # checked isinstance(result, AsyncQueryResult) keeps working.
    assert issubclass(lake_sdk.AsyncJobResult, lake_sdk.AsyncQueryResult)
    assert issubclass(lake_sdk.JobResult, lake_sdk.QueryResult)


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        ("lake_sdk.client", "AsyncClient", "AsyncClient"),
        ("lake_sdk.client", "LakeClient", "LakeClient"),
        ("lake_sdk.sync", "Client", "Client"),
        ("lake_sdk.sync", "SyncQueryResult", "QueryResult"),
        ("lake_sdk.sync", "SyncObjectReader", "ObjectReader"),
        ("lake_sdk.sync", "SyncObjectStore", "ObjectStore"),
        ("lake_sdk.jobs", "AsyncQueryHandle", "JobHandle"),
        ("lake_sdk.jobs", "AsyncQueryResult", "AsyncJobResult"),
        ("lake_sdk.results", "QueryResult", "AsyncQueryResult"),
        ("lake_sdk.schema_cache", "SchemaCache", "SchemaCache"),
        ("lake_sdk.transport", "Connection", "Connection"),
    ],
)
def test_old_module_paths_warn_and_still_work(module: str, old: str, new: str) -> None:
    import importlib

    private = importlib.import_module(module.replace("lake_sdk.", "lake_sdk._"))
    with pytest.warns(DeprecationWarning, match=f"{module}.{old} is deprecated"):
        value = getattr(importlib.import_module(module), old)
    assert value is getattr(private, new)


@pytest.mark.parametrize(
    ("method", "args"),
    [("submit_async", ("SELECT 1",)), ("query_async", ("SELECT 1",))],
)
def test_02_job_methods_warn_and_forward_to_client_jobs(method: str, args: tuple[str]) -> None:
    transport = lake_sdk.MockTransport()
    client = lake_sdk.Client("mock://", transport=transport)
    # The mock has no job service: reaching it proves the old name forwarded to client.jobs.
    with (
        pytest.warns(DeprecationWarning, match=f"Client.{method}.*client.jobs"),
        pytest.raises(lake_sdk.InvalidArgument, match="not a Lake endpoint"),
    ):
        getattr(client, method)(*args)
    assert is_deprecated(getattr(lake_sdk.AsyncClient, method))
