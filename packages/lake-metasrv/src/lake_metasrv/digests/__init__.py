"""Data-file digests: size and SHA-256 of every data file a commit writes, and rechecking them.

The seam is in :mod:`~lake_metasrv.digests.base`; :mod:`~lake_metasrv.digests.local`
keeps records in a data directory and :mod:`~lake_metasrv.digests.s3` on S3
(imported only in cloud mode); :mod:`~lake_metasrv.digests.verify` rechecks them.
"""

from lake_metasrv.digests.base import DigestStore, VersionDigests
from lake_metasrv.digests.local import LocalDigestStore
from lake_metasrv.digests.verify import verify_table

__all__ = ["DigestStore", "LocalDigestStore", "VersionDigests", "verify_table"]
