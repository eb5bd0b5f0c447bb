"""Tenant child prefixes: which object URIs a tenant may name. Pure, no I/O.

Every managed object lives under ``tenants/<tenant-id>/`` of the stage root
(a local directory or an S3 bucket prefix). A :class:`TenantScope` accepts a
URI only when it is textually inside that child prefix, so the check is the
same in the SDK, Query and Metasrv and runs before any storage call.

Rejected outright: any character outside a small safe set (so no ``%``
escapes, backslashes, whitespace, ``?`` or ``#``), empty, ``.`` or ``..``
segments, and names starting with a dot. Other tenants, other buckets, other
schemes and absolute paths outside the root fail the prefix comparison.
"""

from __future__ import annotations

import re

from lake_core.models import DataLocation
from lake_objects.errors import InvalidUpload, LocationOutsideStage

__all__ = [
    "TENANTS_DIR",
    "TenantScope",
    "safe_path_segments",
    "validate_tenant_id",
]

TENANTS_DIR = "tenants"
MAX_URI_LENGTH = 4096
_TENANT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
_SEGMENT = re.compile(r"[A-Za-z0-9_.~+=,@-]+")
_URI_CHARS = re.compile(r"[A-Za-z0-9_.~+=,@:/-]*")


def validate_tenant_id(tenant_id: object) -> str:
    """A tenant id usable as one path segment (letters, digits, ``_``, ``-``)."""
    if not isinstance(tenant_id, str) or not _TENANT_ID.fullmatch(tenant_id):
        raise LocationOutsideStage(
            "tenant id must be 1-128 letters, digits, '_' or '-' to own a managed stage"
        )
    return tenant_id


def safe_path_segments(path: str, what: str) -> list[str]:
    """Split a ``/``-separated path whose segments are all safe; raise InvalidUpload otherwise."""
    segments = path.split("/")
    for segment in segments:
        if segment in ("", ".", "..") or not _SEGMENT.fullmatch(segment):
            raise InvalidUpload(
                f"{what} {path[:200]!r} must be '/'-separated segments of letters, digits "
                "and '_.~+=,@-' (no empty, '.' or '..' segments)"
            )
    return segments


class TenantScope:
    """The URIs one tenant may name: those strictly below ``stage_uri``."""

    def __init__(self, stage_uri: str) -> None:
        self.stage_uri = stage_uri.rstrip("/")
        self._prefix = self.stage_uri + "/"

    def __repr__(self) -> str:
        return f"TenantScope({self.stage_uri!r})"

    def check(self, uri: object) -> str:
        """The object's name below the stage, or LocationOutsideStage."""
        if not isinstance(uri, str) or not uri:
            raise LocationOutsideStage("a DataLocation needs a non-empty uri")
        shown = uri[:200]
        if len(uri) > MAX_URI_LENGTH or not _URI_CHARS.fullmatch(uri):
            raise LocationOutsideStage(
                f"DataLocation uri {shown!r} has characters a managed object name never has"
            )
        if not uri.startswith(self._prefix):
            raise LocationOutsideStage(
                f"DataLocation uri {shown!r} is outside this tenant's managed stage"
            )
        name = uri[len(self._prefix) :]
        for segment in name.split("/"):
            if not segment or segment.startswith(".") or not _SEGMENT.fullmatch(segment):
                raise LocationOutsideStage(
                    f"DataLocation uri {shown!r} has an empty, dot or unsafe path segment"
                )
        return name

    def check_location(self, location: DataLocation) -> str:
        return self.check(location.uri)

    def uri_for(self, name: str) -> str:
        """The URI of object ``name`` (validated) in this stage."""
        uri = self._prefix + name
        self.check(uri)
        return uri
