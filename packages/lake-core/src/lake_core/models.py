"""Frozen value types shared by every Lake process."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lake_core.errors import InvalidArgument
from lake_core.names import TableRef

__all__ = ["CatalogEntry", "DataLocation", "Engine", "TableDescriptor"]

Engine = Literal["lance"]
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class TableDescriptor(BaseModel):
    """The physical pin of one table version.

    ``version`` is Lake's gap-free table version, the one appends return;
    ``engine_version`` is the Lance version that holds exactly that state.
    Opening ``location`` at ``engine_version`` needs no mutable pointer.
    """

    model_config = ConfigDict(frozen=True)

    location: str
    engine: Engine = "lance"
    incarnation: str
    version: int = Field(ge=0)
    engine_version: int = Field(ge=1)


class DataLocation(BaseModel):
    """An immutable reference to a managed object: the value of a FILE cell."""

    model_config = ConfigDict(frozen=True)

    uri: str = Field(min_length=1, max_length=4096)
    media_type: str = Field(min_length=1, max_length=255)
    size_bytes: int = Field(ge=0)
    sha256: str

    @field_validator("sha256")
    @classmethod
    def _sha256_shape(cls, value: str) -> str:
        if not _SHA256_HEX.fullmatch(value):
            raise InvalidArgument("sha256 must be 64 lowercase hex characters")
        return value


class CatalogEntry(BaseModel):
    """One table as the catalog snapshot carries it to Query replicas."""

    model_config = ConfigDict(frozen=True)

    table: TableRef
    descriptor: TableDescriptor
    schema_ipc: str = Field(description="base64 of the table's Arrow IPC schema")


INCARNATION_PREFIX = b"lake.incarnation."


def incarnation_metadata(incarnation: str) -> dict[bytes, bytes]:
    """Schema metadata that stamps a dataset with the table incarnation owning it.

    The key carries the id (``lake.incarnation.<id>``) rather than the value:
    DataFusion merges schema metadata across join inputs and fails the plan
    when one key has different values on the two sides.
    """
    return {INCARNATION_PREFIX + incarnation.encode(): b"1"}


def incarnation_of(metadata: dict[bytes, bytes] | None) -> str | None:
    """The incarnation a dataset's schema metadata names, if exactly one."""
    found = [
        k[len(INCARNATION_PREFIX) :] for k in (metadata or {}) if k.startswith(INCARNATION_PREFIX)
    ]
    return found[0].decode() if len(found) == 1 else None
