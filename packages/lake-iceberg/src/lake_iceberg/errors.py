"""Errors of the Iceberg plug-in, each with the stable reason the spec names.

    LakeError
    ├── ConfigError
    │   └── ConfigInvalid              config.invalid   (fatal: bad config, untrusted TLS)
    ├── Unauthenticated
    │   └── AuthFailed                 auth.failed      (fatal: 401/403, refused client cert)
    ├── FailedPrecondition
    │   ├── IcebergSchemaMismatch      sink.iceberg_schema_mismatch  (fatal)
    │   ├── IcebergUnsupportedType     sink.iceberg_unsupported_type (fatal)
    │   └── SegmentCatalogError        segments.catalog  (fatal: a catalog entry that cannot hold)
    ├── DataCorrupted
    │   └── SegmentCorrupted           segments.corrupted (that segment refused: not the shipped bytes)
    └── Unavailable
        └── CatalogUnavailable         catalog.unavailable (transient: unreachable, 5xx)

Fatal errors stop the registrar; transient ones are retried with the
configured backoff; a corrupted segment is refused alone (the others go on). Messages name the config key, table or object key,
never a secret.
"""

from __future__ import annotations

from typing import ClassVar

from lake_core.errors import (
    ConfigError,
    DataCorrupted,
    FailedPrecondition,
    LakeError,
    Unauthenticated,
    Unavailable,
)

__all__ = [
    "AuthFailed",
    "CatalogUnavailable",
    "ConfigInvalid",
    "IcebergSchemaMismatch",
    "IcebergUnsupportedType",
    "RegistrarError",
    "SegmentCatalogError",
    "SegmentCorrupted",
]


class RegistrarError(LakeError):
    """An error with a dotted reason (``auth.failed``...) in the spec's vocabulary.

    The reason is the registrar's own word for what went wrong (its log lines
    and docs/registrar.md call it ``code``); :attr:`LakeError.code`, the class
    name every Lake error carries on the wire, is left as it is.
    """

    reason: ClassVar[str] = "registrar.error"
    #: Whether the registrar stops on it (the opposite of ``retryable``).
    fatal: ClassVar[bool] = True

    def __str__(self) -> str:
        return f"{self.reason}: {super().__str__()}"


class ConfigInvalid(RegistrarError, ConfigError):
    reason = "config.invalid"


class AuthFailed(RegistrarError, Unauthenticated):
    reason = "auth.failed"


class IcebergSchemaMismatch(RegistrarError, FailedPrecondition):
    reason = "sink.iceberg_schema_mismatch"

    def __init__(self, table: str, segment: str, violations: list[str]) -> None:
        super().__init__(
            f"table {table}: segment {segment} does not fit the table schema: "
            + "; ".join(violations)
        )
        self.violations = violations


class IcebergUnsupportedType(RegistrarError, FailedPrecondition):
    reason = "sink.iceberg_unsupported_type"


class SegmentCatalogError(RegistrarError, FailedPrecondition):
    reason = "segments.catalog"


class SegmentCorrupted(RegistrarError, DataCorrupted):
    """A shipped object whose bytes are not the size and SHA-256 its shipper recorded.

    A storage fault, not the caller's mistake: never registered, and the
    registrar goes on with the other segments (the object may be re-shipped).
    """

    reason = "segments.corrupted"

    def __init__(self, message: str, *, etag: str | None = None) -> None:
        super().__init__(message)
        #: The ETag of the object that was read and refused (None: not known).
        self.etag = etag


class CatalogUnavailable(RegistrarError, Unavailable):
    reason = "catalog.unavailable"
    fatal = False
    retryable = True
