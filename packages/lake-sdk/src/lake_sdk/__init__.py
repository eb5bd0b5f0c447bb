"""Lake's Python SDK.

    import asyncio, lake_sdk

    async def main():
        async with await lake_sdk.LakeClient.connect("grpc://127.0.0.1:50051") as client:
            table = await client.query_table("SELECT * FROM robots.episodes")

or, blocking: ``client = lake_sdk.connect("grpc://127.0.0.1:50051")``.

With TLS and a bearer token (``lake_sdk.Client.builder`` for the blocking client)::

    client = await (
        lake_sdk.LakeClient.builder("https://query.internal:50051")
        .with_bearer_token(token)
        .with_ca_certificate_pem(ca_pem)
        .with_server_name("query.internal")
        .connect()
    )
"""

from lake_core.errors import LakeError
from lake_core.models import DataLocation
from lake_core.names import TableRef
from lake_objects import (
    EPISODE_ARTIFACT_SCHEMA_V1,
    EpisodeBundle,
    FileUpload,
    ObjectIntegrityError,
    ObjectReader,
    ReadCapability,
    UploadProgress,
    episode_artifact_table_v1,
)
from lake_sdk.builder import ClientBuilder, LakeClientBuilder
from lake_sdk.client import LakeClient, QueryResult
from lake_sdk.locations import data_location
from lake_sdk.pending import PendingAppendUncertain
from lake_sdk.progress import UploadProgressBar
from lake_sdk.schema_cache import SchemaCache
from lake_sdk.sync import Client, connect

__all__ = [
    "EPISODE_ARTIFACT_SCHEMA_V1",
    "Client",
    "ClientBuilder",
    "DataLocation",
    "EpisodeBundle",
    "FileUpload",
    "LakeClient",
    "LakeClientBuilder",
    "LakeError",
    "ObjectIntegrityError",
    "ObjectReader",
    "PendingAppendUncertain",
    "QueryResult",
    "ReadCapability",
    "SchemaCache",
    "TableRef",
    "UploadProgress",
    "UploadProgressBar",
    "connect",
    "data_location",
    "episode_artifact_table_v1",
]
