"""Lake's Python SDK.

    import asyncio, lake_sdk

    async def main():
        async with await lake_sdk.LakeClient.connect("grpc://127.0.0.1:50051") as client:
            table = await client.query_table("SELECT * FROM robots.episodes")

or, blocking: ``client = lake_sdk.connect("grpc://127.0.0.1:50051")``.
"""

from lake_core.errors import LakeError
from lake_core.models import DataLocation
from lake_core.names import TableRef
from lake_sdk.client import LakeClient, QueryResult
from lake_sdk.locations import data_location
from lake_sdk.sync import Client, connect

__all__ = [
    "Client",
    "DataLocation",
    "LakeClient",
    "LakeError",
    "QueryResult",
    "TableRef",
    "connect",
    "data_location",
]
