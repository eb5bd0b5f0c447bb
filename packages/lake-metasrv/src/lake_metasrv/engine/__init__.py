"""The table engine: Lance datasets, committed as the registry allows.

The seam and its commit protocol are in :mod:`~lake_metasrv.engine.base`;
:mod:`~lake_metasrv.engine.local` keeps datasets in a data directory and
:mod:`~lake_metasrv.engine.s3` on S3 (imported only in cloud mode).
"""

from lake_metasrv.engine.base import (
    OPERATION_IDS_PROPERTY,
    LanceEngine,
    PreparedAppend,
    WrittenFiles,
)
from lake_metasrv.engine.local import LocalLanceEngine

__all__ = [
    "OPERATION_IDS_PROPERTY",
    "LanceEngine",
    "LocalLanceEngine",
    "PreparedAppend",
    "WrittenFiles",
]
