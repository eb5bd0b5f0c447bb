"""LeRobot v3.0 datasets in and out of Lake, with pyarrow and PyAV only.

``export_lerobot`` writes the episodes a SELECT picks as a v3.0 dataset
(:mod:`lake_sdk.lerobot.exporter`). ``import_lerobot`` turns a dataset directory into ``NAME_frames``,
``NAME_episodes`` (one FILE per camera MP4, uploaded once) and ``NAME_tasks``;
see :mod:`lake_sdk.lerobot.importer`. ``lerobot`` and torch are never needed.
"""

from __future__ import annotations

from pathlib import Path

from lake_core.auth import Secret
from lake_core.metaclient import MetaClient
from lake_sdk._client import AsyncClient
from lake_sdk._sync import Client
from lake_sdk.lerobot.exporter import ExportedDataset
from lake_sdk.lerobot.exporter import export_lerobot as _export
from lake_sdk.lerobot.importer import ImportedDataset
from lake_sdk.lerobot.importer import import_lerobot as _import
from lake_sdk.lerobot.layout import FEATURE_KEY, SUPPORTED_VERSION, column_name, read_dataset

__all__ = [
    "FEATURE_KEY",
    "SUPPORTED_VERSION",
    "ExportedDataset",
    "ImportedDataset",
    "column_name",
    "export_lerobot",
    "export_lerobot_async",
    "import_lerobot",
    "import_lerobot_async",
    "read_dataset",
]


async def import_lerobot_async(
    client: AsyncClient,
    directory: str | Path,
    *,
    namespace: str,
    name: str | None = None,
    meta_addr: str = "127.0.0.1:50052",
    meta_token: str | Secret | None = None,
) -> ImportedDataset:
    """Import a LeRobot v3.0 dataset; tables are created through Metasrv at ``meta_addr``."""
    addr = meta_addr if "://" in meta_addr else f"http://{meta_addr}"
    async with MetaClient(addr, token=meta_token) as meta:
        return await _import(client, directory, namespace=namespace, name=name, meta=meta)


def import_lerobot(
    client: Client,
    directory: str | Path,
    *,
    namespace: str,
    name: str | None = None,
    meta_addr: str = "127.0.0.1:50052",
    meta_token: str | Secret | None = None,
) -> ImportedDataset:
    """:func:`import_lerobot_async` on a blocking :class:`~lake_sdk.Client`."""
    return client._runner.run(
        import_lerobot_async(
            client._inner,
            directory,
            namespace=namespace,
            name=name,
            meta_addr=meta_addr,
            meta_token=meta_token,
        )
    )


async def export_lerobot_async(
    client: AsyncClient, sql: str, out_dir: str | Path
) -> ExportedDataset:
    """Write the episodes ``sql`` selects from ``ns.NAME_episodes`` as a v3.0 dataset."""
    return await _export(client, sql, out_dir)


def export_lerobot(client: Client, sql: str, out_dir: str | Path) -> ExportedDataset:
    """:func:`export_lerobot_async` on a blocking :class:`~lake_sdk.Client`."""
    return client._runner.run(_export(client._inner, sql, out_dir))
