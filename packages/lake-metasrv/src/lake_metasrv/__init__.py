"""Lake Metasrv: the registry and the single commit authority for native tables."""

from lake_metasrv.commits import CommitCoordinator
from lake_metasrv.config import MetaConfig
from lake_metasrv.engine import LanceEngine
from lake_metasrv.registry import RegistryStore, SqliteRegistry, TableRecord
from lake_metasrv.service import MetaHandler

__all__ = [
    "CommitCoordinator",
    "LanceEngine",
    "MetaConfig",
    "MetaHandler",
    "RegistryStore",
    "SqliteRegistry",
    "TableRecord",
]
