"""Failures classified by type: fatal, transient, or a commit outcome."""

from __future__ import annotations

import ssl

import pytest
import requests
from botocore.exceptions import ClientError
from pyiceberg import exceptions as ice

from lake_core.errors import ERROR_CODE_KEY, wire_trailers
from lake_iceberg.errors import (
    AuthFailed,
    CatalogUnavailable,
    ConfigInvalid,
    IcebergSchemaMismatch,
    IcebergUnsupportedType,
    RegistrarError,
    SegmentCatalogError,
)
from lake_iceberg.registrar.failures import CommitOutcome, IcebergRejected, classify, commit_outcome


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ice.UnauthorizedError("401"), AuthFailed),
        (ice.ForbiddenError("403"), AuthFailed),
        (ice.OAuthError("invalid_client"), AuthFailed),
        (ice.ServerError("500"), CatalogUnavailable),
        (ice.ServiceUnavailableError("503"), CatalogUnavailable),
        (requests.exceptions.ConnectionError("refused"), CatalogUnavailable),
        (ice.BadRequestError("400"), IcebergRejected),
    ],
)
def test_catalog_answers(exc: Exception, expected: type) -> None:
    error = classify(exc)
    assert type(error) is expected
    assert error.fatal is (expected is not CatalogUnavailable)


def test_tls_causes() -> None:
    untrusted = ssl.SSLCertVerificationError(1, "certificate verify failed")
    untrusted.verify_message = "unable to get local issuer certificate"
    wrapped = requests.exceptions.SSLError(untrusted)
    assert isinstance(classify(wrapped), ConfigInvalid)
    assert "unable to get local issuer certificate" in str(classify(wrapped))

    alert = ssl.SSLError(1, "tlsv13 alert certificate required")
    alert.reason = "TLSV13_ALERT_CERTIFICATE_REQUIRED"
    refused = requests.exceptions.ConnectionError(OSError("aborted", alert))
    assert isinstance(classify(refused), AuthFailed)

    eof = requests.exceptions.SSLError(ssl.SSLEOFError(8, "EOF occurred"))
    assert isinstance(classify(eof), CatalogUnavailable)


def test_commit_outcomes() -> None:
    assert commit_outcome(ice.CommitFailedException("409")) is CommitOutcome.CONFLICT
    assert commit_outcome(ice.CommitStateUnknownException("504")) is CommitOutcome.UNKNOWN
    assert commit_outcome(requests.exceptions.ConnectionError("reset")) is CommitOutcome.UNKNOWN
    assert commit_outcome(ice.UnauthorizedError("401")) is None


def test_object_store_answers() -> None:
    def client_error(status: int) -> ClientError:
        return ClientError(
            {"Error": {"Code": str(status)}, "ResponseMetadata": {"HTTPStatusCode": status}},
            "GetObject",
        )

    assert isinstance(classify(client_error(403)), AuthFailed)
    assert isinstance(classify(client_error(404)), SegmentCatalogError)
    assert isinstance(classify(client_error(503)), CatalogUnavailable)


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (ConfigInvalid("bad key"), "config.invalid"),
        (AuthFailed("401"), "auth.failed"),
        (IcebergSchemaMismatch("t", "s", ["x narrows"]), "sink.iceberg_schema_mismatch"),
        (IcebergUnsupportedType("uint64"), "sink.iceberg_unsupported_type"),
        (SegmentCatalogError("gone"), "segments.catalog"),
        (CatalogUnavailable("503"), "catalog.unavailable"),
        (IcebergRejected("400"), "sink.iceberg_rejected"),
    ],
)
def test_a_reason_beside_the_lake_error_code(error: RegistrarError, reason: str) -> None:
    """The registrar's dotted reason does not shadow LakeError.code (the wire's class name)."""
    assert error.reason == reason
    assert str(error).startswith(f"{reason}: ")
    assert error.code == type(error).__name__
    assert dict(wire_trailers(error))[ERROR_CODE_KEY] == type(error).__name__
