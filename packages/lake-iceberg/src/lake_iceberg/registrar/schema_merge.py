"""Merging a segment's schema into its table's, by field id.

The segment's Parquet footer carries a stable field id on every column. A
column whose id the table lacks is added with that id (optional); a column
whose name changed is renamed (the id decides, not the name); ``int`` widens
to ``long``, ``float`` to ``double`` and a decimal's precision may grow. A
segment that is narrower than its table (``long`` back to ``int``) or whose
type changed otherwise is a violation: :func:`merge_schema` lists every one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StructType,
)

from lake_iceberg.errors import IcebergUnsupportedType

__all__ = ["SchemaMerge", "check_signed", "file_schema", "merge_schema"]


@dataclass(frozen=True)
class SchemaMerge:
    """The table schema a segment needs, and why it cannot have it."""

    schema: Schema
    changed: bool
    violations: list[str] = field(default_factory=list)


def check_signed(arrow_schema: pa.Schema, dataset: str) -> None:
    """Iceberg has no unsigned types: name every unsigned column and the fix."""
    found: list[str] = []

    def visit(kind: pa.DataType, path: str) -> None:
        if pa.types.is_unsigned_integer(kind):
            found.append(f"{path} ({kind})")
        elif pa.types.is_struct(kind):
            for i in range(kind.num_fields):
                visit(kind.field(i).type, f"{path}.{kind.field(i).name}")
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
            visit(kind.value_type, f"{path}.element")
        elif pa.types.is_map(kind):
            visit(kind.key_type, f"{path}.key")
            visit(kind.item_type, f"{path}.value")

    for column in arrow_schema:
        visit(column.type, column.name)
    if found:
        raise IcebergUnsupportedType(
            f"dataset {dataset}: Iceberg has no unsigned types, found {', '.join(found)}; "
            "run this dataset's Parquet sink with the `unsigned: signed` policy"
        )


def file_schema(arrow_schema: pa.Schema, dataset: str) -> Schema:
    """The Iceberg schema of a segment, with the file's own field ids."""
    from pyiceberg.io.pyarrow import UnsupportedPyArrowTypeException, pyarrow_to_schema

    check_signed(arrow_schema, dataset)
    try:
        schema = pyarrow_to_schema(arrow_schema)
    except (ValueError, TypeError, UnsupportedPyArrowTypeException) as exc:
        raise IcebergUnsupportedType(f"dataset {dataset}: {exc}") from None
    _check_ids(schema, dataset)
    return schema


def _check_ids(schema: Schema, dataset: str) -> None:
    """A segment needs columns, each field id once: an id names one column in Iceberg.

    pyiceberg builds a schema with a repeated id without complaint and then
    maps statistics to the wrong column (an untyped ValueError, or wrong bounds).
    """
    if not schema.fields:
        raise IcebergUnsupportedType(f"dataset {dataset}: the segment has no columns")
    names: dict[int, str] = {}

    def visit(fields: tuple[NestedField, ...], path: str) -> None:
        for f in fields:
            where = f"{path}{f.name}"
            if f.field_id in names:
                raise IcebergUnsupportedType(
                    f"dataset {dataset}: field id {f.field_id} is used by both "
                    f"{names[f.field_id]} and {where}; every column needs its own id"
                )
            names[f.field_id] = where
            kind = f.field_type
            if isinstance(kind, StructType):
                visit(kind.fields, f"{where}.")
            elif isinstance(kind, ListType):
                visit((kind.element_field,), f"{where}.")
            elif isinstance(kind, MapType):
                visit((kind.key_field, kind.value_field), f"{where}.")

    visit(schema.fields, "")


def _widens(old: IcebergType, new: IcebergType) -> bool:
    """Iceberg's allowed promotions, from ``old`` to ``new``."""
    if isinstance(old, IntegerType) and isinstance(new, LongType):
        return True
    if isinstance(old, FloatType) and isinstance(new, DoubleType):
        return True
    return (
        isinstance(old, DecimalType)
        and isinstance(new, DecimalType)
        and old.scale == new.scale
        and new.precision > old.precision
    )


