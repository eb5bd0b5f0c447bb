"""Data-plane settings and the Lake-error -> pyarrow Flight status table."""

from __future__ import annotations

from pathlib import Path

import pyarrow.flight as flight
import pytest

from lake_core.config import (
    ALLOW_INSECURE,
    AUTH_TOKEN_FILE,
    QUERY_DATA_ADDR,
    QUERY_DATA_ADVERTISE,
)
from lake_core.errors import (
    ConfigError,
    DataCorrupted,
    DeadlineExceeded,
    InvalidArgument,
    LakeError,
    PermissionDenied,
    QueryTooLarge,
    ResourceExhausted,
    TableNotFound,
    Unauthenticated,
    Unavailable,
    VersionReclaimed,
)
from lake_core.names import TableRef
from lake_query.dataplane.settings import DataPlaneSettings
from lake_query.dataplane.statuses import flight_error, grpc_code

MAIN = "127.0.0.1:50051"


def test_off_when_unset() -> None:
    assert DataPlaneSettings.from_env({}, MAIN) is None


def test_a_loopback_bind_is_advertised_as_is() -> None:
    settings = DataPlaneSettings.from_env({QUERY_DATA_ADDR: "127.0.0.1:50070"}, MAIN)
    assert settings is not None
    assert settings.uri(tls=False) == "grpc+tcp://127.0.0.1:50070"
    assert settings.uri(tls=True) == "grpc+tls://127.0.0.1:50070"
    v6 = DataPlaneSettings.from_env({QUERY_DATA_ADDR: "[::1]:50070"}, MAIN)
    assert v6 is not None
    assert v6.uri(tls=True) == "grpc+tls://[::1]:50070"


def test_a_wildcard_bind_is_advertised_as_configured(tmp_path: Path) -> None:
    env = {
        QUERY_DATA_ADDR: "0.0.0.0:50070",
        QUERY_DATA_ADVERTISE: "query-0.lake.internal:50070",
        ALLOW_INSECURE: "true",
    }
    token = tmp_path / "token"
    token.write_text("lk_" + "a" * 40)
    token.chmod(0o600)
    settings = DataPlaneSettings.from_env({**env, AUTH_TOKEN_FILE: str(token)}, MAIN)
    assert settings is not None
    assert settings.addr == "0.0.0.0:50070"
    assert settings.uri(tls=False) == "grpc+tcp://query-0.lake.internal:50070"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({QUERY_DATA_ADDR: "127.0.0.1"}, QUERY_DATA_ADDR),
        ({QUERY_DATA_ADDR: "127.0.0.1:0"}, QUERY_DATA_ADDR),
        ({QUERY_DATA_ADDR: "127.0.0.1:70000"}, QUERY_DATA_ADDR),
        ({QUERY_DATA_ADDR: MAIN}, "--addr"),
        ({QUERY_DATA_ADDR: "[::]:50070"}, QUERY_DATA_ADVERTISE),
        ({QUERY_DATA_ADDR: "127.0.0.1:50070", QUERY_DATA_ADVERTISE: "0.0.0.0:1"}, "dialable"),
        ({QUERY_DATA_ADVERTISE: "127.0.0.1:50070"}, QUERY_DATA_ADDR),
        # Off loopback: the main listener's policy (credentials, then TLS).
        ({QUERY_DATA_ADDR: "10.0.0.5:50070"}, "requires authentication"),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        DataPlaneSettings.from_env(env, MAIN)


@pytest.mark.parametrize(
    ("error", "sent"),
    [
        (Unauthenticated("x"), flight.FlightUnauthenticatedError),
        (PermissionDenied("x"), flight.FlightUnauthorizedError),
        (DeadlineExceeded("x"), flight.FlightTimedOutError),
        (Unavailable("x"), flight.FlightUnavailableError),
        # A full admission queue says "retry" to every client; a too-large query does not.
        (ResourceExhausted("x"), flight.FlightUnavailableError),
        (QueryTooLarge("x"), flight.FlightServerError),
        (DataCorrupted("x"), flight.FlightInternalError),
        # No Flight class of their own (an Arrow class would leak a traceback).
        (InvalidArgument("x"), flight.FlightServerError),
        (TableNotFound(TableRef("a", "b")), flight.FlightServerError),
        (VersionReclaimed("x"), flight.FlightServerError),
    ],
)
def test_every_error_is_sent_as_a_flight_class(error: LakeError, sent: type) -> None:
    raised = flight_error(error)
    assert type(raised) is sent
    assert str(raised) == str(error)


def test_the_status_of_a_completed_call() -> None:
    assert grpc_code(None).name == "OK"
    assert grpc_code(flight.FlightUnauthenticatedError("x")).name == "UNAUTHENTICATED"
    assert grpc_code(flight.FlightServerError("x")).name == "UNKNOWN"
    assert grpc_code(RuntimeError("x")).name == "UNKNOWN"
