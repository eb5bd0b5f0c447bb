"""Arrow types of decoded messages: from ROS 2 message definitions and JSON schemas.

Nested messages and JSON objects become structs, arrays become lists (a
ROS 2 ``uint8[]``/``byte[]`` is binary), ROS 2 primitives map to the Arrow
type of the same width, ``time``/``duration`` to structs of sec and nanosec.
A JSON schema property without a type, or of a type that varies, is kept as
its JSON text (utf8).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from lake_sdk.errors import InvalidRecording
from lake_sdk.mcap._lib import require

__all__ = ["arrow_type", "conform"]

_ROS_PRIMITIVES: dict[str, pa.DataType] = {
    "bool": pa.bool_(),
    "byte": pa.uint8(),
    "char": pa.int8(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "int8": pa.int8(),
    "uint8": pa.uint8(),
    "int16": pa.int16(),
    "uint16": pa.uint16(),
    "int32": pa.int32(),
    "uint32": pa.uint32(),
    "int64": pa.int64(),
    "uint64": pa.uint64(),
    "string": pa.utf8(),
    "wstring": pa.utf8(),
}
_TIME = pa.struct([("sec", pa.int32()), ("nanosec", pa.uint32())])
_JSON = {"integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_(), "string": pa.utf8()}


def _ros2_definitions(name: str, text: str) -> dict[str, Any]:
    dynamic = require("mcap_ros2._dynamic")
    found: dict[str, Any] = {}

    def keep(full: str, short: str, msgdef: Any) -> None:
        found[full] = msgdef
        found[short] = msgdef

    dynamic._for_each_msgdef(name, text, keep)
    return found


def _ros2_struct(msgdef: Any, definitions: dict[str, Any]) -> pa.DataType:
    fields = []
    for field in msgdef.fields:
        kind = field.type
        if kind.is_primitive_type():
            base = _ROS_PRIMITIVES[kind.type]
            if kind.is_array and kind.type in ("uint8", "byte"):
                fields.append(pa.field(field.name, pa.binary()))
                continue
        elif kind.type in ("time", "duration") and kind.pkg_name is None:
            base = _TIME
        else:
            nested = definitions.get(f"{kind.pkg_name}/{kind.type}")
            if nested is None:
                raise InvalidRecording(f"no definition of {kind.pkg_name}/{kind.type}")
            base = _ros2_struct(nested, definitions)
        fields.append(pa.field(field.name, pa.list_(base) if kind.is_array else base))
    return pa.struct(fields)


def _json_type(schema: Any) -> pa.DataType:
    if not isinstance(schema, dict):
        return pa.utf8()
    kind = schema.get("type")
    if kind == "object" and isinstance(schema.get("properties"), dict):
        return pa.struct(
            [pa.field(name, _json_type(sub)) for name, sub in schema["properties"].items()]
        )
    if kind == "array":
        return pa.list_(_json_type(schema.get("items")))
    return _JSON.get(kind, pa.utf8()) if isinstance(kind, str) else pa.utf8()


def arrow_type(schema_name: str, schema_encoding: str, schema_data: bytes) -> pa.StructType:
    """The struct type of one topic's decoded messages (InvalidRecording if unreadable)."""
    try:
        return _arrow_type(schema_name, schema_encoding, schema_data)
    except InvalidRecording:
        raise
    except Exception as exc:  # JSON, UTF-8 and ROS 2 parser errors: the file's schema is bad
        raise InvalidRecording(
            f"schema {schema_name!r} ({schema_encoding}) cannot be read: "
            f"{type(exc).__name__}: {str(exc)[:200]}"
        ) from None


def _arrow_type(schema_name: str, schema_encoding: str, schema_data: bytes) -> pa.StructType:
    if schema_encoding == "ros2msg":
        definitions = _ros2_definitions(schema_name, schema_data.decode())
        kind = _ros2_struct(definitions[schema_name], definitions)
    elif schema_encoding == "jsonschema":
        kind = _json_type(json.loads(schema_data or b"{}"))
    else:
        raise InvalidRecording(
            f"schema encoding {schema_encoding!r} has no Arrow mapping (ros2msg and jsonschema do)"
        )
    if not pa.types.is_struct(kind) or kind.num_fields == 0:
        raise InvalidRecording(f"schema {schema_name!r} describes no fields")
    assert isinstance(kind, pa.StructType)
    return kind


def conform(value: Any, kind: pa.DataType) -> Any:
    """A decoded value shaped for ``kind``: JSON text where the schema gave no type."""
    if value is None:
        return None
    if pa.types.is_struct(kind):
        if not isinstance(value, dict):
            return None
        return {f.name: conform(value.get(f.name), f.type) for f in kind}
    if pa.types.is_list(kind):
        if not isinstance(value, list):
            return None
        return [conform(v, kind.value_type) for v in value]
    if pa.types.is_binary(kind):
        return bytes(value)
    if pa.types.is_string(kind) and not isinstance(value, str):
        return json.dumps(value)
    return value