class _Merger:
    def __init__(self, table: Schema) -> None:
        self.table = table
        self.violations: list[str] = []
        self.changed = False

    def violation(
        self, path: str, field_id: int, table: IcebergType, segment: IcebergType, why: str
    ) -> None:
        self.violations.append(
            f"{path} (field id {field_id}): table {table}, segment {segment} ({why})"
        )

    def struct(self, table: StructType, segment: StructType, path: str) -> StructType:
        by_id = {f.field_id: f for f in table.fields}
        seen: set[int] = set()
        fields: list[NestedField] = []
        for old in table.fields:
            new = segment.field(old.field_id)
            where = f"{path}{old.name}"
            if new is None:
                if old.required:
                    self.violations.append(
                        f"{where} (field id {old.field_id}): required in the table, absent from the segment"
                    )
                fields.append(old)
                continue
            seen.add(new.field_id)
            fields.append(self.field(old, new, f"{path}{new.name}"))
        for new in segment.fields:
            if new.field_id in seen or new.field_id in by_id:
                continue
            if self._id_elsewhere(new.field_id):
                self.violations.append(
                    f"{path}{new.name} (field id {new.field_id}): the table uses this id elsewhere"
                )
                continue
            self.changed = True
            fields.append(_optional(new))
        names = [f.name for f in fields]
        for name in {n for n in names if names.count(n) > 1}:
            self.violations.append(f"{path}{name}: two columns would share this name")
        return StructType(*fields)

    def _id_elsewhere(self, field_id: int) -> bool:
        try:
            self.table.find_field(field_id)
        except ValueError:
            return False
        return True

    def field(self, old: NestedField, new: NestedField, path: str) -> NestedField:
        kind = self.type(old.field_type, new.field_type, path, old.field_id)
        required = old.required and new.required
        if old.name != new.name or required != old.required or kind != old.field_type:
            self.changed = True
        return NestedField(
            field_id=old.field_id,
            name=new.name,
            field_type=kind,
            required=required,
            doc=old.doc,
        )

    def type(self, old: IcebergType, new: IcebergType, path: str, field_id: int) -> IcebergType:
        if isinstance(old, StructType) and isinstance(new, StructType):
            return self.struct(old, new, f"{path}.")
        if isinstance(old, ListType) and isinstance(new, ListType):
            if old.element_id != new.element_id:
                self.violation(path, field_id, old, new, "list element id changed")
                return old
            element = self.type(
                old.element_type, new.element_type, f"{path}.element", old.element_id
            )
            return ListType(
                old.element_id,
                element,
                element_required=old.element_required and new.element_required,
            )
        if isinstance(old, MapType) and isinstance(new, MapType):
            if (old.key_id, old.value_id) != (new.key_id, new.value_id):
                self.violation(path, field_id, old, new, "map key or value id changed")
                return old
            if old.key_type != new.key_type:
                self.violation(
                    f"{path}.key", old.key_id, old.key_type, new.key_type, "map keys cannot change"
                )
            value = self.type(old.value_type, new.value_type, f"{path}.value", old.value_id)
            return MapType(
                old.key_id,
                old.key_type,
                old.value_id,
                value,
                value_required=old.value_required and new.value_required,
            )
        if old == new:
            return old
        if old.is_primitive and new.is_primitive and _widens(old, new):
            return new
        why = (
            "narrowing"
            if old.is_primitive and new.is_primitive and _widens(new, old)
            else "incompatible"
        )
        self.violation(path, field_id, old, new, why)
        return old


def _optional(new: NestedField) -> NestedField:
    """Added columns are optional: rows written before them read as null."""
    if not new.required:
        return new
    return NestedField(new.field_id, new.name, new.field_type, required=False, doc=new.doc)


def merge_schema(table: Schema, segment: Schema, *, next_schema_id: int) -> SchemaMerge:
    """The table schema that fits ``segment`` (by field id), or the violations that forbid it."""
    merger = _Merger(table)
    struct = merger.struct(table.as_struct(), segment.as_struct(), "")
    if merger.violations or not merger.changed:
        return SchemaMerge(schema=table, changed=False, violations=merger.violations)
    merged = Schema(
        *struct.fields,
        schema_id=next_schema_id,
        identifier_field_ids=list(table.identifier_field_ids),
    )
    return SchemaMerge(schema=merged, changed=True)
