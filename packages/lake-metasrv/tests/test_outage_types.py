"""Boto errors are outages by type or structured code, never by their text."""

from __future__ import annotations

from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from lake_metasrv.boto_errors import is_boto_outage


def client_error(code: str, status: int) -> ClientError:
    response = {"Error": {"Code": code, "Message": "timeout connection"}}
    response["ResponseMetadata"] = {"HTTPStatusCode": status}  # type: ignore[assignment]
    return ClientError(response, "PutObject")  # type: ignore[arg-type]


def test_unreachable_endpoints_are_outages() -> None:
    url = "http://127.0.0.1:1"
    assert is_boto_outage(EndpointConnectionError(endpoint_url=url))
    assert is_boto_outage(ConnectTimeoutError(endpoint_url=url))
    assert is_boto_outage(ReadTimeoutError(endpoint_url=url))
    assert is_boto_outage(ConnectionClosedError(endpoint_url=url))


def test_client_errors_are_decided_by_code_and_status() -> None:
    assert is_boto_outage(client_error("SlowDown", 503))
    assert is_boto_outage(client_error("InternalError", 500))
    assert is_boto_outage(client_error("ProvisionedThroughputExceededException", 400))
    # The message mentions "timeout connection"; only the code counts.
    assert not is_boto_outage(client_error("AccessDenied", 403))
    assert not is_boto_outage(client_error("NoSuchBucket", 404))
    assert not is_boto_outage(NoCredentialsError())
    assert not is_boto_outage(ValueError("LanceError(IO): connection timed out"))
