"""What a boto error means: an outage to retry, or a refusal (decided by type and code).

Shared by the cloud implementations of each seam (``engine.s3``,
``sidecars.s3``, ``digests.s3``); never by an error's text.
"""

from __future__ import annotations

import structlog

from lake_core.errors import Internal, Unavailable

__all__ = ["is_boto_outage", "s3_error"]

# The logger these warnings always came from (the cloud module, before the split).
log = structlog.get_logger("lake_metasrv.cloud")

#: ClientError codes that mean "overloaded or failing, retry" rather than a refusal.
_RETRYABLE_CODES = frozenset(
    {
        "SlowDown",
        "ServiceUnavailable",
        "RequestTimeout",
        "InternalError",
        "ThrottlingException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
    }
)


def is_boto_outage(exc: BaseException) -> bool:
    """Whether a boto error means the service could not be reached or is overloaded (by type)."""
    from botocore.exceptions import (
        ClientError,
        ConnectionClosedError,
        ConnectionError,
        ReadTimeoutError,
    )

    # ConnectionError covers EndpointConnectionError, ConnectTimeoutError and proxy errors.
    if isinstance(exc, ConnectionError | ConnectionClosedError | ReadTimeoutError):
        return True
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        code = exc.response.get("Error", {}).get("Code")
        return int(status or 0) >= 500 or code in _RETRYABLE_CODES
    return False


def s3_error(exc: BaseException, uri: str) -> Exception:
    """UNAVAILABLE for S3 being unreachable or overloaded; INTERNAL for anything else."""
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if status >= 500 or exc.response.get("Error", {}).get("Code") == "SlowDown":
            return Unavailable(f"S3 is unavailable for {uri}; retry")
        return Internal(f"S3 refused a write to {uri}: {exc.response.get('Error', {}).get('Code')}")
    if isinstance(exc, BotoCoreError | OSError):
        log.warning("S3 unreachable", uri=uri, error=repr(exc)[:300])
        return Unavailable(f"S3 is unreachable for {uri}; retry")
    return exc if isinstance(exc, Exception) else Internal(str(exc))
