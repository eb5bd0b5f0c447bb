"""Whether the DynamoDB manifest table answers, asked after Lance fails to open an S3 table.

Lance opens an ``s3+ddb://`` table through two stores: S3 holds the
manifests and data files, DynamoDB claims which manifest is which version.
The :class:`~lake_core.storage_probe.StorageProbe` asks only S3, so with
DynamoDB down every file it looks for is there and a failed open would read
as damaged files. This probe asks the manifest table itself (one bounded
Query on the table's key, read access only), so that outage is reported as
one. Decided by botocore's types and codes, never by an error's text.
"""

from __future__ import annotations

import threading
from typing import Any

from lake_core.cloud import DatasetStorage

__all__ = ["ManifestTableProbe"]

#: ClientError codes that mean "overloaded or failing", not "the table answered".
_OUTAGE_CODES = frozenset(
    {
        "ThrottlingException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "ServiceUnavailable",
        "InternalServerError",
    }
)


class ManifestTableProbe:
    """One question to the manifest table (blocking; only on the failure path)."""

    def __init__(self, storage: DatasetStorage) -> None:
        self._storage = storage
        self._client: Any = None
        self._lock = threading.Lock()

    def reachable(self, location: str) -> bool:
        """Whether the manifest table behind ``location`` answers (always true off S3)."""
        if not self._storage.is_s3(location):
            return True
        try:
            self._dynamodb().query(
                TableName=self._storage.manifest_table,
                KeyConditionExpression="base_uri = :base",
                ExpressionAttributeValues={
                    ":base": {"S": self._storage.manifest_base_uri(location)}
                },
                Limit=1,
                ConsistentRead=True,
            )
        except Exception as exc:
            return not _is_outage(exc)
        return True

    def _dynamodb(self) -> Any:
        with self._lock:
            if self._client is None:
                import boto3
                from botocore.config import Config

                timeout = max(1.0, self._storage.timeout_ms / 1000)
                self._client = boto3.session.Session().client(
                    "dynamodb",
                    endpoint_url=self._storage.dynamodb_endpoint,
                    region_name=self._storage.region,
                    config=Config(
                        connect_timeout=min(timeout, 3.0),
                        read_timeout=timeout,
                        retries={"total_max_attempts": 2, "mode": "standard"},
                    ),
                )
            return self._client


def _is_outage(exc: BaseException) -> bool:
    """An unreachable, failing or throttling DynamoDB; a refusal (4xx) is an answer."""
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        return status >= 500 or exc.response.get("Error", {}).get("Code") in _OUTAGE_CODES
    return True  # connection refused or reset, timeouts, no credentials: not the files' fault
