"""Reference-delta sidecars: which managed objects each table version adds.

The seam is in :mod:`~lake_metasrv.sidecars.base`; :mod:`~lake_metasrv.sidecars.local`
keeps sidecars in a data directory and :mod:`~lake_metasrv.sidecars.s3` on S3
(imported only in cloud mode).
"""

from lake_metasrv.sidecars.base import DropMarker, ReferenceDelta, SidecarStore, file_uris
from lake_metasrv.sidecars.local import LocalSidecarStore

__all__ = ["DropMarker", "LocalSidecarStore", "ReferenceDelta", "SidecarStore", "file_uris"]
