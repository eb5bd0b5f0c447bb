"""The registrar's catalog client and its tables: open, create, and schema commits.

A table is ``{namespace}.{dataset}``, unpartitioned, format version 2. It is
created at ``{url}/lake/v1/{pipeline}/{dataset}`` when the catalog lets the
client choose; a catalog that assigns its own locations (SeaweedFS's S3
Tables refuse any location outside the warehouse bucket with a 400) gets its
own, and segments stay registered where they lie. REST ``create_table``
reassigns field ids, so a created table then receives the segment's exact
schema (its own ids) in a second commit guarded by the current schema id and
last assigned field id.
"""

from __future__ import annotations

from typing import Any

import structlog
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.name_mapping import MappedField, NameMapping, create_mapping_from_schema
from pyiceberg.table.update import (
    AddSchemaUpdate,
    AssertCurrentSchemaId,
    AssertLastAssignedFieldId,
    AssertTableUUID,
    SetCurrentSchemaUpdate,
    SetPropertiesUpdate,
)

from lake_iceberg.errors import ConfigInvalid
from lake_iceberg.registrar.config import RegistrarConfig

__all__ = ["NAME_MAPPING", "Tables", "catalog_properties", "open_catalog"]

log = structlog.get_logger("lake.iceberg.registrar")

NAME_MAPPING = "schema.name-mapping.default"


def catalog_properties(config: RegistrarConfig) -> dict[str, Any]:
    """pyiceberg RestCatalog properties for ``config`` (they hold secrets: never log them)."""
    store = config.store
    props: dict[str, Any] = {"uri": config.catalog_uri, "s3.region": store.region}
    props["s3.path-style-access"] = "true"
    if store.endpoint:
        props["s3.endpoint"] = store.endpoint
    if store.access_key_id is not None and store.secret_access_key is not None:
        props["s3.access-key-id"] = store.access_key_id.reveal()
        props["s3.secret-access-key"] = store.secret_access_key.reveal()
    if config.warehouse:
        props["warehouse"] = config.warehouse
    if config.catalog_token is not None:
        props["token"] = config.catalog_token.reveal()
    credential = config.catalog_credential
    if credential is not None:
        props["credential"] = f"{credential.client_id}:{credential.client_secret.reveal()}"
        props["scope"] = credential.scope or "catalog"
        props["oauth2-server-uri"] = (
            credential.oauth2_server_uri or f"{config.catalog_uri}/v1/oauth/tokens"
        )
    ssl: dict[str, Any] = {}
    if config.catalog_ca_file is not None:
        ssl["cabundle"] = str(config.catalog_ca_file)
    if config.catalog_client_cert is not None and config.catalog_client_key is not None:
        ssl["client"] = {
            "cert": str(config.catalog_client_cert),
            "key": str(config.catalog_client_key),
        }
    if ssl:
        props["ssl"] = ssl
    return props


def open_catalog(config: RegistrarConfig) -> Catalog:
    """A REST catalog client; its first request (``GET /v1/config``) happens here."""
    from lake_iceberg.registrar.transport import RegistrarCatalog

    return RegistrarCatalog("lake-registrar", **catalog_properties(config))


def _ids(schema: Schema) -> list[tuple[int, str, str, bool]]:
    return [(f.field_id, f.name, str(f.field_type), f.required) for f in schema.fields]


def _mapping_with_old_names(schema: Schema, old: str | None) -> str:
    """A name mapping for ``schema`` that keeps every name a field id had before."""
    names: dict[int, list[str]] = {}
    if old:
        from pyiceberg.table.name_mapping import parse_mapping_from_json

        def collect(fields: list[MappedField]) -> None:
            for f in fields:
                if f.field_id is not None:
                    names.setdefault(f.field_id, []).extend(f.names)
                collect(list(f.fields))

        collect(list(parse_mapping_from_json(old).root))

    def merge(fields: list[MappedField]) -> list[MappedField]:
        out = []
        for f in fields:
            extra = [n for n in names.get(f.field_id or -1, []) if n not in f.names]
            out.append(
                MappedField(
                    field_id=f.field_id, names=[*f.names, *extra], fields=merge(list(f.fields))
                )
            )
        return out

    return NameMapping(merge(list(create_mapping_from_schema(schema).root))).model_dump_json()


