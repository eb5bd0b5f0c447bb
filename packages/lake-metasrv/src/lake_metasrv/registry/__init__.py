"""Registry stores: the durable catalog and Lake's visibility boundary."""

from lake_metasrv.registry.base import (
    AppendCommit,
    DroppedTable,
    MaintenanceCommit,
    OperationRecord,
    RegistryStore,
    TableRecord,
    VersionRecord,
)
from lake_metasrv.registry.sqlite import SqliteRegistry

__all__ = [
    "AppendCommit",
    "DroppedTable",
    "MaintenanceCommit",
    "OperationRecord",
    "RegistryStore",
    "SqliteRegistry",
    "TableRecord",
    "VersionRecord",
]
