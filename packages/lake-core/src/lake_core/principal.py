"""Who is calling: the authenticated principal and its grants."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["DEV_PRINCIPAL", "Principal", "Role"]

Role = Literal["user", "query_service", "metadata_peer", "admin"]


class Principal(BaseModel):
    """An authenticated caller. ``namespaces=None`` grants every namespace."""

    model_config = ConfigDict(frozen=True)

    principal_id: str
    tenant_id: str
    role: Role
    namespaces: frozenset[str] | None = None

    def may_see(self, namespace: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces


#: Anonymous callers on a loopback plaintext listener act as this principal.
DEV_PRINCIPAL = Principal(principal_id="local-dev", tenant_id="local", role="admin")
