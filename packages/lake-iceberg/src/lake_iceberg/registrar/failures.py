"""What a failure from the catalog, the token endpoint or S3 means for the registrar.

:func:`classify` turns a library exception into the registrar's vocabulary
by its type (never its message): a fatal :class:`AuthFailed` or
:class:`ConfigInvalid`, a transient :class:`CatalogUnavailable`, or a commit
outcome (:data:`CONFLICT`: reload and rebuild; :data:`UNKNOWN`: the commit may
have landed, rebuild the committed set before deciding).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from enum import Enum

from lake_iceberg.errors import (
    AuthFailed,
    CatalogUnavailable,
    ConfigInvalid,
    RegistrarError,
    SegmentCatalogError,
)

__all__ = ["CommitOutcome", "IcebergRejected", "classify", "commit_outcome"]


class IcebergRejected(RegistrarError):
    """The catalog refused a request for a reason retrying cannot fix (a 400)."""

    reason = "sink.iceberg_rejected"


class CommitOutcome(Enum):
    CONFLICT = "conflict"
    UNKNOWN = "unknown"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, its causes and contexts, and exceptions held in ``args`` (urllib3 nests them)."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        stack.extend(a for a in current.args if isinstance(a, BaseException))
        for attr in ("reason", "__cause__", "__context__"):
            nested = getattr(current, attr, None)
            if isinstance(nested, BaseException):
                stack.append(nested)


#: Parts of OpenSSL reason codes for alerts a server sends about the client's
#: certificate (TLSV13_ALERT_CERTIFICATE_REQUIRED, TLSV1_ALERT_UNKNOWN_CA, ...).
_CLIENT_CERT_ALERTS = ("CERTIFICATE", "UNKNOWN_CA", "ACCESS_DENIED")


def _tls(exc: BaseException) -> RegistrarError | None:
    for link in _chain(exc):
        if isinstance(link, ssl.SSLCertVerificationError):
            return ConfigInvalid(
                f"catalog TLS: the server certificate is not trusted ({link.verify_message}); "
                "check catalog_ca_file"
            )
    for link in _chain(exc):
        if isinstance(link, ssl.SSLEOFError):
            return None  # the connection ended without a TLS verdict: transient
        if isinstance(link, ssl.SSLError):
            reason = str(getattr(link, "reason", "") or "")
            if "ALERT" in reason and any(m in reason for m in _CLIENT_CERT_ALERTS):
                # OpenSSL's reason code for the server's alert: it refused our certificate.
                return AuthFailed(
                    f"catalog TLS: the server refused the client certificate ({reason}); "
                    "check catalog_client_cert / catalog_client_key"
                )
            return ConfigInvalid(f"catalog TLS: handshake failed ({reason or type(link).__name__})")
    return None


def commit_outcome(exc: BaseException) -> CommitOutcome | None:
    """Whether a failed commit conflicted, may have landed, or neither."""
    from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException

    if isinstance(exc, CommitFailedException):
        return CommitOutcome.CONFLICT
    if isinstance(exc, CommitStateUnknownException):
        return CommitOutcome.UNKNOWN
    classified = classify(exc)
    if isinstance(classified, CatalogUnavailable):
        # The request may have reached the catalog before the connection broke.
        return CommitOutcome.UNKNOWN
    return None


def classify(exc: BaseException) -> RegistrarError:
    """The registrar error ``exc`` amounts to."""
    import requests
    from botocore.exceptions import BotoCoreError, ClientError
    from pyiceberg import exceptions as ice

    if isinstance(exc, RegistrarError):
        return exc
    tls = _tls(exc) if isinstance(exc, requests.exceptions.RequestException | OSError) else None
    if tls is not None:
        return tls
    if isinstance(exc, ice.CommitFailedException):
        return CatalogUnavailable("commit conflicted with a concurrent change")
    if isinstance(exc, ice.OAuthError):
        return AuthFailed(f"catalog token endpoint refused the credential ({type(exc).__name__})")
    if isinstance(exc, ice.UnauthorizedError | ice.ForbiddenError | ice.AuthorizationExpiredError):
        return AuthFailed(f"catalog refused the request: {exc}")
    if isinstance(
        exc,
        ice.ServerError
        | ice.ServiceUnavailableError
        | ice.TooManyRequestsError
        | ice.CommitStateUnknownException,
    ):
        return CatalogUnavailable(f"catalog answered {type(exc).__name__}: {exc}")
    if isinstance(exc, requests.exceptions.RequestException | ConnectionError | TimeoutError):
        return CatalogUnavailable(f"catalog unreachable ({type(exc).__name__})")
    if isinstance(exc, ice.BadRequestError | ice.RESTError):
        return IcebergRejected(f"catalog rejected the request: {exc}")
    if isinstance(exc, ClientError):
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        operation = exc.operation_name
        if status in (401, 403):
            return AuthFailed(
                f"object store refused {operation} (HTTP {status}); check store credentials"
            )
        if status == 404:
            return SegmentCatalogError(f"object store: {operation} found no such object or bucket")
        return CatalogUnavailable(f"object store answered HTTP {status} to {operation}")
    if isinstance(exc, BotoCoreError):
        return CatalogUnavailable(f"object store unreachable ({type(exc).__name__})")
    raise exc
