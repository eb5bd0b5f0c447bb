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