class Tables:
    """Opens, creates and evolves the tables of one registrar configuration."""

    def __init__(self, config: RegistrarConfig, catalog: Catalog) -> None:
        self.config = config
        self.catalog = catalog

    def identifier(self, dataset: str) -> tuple[str, ...]:
        return (*self.config.namespace, dataset)

    def name(self, dataset: str) -> str:
        return ".".join(self.identifier(dataset))

    def load(self, dataset: str) -> Table | None:
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            return self.catalog.load_table(self.identifier(dataset))
        except (NoSuchTableError, NoSuchNamespaceError):
            return None

    def open(self, dataset: str, segment_schema: Schema) -> Table:
        """The dataset's table, created from the segment's schema when allowed and absent."""
        table = self.load(dataset)
        if table is not None:
            return table
        if not self.config.create_table:
            raise ConfigInvalid(
                f"table {self.name(dataset)} does not exist and create_table is false"
            )
        return self.create(dataset, segment_schema)

    def create(self, dataset: str, schema: Schema) -> Table:
        from pyiceberg.exceptions import BadRequestError

        self.catalog.create_namespace_if_not_exists(self.config.namespace)
        identifier = self.identifier(dataset)
        properties = {"format-version": "2"}
        wanted = self.config.table_location(dataset)
        try:
            table = self.catalog.create_table(
                identifier, schema, location=wanted, properties=properties
            )
        except BadRequestError:
            # Catalogs that assign locations (S3 Tables) refuse ours: take theirs.
            table = self.catalog.create_table(identifier, schema, properties=properties)
        log.info(
            "registrar.table_created",
            table=self.name(dataset),
            location=table.location(),
            requested_location=wanted,
        )
        if _ids(table.schema()) != _ids(schema):
            # The catalog's ids name other columns: its name mapping must not survive.
            table = self.commit_schema(table, schema, keep_names=False)
        return table

    def finish_create(self, table: Table, schema: Schema) -> Table:
        """``table`` with ``schema``'s own field ids, if a create was killed before that commit.

        :meth:`create` is two commits: the catalog's create (ids reassigned),
        then the segment's exact schema. Killed in between, a restart would
        find the same columns under the catalog's ids, merge by id, and stop
        on a schema mismatch for good. An empty table (no snapshot, its first
        schema) whose columns are exactly the segment's but for the ids is
        that state when the registrar may create tables: finish it.
        """
        metadata = table.metadata
        unfinished = (
            self.config.create_table
            and table.current_snapshot() is None
            and len(metadata.schemas) == 1
            and _ids(table.schema()) != _ids(schema)
            and table.schema().as_arrow().equals(schema.as_arrow(), check_metadata=False)
        )
        if not unfinished:
            return table
        log.info("registrar.create_finished", table=".".join(table.name()))
        return self.commit_schema(table, schema, keep_names=False)

    def commit_schema(self, table: Table, schema: Schema, *, keep_names: bool = True) -> Table:
        """Make ``schema`` (with its own field ids) the table's current schema.

        The commit asserts the schema and last field id it was derived from,
        so a concurrent change makes it fail (409) instead of overwriting.
        The name mapping follows; with ``keep_names`` each id keeps the names
        it had before (a rename adds one).
        """
        metadata = table.metadata
        next_id = max(s.schema_id for s in metadata.schemas) + 1
        exact = Schema(
            *schema.fields,
            schema_id=next_id,
            identifier_field_ids=list(schema.identifier_field_ids),
        )
        requirements = (
            AssertTableUUID(uuid=metadata.table_uuid),
            AssertCurrentSchemaId(current_schema_id=metadata.current_schema_id),
            AssertLastAssignedFieldId(last_assigned_field_id=metadata.last_column_id),
        )
        old = metadata.properties.get(NAME_MAPPING) if keep_names else None
        mapping = _mapping_with_old_names(exact, old)
        updates = (
            AddSchemaUpdate(schema_=exact),
            SetCurrentSchemaUpdate(schema_id=-1),
            SetPropertiesUpdate(updates={NAME_MAPPING: mapping}),
        )
        self.catalog.commit_table(table, requirements, updates)
        log.info("registrar.schema_committed", table=".".join(table.name()), schema_id=next_id)
        return self.catalog.load_table(table.name())
