"""The entry point Query loads (group ``lake.query.plugins``, name ``iceberg``).

``plugin(env)`` validates the ``LAKE_ICEBERG_*`` variables and returns the
federation (not yet started), or None when federation is not configured.
Query calls it while parsing its configuration, before any listener binds,
and calls ``start()`` (the bounded namespace checks) before serving.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from lake_iceberg.federation.config import FederationConfig

if TYPE_CHECKING:
    from lake_iceberg.federation.provider import IcebergFederation

__all__ = ["plugin"]


def plugin(env: Mapping[str, str]) -> IcebergFederation | None:
    config = FederationConfig.from_env(env)
    if config is None:
        return None  # not configured: the provider (and pyiceberg) is never imported
    from lake_iceberg.federation.provider import IcebergFederation

    return IcebergFederation(config)
