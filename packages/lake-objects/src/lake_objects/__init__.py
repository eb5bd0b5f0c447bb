"""Lake's managed object stage: objects of FILE values, uploaded and read directly.

Objects live under ``tenants/<tenant-id>/`` of a local directory or an S3
prefix. Query and Metasrv never carry their bytes: the SDK uploads and reads
them with its own credentials, and every layer checks that a DataLocation
stays inside the caller's tenant prefix.

    store = lake_objects.open_store(descriptor)            # local or S3
    location = await store.upload(FileUpload.from_path("ep.mp4", "video/mp4"))
    async with await store.open(location) as reader:        # verified at EOF
        async for chunk in reader: ...
"""

from lake_objects.capability import ReadCapability, open_capability
from lake_objects.descriptor import (
    MANAGED_STAGE,
    READ_CAPABILITY,
    ReadCapabilityRequest,
    ReadCapabilityResult,
    StageDescriptor,
    StageRequest,
)
from lake_objects.episode import (
    EPISODE_ARTIFACT_SCHEMA_V1,
    EpisodeBundle,
    episode_artifact_table_v1,
)
from lake_objects.errors import (
    CapabilityRejected,
    HashMismatch,
    InvalidRange,
    InvalidUpload,
    LocationOutsideStage,
    ObjectIntegrityError,
    ObjectNotFound,
    ObjectOverlong,
    ObjectStoreUnavailable,
    PrematureEof,
    PresignUnsupported,
    RangeMismatch,
    StageUnavailable,
    TooManyParts,
    UploadCheckpointMismatch,
    UploadInProgress,
)
from lake_objects.local import LocalObjectStore
from lake_objects.progress import ProgressCallback, UploadProgress
from lake_objects.reader import ObjectReader
from lake_objects.s3 import S3ObjectStore
from lake_objects.scope import TenantScope
from lake_objects.settings import StageSettings
from lake_objects.source import FileUpload
from lake_objects.store import ManagedObjectStore, open_store

__all__ = [
    "EPISODE_ARTIFACT_SCHEMA_V1",
    "MANAGED_STAGE",
    "READ_CAPABILITY",
    "CapabilityRejected",
    "EpisodeBundle",
    "FileUpload",
    "HashMismatch",
    "InvalidRange",
    "InvalidUpload",
    "LocalObjectStore",
    "LocationOutsideStage",
    "ManagedObjectStore",
    "ObjectIntegrityError",
    "ObjectNotFound",
    "ObjectOverlong",
    "ObjectReader",
    "ObjectStoreUnavailable",
    "PrematureEof",
    "PresignUnsupported",
    "ProgressCallback",
    "RangeMismatch",
    "ReadCapability",
    "ReadCapabilityRequest",
    "ReadCapabilityResult",
    "S3ObjectStore",
    "StageDescriptor",
    "StageRequest",
    "StageSettings",
    "StageUnavailable",
    "TenantScope",
    "TooManyParts",
    "UploadCheckpointMismatch",
    "UploadInProgress",
    "UploadProgress",
    "episode_artifact_table_v1",
    "open_capability",
    "open_store",
]
