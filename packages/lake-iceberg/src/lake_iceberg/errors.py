"""Errors of the Iceberg plug-in, each with the stable code the spec names.

    LakeError
    ├── ConfigError
    │   └── ConfigInvalid              config.invalid   (fatal: bad config, untrusted TLS)
    ├── Unauthenticated
    │   └── AuthFailed                 auth.failed      (fatal: 401/403, refused client cert)
    ├── FailedPrecondition
    │   ├── IcebergSchemaMismatch      sink.iceberg_schema_mismatch  (fatal)
    │   ├── IcebergUnsupportedType     sink.iceberg_unsupported_type (fatal)
    │   └── SegmentCatalogError        segments.catalog  (fatal: a catalog entry that cannot hold)
    └── Unavailable
        └── CatalogUnavailable         catalog.unavailable (transient: unreachable, 5xx)

Fatal errors stop the registrar; transient ones are retried with the
configured backoff. Messages name the config key, table or object key,
never a secret.
"""

from __future__ import annotations

from typing import ClassVar

from lake_core.errors import (
    ConfigError,
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
]


class RegistrarError(LakeError):
    """An error with a dotted code (``auth.failed``...) in the spec's vocabulary."""

    error_code: ClassVar[str] = "registrar.error"
    #: Whether the registrar stops on it (the opposite of ``retryable``).
    fatal: ClassVar[bool] = True

    @property
    def code(self) -> str:
        return self.error_code

    def __str__(self) -> str:
        return f"{self.error_code}: {super().__str__()}"


class ConfigInvalid(RegistrarError, ConfigError):
    error_code = "config.invalid"


class AuthFailed(RegistrarError, Unauthenticated):
    error_code = "auth.failed"


class IcebergSchemaMismatch(RegistrarError, FailedPrecondition):
    error_code = "sink.iceberg_schema_mismatch"

    def __init__(self, table: str, segment: str, violations: list[str]) -> None:
        super().__init__(
            f"table {table}: segment {segment} does not fit the table schema: "
            + "; ".join(violations)
        )
        self.violations = violations


class IcebergUnsupportedType(RegistrarError, FailedPrecondition):
    error_code = "sink.iceberg_unsupported_type"


class SegmentCatalogError(RegistrarError, FailedPrecondition):
    error_code = "segments.catalog"


class CatalogUnavailable(RegistrarError, Unavailable):
    error_code = "catalog.unavailable"
    fatal = False
    retryable = True
