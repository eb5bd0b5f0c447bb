"""Where a federated table's files may be: under the configured warehouse, nowhere else.

The catalog answers with locations (the metadata file, the manifest list)
and the files it names name more (manifests, data and delete files). Query
opens them with its own storage identity, so a hostile or misconfigured
catalog could otherwise make it read the replica's own disk
(``file:///...`` or a bare path) or send its S3 requests, signed with its
credentials, to a bucket the operator never configured.

The rule, derived from ``LAKE_ICEBERG_LOCATION``, else from
``LAKE_ICEBERG_WAREHOUSE`` (the location the operator gives the catalog): a
location is readable when it has that location's scheme, exactly its
bucket (authority) and lies under its prefix, segment by segment. ``s3``, ``s3a`` and ``s3n`` are one scheme (pyiceberg and
iceberg-rust read all three with the same S3 client); schemes compare
case-insensitively, buckets and keys exactly. A local path (``file://`` or
no scheme) is readable only under a ``file://`` warehouse. A location with
a ``.`` or ``..`` segment (also percent-encoded), a query, a fragment or
user information is never readable: some readers normalise or decode it.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from lake_core.config import ICEBERG_LOCATION
from lake_core.errors import ConfigError, Unavailable

__all__ = ["Locations", "outside"]

#: Scheme aliases read by the same client.
_ALIASES = {"s3a": "s3", "s3n": "s3", "gcs": "gs"}
_LOCAL = "file"


def _parts(location: str) -> tuple[str, str, tuple[str, ...]] | None:
    """(scheme, bucket, key segments) of ``location``; None when it is never readable."""
    try:
        parts = urlsplit(location)
    except ValueError:
        return None
    scheme = parts.scheme.lower() or _LOCAL
    scheme = _ALIASES.get(scheme, scheme)
    if parts.query or parts.fragment or "@" in parts.netloc or "\\" in location:
        return None
    if scheme == _LOCAL and (parts.netloc or not parts.path.startswith("/")):
        return None  # file://host/... or a relative path (resolved against the cwd)
    if any(s in (".", "..") for s in unquote(parts.path).split("/")):
        return None  # also where an encoded '/' would make one once decoded
    segments = tuple(parts.path.split("/")[1:])
    return scheme, parts.netloc, segments


class Locations:
    """The location a federated table's files must lie under."""

    def __init__(self, root: str, variable: str) -> None:
        parsed = _parts(root.strip())
        if parsed is None or (parsed[0] != _LOCAL and not parsed[1]):
            # Never quote the value: the warehouse is kept out of errors.
            raise ConfigError(
                f"{variable} must be a location (s3://bucket/prefix, or file:///path for a "
                "local warehouse): Query reads an Iceberg table's files only under it; "
                f"set {ICEBERG_LOCATION.name} when the warehouse is a name"
            )
        scheme, bucket, segments = parsed
        self._scheme = scheme
        self._bucket = bucket
        #: The prefix's segments; a trailing '/' (an empty last one) adds nothing.
        self._prefix = segments[:-1] if segments[-1:] == ("",) else segments

    def __repr__(self) -> str:
        return "Locations(***)"

    def allows(self, location: str) -> bool:
        """Whether Query may open ``location`` for a table of this warehouse."""
        parsed = _parts(location)
        if parsed is None:
            return False
        scheme, bucket, segments = parsed
        if scheme != self._scheme or bucket != self._bucket:
            return False
        prefix = len(self._prefix)
        # Strictly below the prefix: at least one more (non-empty) segment.
        return segments[:prefix] == self._prefix and any(segments[prefix:])


def outside(table: str) -> Unavailable:
    """The catalog named a file outside the location: its fault, never the caller's.

    Names the table only: the file's location would disclose what the catalog
    was trying to reach (and the configured location is kept out of errors).
    """
    return Unavailable(
        f"the Iceberg catalog named a file outside the configured location for {table}; "
        "Lake does not read it"
    )
