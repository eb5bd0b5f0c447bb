"""Tables through Query: create, list, describe and drop without Metasrv's address.

Query relays ``create_table`` and ``drop_table`` to Metasrv with the
client's own token, so they need an admin principal on both services (the
same token ``lake client`` would use); ``list_tables`` and ``describe_table``
answer from Query's catalog, limited to the namespaces the client may see.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from lake_core import protocol
from lake_core.errors import InvalidArgument
from lake_core.models import CatalogEntry
from lake_core.names import TableRef
from lake_core.schemas import schema_from_base64, schema_to_base64, validate_table_schema

__all__ = ["TableInfo", "create_body", "table_info", "table_schema_of"]


@dataclass(frozen=True)
class TableInfo:
    """One table as Query's catalog knows it: name, current version and Arrow schema."""

    table: TableRef
    version: int
    schema: pa.Schema

    @property
    def name(self) -> str:
        """``namespace.table``."""
        return str(self.table)

    def __repr__(self) -> str:
        return f"TableInfo({self.name!r}, version={self.version}, columns={self.schema.names})"


def table_info(entry: CatalogEntry) -> TableInfo:
    return TableInfo(entry.table, entry.descriptor.version, schema_from_base64(entry.schema_ipc))


def table_schema_of(schema: object) -> pa.Schema:
    """``schema`` checked as a new table's schema (InvalidArgument / InvalidSchema)."""
    if not isinstance(schema, pa.Schema):
        raise InvalidArgument(f"a table schema is a pyarrow.Schema, not {type(schema).__name__}")
    return validate_table_schema(schema)


def create_body(table: TableRef, schema: pa.Schema) -> bytes:
    request = protocol.CreateTableRequest(table=table, schema_ipc=schema_to_base64(schema))
    return protocol.encode(request)
